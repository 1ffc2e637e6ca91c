"""docs/serving.md's throughput table is the one bench/bench_all.py renders from its JSON, and the
page keeps no other load-test table."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_module import load_bench

REPO = Path(__file__).resolve().parents[2]


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
    assert "bench_serve:begin" not in text  # the old, relabelled table is gone
