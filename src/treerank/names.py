"""Messages for an unknown name (a system kind, a model family): a "did you mean" and the list.

A typo should get one short line back, not a dump of every registered entry with its help:
``unknown system kind 'cosin'; did you mean 'cosine'? known: cosine, bm25, ...``. The close
match is :func:`difflib.get_close_matches` (Ratcliff/Obershelp similarity, cutoff 0.6).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "unknown_name"]


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
