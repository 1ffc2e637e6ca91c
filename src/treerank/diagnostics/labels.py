"""Query labellings used by the probes and the failure profiles (DRT seed, diagnostics step 2).

* ``query_type``: MS MARCO's ``query_type`` where the store has it, otherwise
  :func:`factoid_type` (a wh-word / number regex that mimics MS MARCO's five types).
* ``entity``: :func:`is_entity_bearing` (a capitalised word after the first, an acronym, or a
  letter-digit token such as ``IL-6`` / ``BRCA1``).
* ``length``: :func:`length_bucket` on whitespace words: ``<=5``, ``6-10``, ``11+``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_WH = [
    ("person", re.compile(r"^\s*(who|whom|whose)\b", re.I)),
    (
        "location",
        re.compile(r"^\s*where\b|\b(what|which)\s+(country|city|state|county|continent)\b", re.I),
    ),
    (
        "numeric",
        re.compile(
            r"^\s*(when|how\s+(many|much|long|old|far|big|tall|often|fast|large|hot|cold|deep))\b"
            r"|\b(what|which)\s+(year|date|time|age|percentage|number|temperature)\b",
            re.I,
        ),
    ),
    (
        "description",
        re.compile(r"^\s*(why|how|define|definition|meaning|explain|describe)\b", re.I),
    ),
    ("entity", re.compile(r"^\s*(what|which|name)\b", re.I)),
]
# a number standing alone (not the digit of a name such as ALDH1, IL-6, Arp2/3 or αvβ8), or a
# percentage
_DIGIT = re.compile(r"(?<![\w/-])\d|%|\bper\s*cent\b", re.I)
_ACRONYM = re.compile(r"\b[A-Z]{2,}[A-Za-z0-9]*\b")
_ALNUM = re.compile(r"\b(?=[A-Za-z0-9-]*[A-Za-z])(?=[A-Za-z0-9-]*\d)[A-Za-z0-9-]{2,}\b")
_CAP = re.compile(r"^[A-Z][a-z]+")

LENGTH_BUCKETS = ("<=5", "6-10", "11+")


def factoid_type(text: str) -> str:
    """A regex stand-in for MS MARCO's ``query_type`` on sources without it.

    Wh-word rules first (``who`` -> person, ``where`` -> location, ``when`` / ``how many`` ->
    numeric, ``why`` / ``how`` / ``define`` -> description, ``what`` / ``which`` -> entity);
    a query with no wh-word (e.g. a SciFact claim) is ``numeric`` if it carries a number or a
    percentage, else ``description``.

    Returns:
        One of ``"person", "location", "numeric", "description", "entity"``.
    """
    for label, pat in _WH:
        if pat.search(text):
            return label
    return "numeric" if _DIGIT.search(text) else "description"


def is_entity_bearing(text: str) -> bool:
    """True when the query names something: an acronym (``TNF``, ``DNA``), a letter-digit token
    (``IL-6``, ``BRCA1``), or a capitalised word that is not the first word (``Alzheimer``)."""
    if _ACRONYM.search(text) or _ALNUM.search(text):
        return True
    words = text.split()
    return any(_CAP.match(w) and w != "I" for w in words[1:])


def length_bucket(text: str) -> str:
    """``"<=5"``, ``"6-10"`` or ``"11+"`` whitespace-separated words."""
    n = len(text.split())
    return LENGTH_BUCKETS[0] if n <= 5 else LENGTH_BUCKETS[1] if n <= 10 else LENGTH_BUCKETS[2]


def query_labels(
    texts: Sequence[str], query_types: Sequence[str] | None = None
) -> dict[str, list[str]]:
    """The three probe labellings of ``texts``.

    Args:
        texts: query texts.
        query_types: per-query source types (MS MARCO ``query_type``); ``None`` or all-empty
            falls back to :func:`factoid_type`.

    Returns:
        ``{"query_type": [...], "entity": ["yes"/"no", ...], "length": [...]}``.
    """
    if query_types is not None and len(query_types) != len(texts):
        raise ValueError(f"{len(query_types)} query types for {len(texts)} queries")
    if query_types is not None and any(t for t in query_types):
        qt = [str(t).lower() if t else "unknown" for t in query_types]
    else:
        qt = [factoid_type(t) for t in texts]
    return {
        "query_type": qt,
        "entity": ["yes" if is_entity_bearing(t) else "no" for t in texts],
        "length": [length_bucket(t) for t in texts],
    }
