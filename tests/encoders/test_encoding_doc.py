"""docs/encoding.md's measured section equals its rendering from the benchmark JSON files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _renderer():
    spec = importlib.util.spec_from_file_location(
        "encoding_table", REPO / "bench" / "encoding_table.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_doc_matches_results():
    mod = _renderer()
    text = mod.DOC.read_text(encoding="utf-8")
    assert mod.splice(text, mod.render()) == text, "run python bench/encoding_table.py"


def test_splice_replaces_only_the_section():
    mod = _renderer()
    text = f"head\n{mod.BEGIN}\nold\n{mod.END}\ntail\n"
    assert mod.splice(text, "new") == f"head\n{mod.BEGIN}\nnew\n{mod.END}\ntail\n"
