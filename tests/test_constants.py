"""Constants live once (docs/DESIGN.md, "Configs"): a literal copy anywhere else fails here."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "treerank"

RULES = {
    # pattern -> the one module allowed to spell it
    r"\b65_?536\b": "kernels/vectors.py",  # ROW_CHUNK
    r"\b10_?000\b": "evaluation/significance.py",  # N_PERMUTATIONS
    r"\"ndcg@10\" if": "metrics/metrics.py",  # headline_metric
}
# Literal copies that are another quantity and stay: sweep.N_DRAWS is the number of random
# draws of a sweep's randomisation test (pipeline/sweep.py), not significance.N_PERMUTATIONS.
PENDING = {
    ("pipeline/sweep.py", r"\b10_?000\b"),
}


def copies() -> set[tuple[str, str]]:
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        code = "\n".join(
            line
            for line in path.read_text(encoding="utf-8").splitlines()
            if not line.lstrip().startswith("#")
        )
        for pattern, home in RULES.items():
            if rel != home and re.search(pattern, code):
                found.add((rel, pattern))
    return found


def test_each_constant_is_defined_once() -> None:
    assert copies() - PENDING == set()


def test_the_pending_list_only_names_real_copies() -> None:
    assert PENDING - copies() == set(), "remove fixed entries from PENDING"
