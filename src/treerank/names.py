"""Names: messages for an unknown name (a system kind, a model family: a "did you mean" and
the list), and the one map from a name to a file name (:func:`file_name`).

A typo should get one short line back, not a dump of every registered entry with its help:
``unknown system kind 'cosin'; did you mean 'cosine'? known: cosine, bm25, ...``. The close
match is :func:`difflib.get_close_matches` (Ratcliff/Obershelp similarity, cutoff 0.6).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["check_name", "closest", "file_name", "name_problem", "slug", "unknown_name"]


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name most similar to ``name`` (similarity >= 0.6), or None.

    Case is ignored when matching; the known name is returned as spelt.
    """
    names = list(known)
    by_lower = {n.lower(): n for n in names}
    hit = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[hit[0]] if hit else None


def unknown_name(what: str, name: str, known: Iterable[str], hint: str = "") -> str:
    """``"unknown <what> '<name>'; did you mean '<x>'? known: a, b, c"`` (no suggestion when
    nothing is close), followed by ``hint`` (e.g. where each entry's parameters are described).
    """
    names = list(known)
    guess = closest(name, names)
    text = f"unknown {what} {name!r}"
    text += f"; did you mean {guess!r}? known:" if guess is not None else "; known:"
    text += f" {', '.join(names)}"
    return text + (f" ({hint})" if hint else "")


# ------------------------------------------------------------------------- names -> file names
FILE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.+=@-")
"""Characters a name may keep unchanged in a file name: lower-case ASCII letters and digits and
``_ . + = @ -`` (safe on every common filesystem, case-insensitive ones included)."""
PLAIN_MAX = 64
"""The longest name used as its own file name."""
SLUG_MAX = 40
DIGEST_HEX = 16
_RESERVED = frozenset(
    ["con", "prn", "aux", "nul"] + [f"{p}{i}" for p in ("com", "lpt") for i in range(1, 10)]
)  # Windows device names: not files, whatever the extension


def _plain(name: str) -> bool:
    return (
        0 < len(name) <= PLAIN_MAX
        and all(c in FILE_NAME_CHARS for c in name)
        and name[0] not in ".-"
        and name.partition(".")[0] not in _RESERVED
    )


def slug(name: str, max_len: int = SLUG_MAX) -> str:
    """A readable, lossy, file-name-safe rendering of ``name``: lower case, every run of
    characters outside :data:`FILE_NAME_CHARS` replaced by ``_``, no leading ``.``/``-``/``_``,
    at most ``max_len`` characters; ``"name"`` when nothing readable is left (``"模型"``).
    Not injective: use :func:`file_name` for a path."""
    out: list[str] = []
    for c in name.lower():
        if c in FILE_NAME_CHARS:
            out.append(c)
        elif not out or out[-1] != "_":
            out.append("_")
    text = "".join(out).lstrip("._-")[:max_len].rstrip("_")
    return text or "name"


def file_name(name: str) -> str:
    """The one file (or directory) name of a run, stage, system, dataset or experiment name.

    A *plain* name (1..64 characters of :data:`FILE_NAME_CHARS`, not starting with ``.`` or
    ``-``, not a Windows device name such as ``con``) is its own file name (``bm25``,
    ``linear@seed0``); any other gets its :func:`slug` plus ``~`` and the first 16 hex digits of
    the SHA-256 of its UTF-8 bytes (``rrf:bm25+cosine`` -> ``rrf_bm25+cosine~<16 hex>``,
    ``модель`` -> ``name~<16 hex>``). Plain outputs contain no ``~`` and digest outputs do, so the
    map is injective up to a 64-bit hash collision; every output is at most 64 characters of
    ``[a-z0-9_.+=@~-]`` (safe on case-insensitive and length-limited filesystems).

    The file name is never read back (the name itself is recorded where it is needed).

    Raises:
        ValueError: ``name`` cannot be represented (see :func:`check_name`).
    """
    check_name(name)
    if _plain(name):
        return name
    import hashlib

    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:DIGEST_HEX]
    return f"{slug(name)}~{digest}"


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a run / stage / system / dataset name, or None when it can.

    Refused: a non-string, an empty or blank name, and names holding a control character
    (Unicode category ``Cc``: newline, tab, NUL...), a lone surrogate (``Cs``: not UTF-8) or a
    line / paragraph separator (``Zl``/``Zp``), which would break the line-oriented files (TREC
    runs, JSON lines, Markdown tables) a name is written to.
    """
    import unicodedata

    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if not name.strip():
        return "empty name"
    for i, c in enumerate(name):
        cat = unicodedata.category(c)
        if cat in ("Cc", "Cs", "Zl", "Zp"):
            return (
                f"character {i} is U+{ord(c):04X} ({cat}: a control, surrogate or line-break "
                "character), which cannot be written to run files and tables"
            )
    return None


def check_name(name: object, what: str = "name") -> None:
    """Raise ``ValueError("<what> <name!r>: <problem>")`` when :func:`name_problem` finds one."""
    why = name_problem(name)
    if why is not None:
        raise ValueError(f"{what} {name!r}: {why}")
