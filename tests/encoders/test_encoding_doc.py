"""docs/encoding.md's measured section equals its rendering from the benchmark JSON files."""

from __future__ import annotations

from pathlib import Path

from tests.bench_module import load_bench

REPO = Path(__file__).resolve().parents[2]


def _renderer():
    return load_bench("encoding_table")


def test_doc_matches_results():
    mod = _renderer()
    text = mod.DOC.read_text(encoding="utf-8")
    assert mod.splice(text, mod.render()) == text, "run python bench/encoding_table.py"


def test_splice_replaces_only_the_section():
    mod = _renderer()
    text = f"head\n{mod.BEGIN}\nold\n{mod.END}\ntail\n"
    assert mod.splice(text, "new") == f"head\n{mod.BEGIN}\nnew\n{mod.END}\ntail\n"
