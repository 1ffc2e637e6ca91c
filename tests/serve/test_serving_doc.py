"""docs/serving.md's load-test table is the one bench/bench_serve.py renders from its JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_serving_doc_table_is_generated_from_the_results_file() -> None:
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "bench" / "bench_serve.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = json.loads((REPO / "bench/results/serve/scifact-cosine.json").read_text())
    text = (REPO / "docs" / "serving.md").read_text()
    assert f"{bench.BEGIN}\n{bench.render(doc)}\n{bench.END}" in text
    assert all(r["failed"] == 0 for r in doc["levels"])
