"""``bench/bench_all.py``: its search part measures the kernels against FAISS on the same
vectors (same id sets, the reference's ratio 1), and its printed ratios name every part."""

from __future__ import annotations

from tests.bench_module import load_bench

bench = load_bench("bench_all")


def test_search_ratios_check_every_kernel_against_index_flat_ip() -> None:
    doc = bench.search_ratios(n_passages=3_000, n_queries=40, dim=32, k=10, repeats=2)
    rows = doc["rows"]
    assert set(rows) == {
        "faiss IndexFlatIP",
        "exact_search faiss",
        "exact_search torch",
        "exact_search auto",
    }
    assert rows["faiss IndexFlatIP"]["ratio"] == 1.0
    for row in rows.values():
        assert row["same_ids"] == 1.0  # random unit vectors: no ties at the 10th position
        assert row["seconds"] > 0 and row["queries_per_s"] == 40 / row["seconds"]
    assert doc["setup"]["auto_kernel"] in ("faiss", "torch")


def test_ratio_lines_and_the_serving_table_come_from_the_document() -> None:
    row = {"requests": 8, "failed": 0, "p50_ms": 12.25, "p99_ms": 30.0}
    doc = {
        "date": "2026-12-02 02:00 UTC",
        "command": "python bench/bench_all.py --quick",
        "cpus": 2,
        "cpu": {"Model name": "AMD EPYC", "Flags": "avx2"},
        "load": {"serve": [[3.0, 2.0, 1.0], [3.5, 2.0, 1.0]]},
        "search": {
            "rows": {"exact_search torch": {"ratio": 1.5, "queries_per_s": 20.0, "same_ids": 1.0}}
        },
        "serve": {
            "setup": {
                "store": "s/test",
                "n_passages": 5183,
                "system": "cosine",
                "k": 10,
                "batch_window_ms": 2.0,
                "repeats": 1,
            },
            "rows": [
                {**row, "mode": "batch-invariant (default)", "clients": 1, "requests_per_s": 4.0},
                {**row, "mode": "--no-batch-invariant", "clients": 1, "requests_per_s": 5.0},
            ],
            "ratios": {"1 client(s): default / --no-batch-invariant": 0.8},
        },
    }
    lines = bench.ratio_lines(doc)
    assert lines[0].startswith("search  exact_search torch") and "1.500x" in lines[0]
    assert lines[1].startswith("serve   1 client(s)") and "0.800x" in lines[1]
    table = bench.render_serving(doc)
    assert "| batch-invariant (default) | 1 | 8 | 0 | 12.2 | 30.0 | 4.0 |" in table
    assert "- 1 client(s): default / --no-batch-invariant: **0.80x**" in table
    assert "AMD EPYC" in table and "5,183 passages" in table
