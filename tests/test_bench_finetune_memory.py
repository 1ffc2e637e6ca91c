"""``bench/bench_finetune_memory.py``: its ratios are against the plain bi-encoder step measured
in the same run, and its table comes from the document."""

from __future__ import annotations

from tests.bench_module import load_bench

bench = load_bench("bench_finetune_memory")


def test_the_table_renders_every_variant_with_its_ratios() -> None:
    rows = {
        "biencoder": {"cpu_s_per_step": 10.0, "peak_rss_mib": 4000.0},
        "drt-e2e + GradCache (mini-batch 8)": {"cpu_s_per_step": 21.5, "peak_rss_mib": 2500.0},
    }
    for r in rows.values():
        ref = rows[bench.REFERENCE]
        r["time_ratio"] = r["cpu_s_per_step"] / ref["cpu_s_per_step"]
        r["rss_ratio"] = r["peak_rss_mib"] / ref["peak_rss_mib"]
    doc = {
        "date": "2026-12-03 16:00 UTC",
        "command": "python bench/bench_finetune_memory.py --store STORE --steps 4",
        "cpu": {"Model name": "AMD EPYC"},
        "setup": {"batch_size": 32, "max_query_length": 32, "max_passage_length": 256},
        "rows": rows,
    }
    table = bench.render(doc)
    assert "| biencoder | 10.0 | 1.00 | 4000 | 1.00 |" in table
    assert "| drt-e2e + GradCache (mini-batch 8) | 21.5 | 2.15 | 2500 | 0.62 |" in table
    assert "AMD EPYC" in table and "passage 256 tokens" in table


def test_the_reference_is_a_variant_and_every_variant_parses() -> None:
    from treerank.training.finetune_config import parse_finetune_config

    assert bench.REFERENCE in bench.VARIANTS
    for family, trainer in bench.VARIANTS.values():
        cfg = parse_finetune_config({"family": family, "trainer": trainer})
        assert cfg.family == family
