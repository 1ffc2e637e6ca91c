"""The forest benches' read-off code: the envelope interpolation and the issue-27 targets
section (bench/forest_docs.py), the config overrides and the table renderers
(bench/bench_forest_twins.py), on hand-made result documents."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.bench_module import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    return load_bench(name)


def test_envelope_interpolates_in_log_cost_and_says_out_of_reach() -> None:
    env = _module("forest_docs").envelope_at
    pts = [(10.0, 0.1), (100.0, 0.5), (50.0, 0.05)]  # (50, 0.05) is below the envelope
    # between the corners (10, 0.1) and (100, 0.5): 0.1 + 0.4 * log(10^(1/2)) / log(10)
    assert env(pts, math.sqrt(10.0) * 10.0) == pytest.approx(0.3, abs=1e-12)
    assert env(pts, 10.0) == pytest.approx(0.1)
    assert env(pts, 1000.0) == pytest.approx(0.5)
    assert env(pts, 5.0) is None


def _twins_doc() -> dict:
    def row(m: int, delta: float, p: float) -> dict:
        return {
            "n_models": m,
            "probe": 1,
            "scoring": "shipped",
            "part": "all",
            "n_queries": 10,
            "cosine": {"ndcg@10": 0.7, "recall@100": 0.9},
            "mean": {
                "irli": {"ndcg@10": 0.3 + delta, "recall@100": 0.6},
                "twin-random": {"ndcg@10": 0.3, "recall@100": 0.5},
            },
            "strongest_twin": "twin-random",
            "vs_strongest_twin": {
                "irli": {
                    "ndcg@10": {"delta": delta, "p": p},
                    "recall@100": {"delta": 0.1, "p": p},
                }
            },
        }

    return {
        "label": "toy",
        "n_classes": 32,
        "n_models": 256,
        "twin_seeds": [0, 1, 2],
        "rows": [row(128, 0.05, 0.001), row(256, -0.01, 0.3)],
    }


def _first_doc() -> dict:
    def pt(system: str, postings: float, nbytes: float, scored: float, rec: float, nd: float):
        return {
            "system": system,
            "setting": f"{system} {postings:.0f}",
            "params": {},
            "scored_per_query": scored,
            "fraction_scored": scored / 1000,
            "postings_per_query": postings,
            "index_bytes_per_passage": nbytes,
            "recall100_vs_cosine": rec,
            "qps": 1.0,
            "parts": {"all": {"ndcg@10": nd, "recall@100": 0.9}},
        }

    return {
        "rows": [
            pt("exact cosine", 1000, 0, 1000, 1.0, 0.7),
            pt("forest", 1000, 100, 20, 0.8, 0.6995),
            pt("forest", 4000, 400, 20, 0.9, 0.6999),
            pt("random twin", 2000, 200, 20, 0.7, 0.69),
            pt("ivf-flat", 50, 10, 50, 0.6, 0.65),
        ]
    }


def test_targets_section_reads_the_documents() -> None:
    text = _module("forest_docs").targets_section(_twins_doc(), _first_doc())
    # per M: the delta and its p; a loss at M = 256 fails the target
    assert "+0.050 (p 0.001, vs twin-random)" in text and "-0.010 (p 0.3" in text
    assert "| irli | 1 | `shipped` |" in text and text.count("| no |") >= 1
    lines = {ln.split(" | ")[0]: ln for ln in text.splitlines() if ln.startswith("| ")}
    # the twin's budget (2,000 postings, 200 B): forest envelope 0.8 + 0.1 * log 2 / log 4
    twin = lines["| random twin random twin 2000"]
    assert "| 0.850 | 0.850 | forest |" in twin
    # IVF's budget is below every forest point
    assert "out of reach | out of reach | ivf-flat |" in lines["| ivf-flat ivf-flat 50"]
    assert "best 0.6999 (-0.0001)" in text and "**met**" in text


def test_forest_config_overrides_and_their_errors(tmp_path: Path) -> None:
    mod = _module("bench_forest_twins")
    path = tmp_path / "f.yaml"
    path.write_text("model: {n_models: 8, n_classes: 128}\ntrainer: {nr_weight: 0.5}\n")
    cfg = mod.forest_config_file(path, 64, ["model.n_classes=32", "trainer.validate_at=[16, 64]"])
    assert cfg["model"] == {"n_models": 64, "n_classes": 32}
    assert cfg["trainer"] == {"nr_weight": 0.5, "validate_at": [16, 64]}
    with pytest.raises(ValueError, match=r"--trained-set #1 'n_classes=32'"):
        mod.forest_config_file(path, 64, ["n_classes=32"])


def test_twins_tables_skip_variants_past_their_m() -> None:
    mod = _module("bench_forest_twins")
    doc = _twins_doc()
    del doc["rows"][1]["mean"]["irli"]
    del doc["rows"][1]["vs_strongest_twin"]["irli"]
    table = mod.render(doc)
    assert "| 256 | 1 | shipped | all (10) | 0.700 | - | 0.300 | twin-random | - |" in table
    curve = mod.render_curve(doc, 1, "shipped")
    assert "| 128 | 0.700 / 0.900 | 0.350 / 0.600 | 0.300 / 0.500 | twin-random |" in curve
