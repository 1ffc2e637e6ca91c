"""docs/serving.md's load-test table is the one bench/bench_serve.py renders from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_module import load_bench

REPO = Path(__file__).resolve().parents[2]


def test_serving_doc_table_is_generated_from_the_results_file() -> None:
    bench = load_bench("bench_serve")
    doc = json.loads((REPO / "bench/results/serve/scifact-cosine.json").read_text())
    text = (REPO / "docs" / "serving.md").read_text()
    assert f"{bench.BEGIN}\n{bench.render(doc)}\n{bench.END}" in text
    assert all(r["failed"] == 0 for r in doc["levels"])


def test_serving_throughput_table_is_generated_from_the_one_benchmark_command() -> None:
    bench = load_bench("bench_all")
    doc = json.loads((REPO / "bench/results/bench_all.json").read_text())
    text = (REPO / "docs" / "serving.md").read_text()
    assert f"{bench.BEGIN}\n{bench.render_serving(doc)}\n{bench.END}" in text
    rows = doc["serve"]["rows"]
    assert {(r["mode"], r["clients"]) for r in rows} == {
        (m, c) for m in bench.SERVE_MODES for c in (1, 8)
    }
    assert all(r["failed"] == 0 for r in rows)
    assert doc["cpu"]["Model name"] and doc["cpu"]["Flags"]  # the CPU's model and flags
