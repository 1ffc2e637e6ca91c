"""The seed-scale bench's pieces (``bench/bench_scale.py``) and its page (``bench/scale_table.py``):
the lift, the written rows and their finiteness record, the disk count, the rendered targets."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.bench_module import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    return load_bench(name)


bench = _load("bench_scale")
table = _load("scale_table")


class _Gaussian:
    """A stand-in mixture: ``sample(n, seed)`` -> ``float32 (n, 384)`` unit rows."""

    def sample(self, n: int, seed: Any) -> np.ndarray:
        x = np.random.default_rng(seed).standard_normal((n, bench.BASE_DIM)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_lift_matrix_has_orthonormal_rows() -> None:
    r = bench.lift_matrix()
    assert r.shape == (384, 3840) and r.dtype == np.float32
    np.testing.assert_allclose(r @ r.T, np.eye(384), atol=1e-5)


def test_write_rows_writes_unit_rows_counts_them_finite_and_reuses_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "passages.bin"
    assert bench.write_rows(path, _Gaussian(), 300, 0, 4.0, 128) == (0, None)
    x = np.fromfile(path, np.float32).reshape(300, 3840)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    # noise power 1 / SNR against signal power 1: the lifted part keeps cos^2 ~ SNR / (1 + SNR)
    base = np.concatenate([_Gaussian().sample(128, [0, i]) for i in range(3)])[:300]
    cos = np.einsum("nd,nd->n", x, base @ bench.lift_matrix())
    assert abs(float(np.mean(cos**2)) - 0.8) < 0.02
    x[7, 3] = np.nan  # a reused file is scanned, not rewritten
    x.tofile(path)
    stamp = path.stat().st_mtime_ns
    assert bench.write_rows(path, _Gaussian(), 300, 0, 4.0, 128) == (1, 7)
    assert path.stat().st_mtime_ns == stamp


def test_disk_bytes_counts_a_hard_linked_file_once(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "p.bin").write_bytes(b"x" * 1000)
    (tmp_path / "b").mkdir()
    os.link(tmp_path / "a" / "p.bin", tmp_path / "b" / "p.bin")
    (tmp_path / "b" / "q.bin").write_bytes(b"y" * 10)
    assert bench.disk_bytes(tmp_path) == 1010


def _doc(exact_qps: float) -> dict[str, Any]:
    stage = {"peak_rss_gib": 1.0, "exit": 0, "load_average": {"start": [3.0], "end": [5.0]}}
    return {
        "settings": {
            "passages": 1_000_000,
            "fit_store": "x/scifact-abc/test",
            "snr": 4.0,
            "eval_queries": 2000,
            "train_queries": 808_000,
            "ivfpq": "faiss:ivfpq:nlist=256",
        },
        "stages": {
            "data": {**stage, "wall_seconds": 10.0, "cpu_seconds": 5.0, "bytes": {"p": 10**9}},
            "exact": {
                **stage,
                "wall_seconds": 100.0,
                "cpu_seconds": 80.0,
                "seconds": 95.0,
                "queries": 2000,
                "qps": exact_qps,
                "backend": "torch",
            },
            "flat-reference": {
                **stage,
                "wall_seconds": 200.0,
                "cpu_seconds": 160.0,
                "seconds": 190.0,
                "queries": 2000,
                "qps": 10.0,
                "same_ids_fraction": 1.0,
            },
            "ivfpq": {**stage, "wall_seconds": 50.0, "error": "stopped at its time limit"},
            "forest": {
                **stage,
                "peak_rss_gib": 9.5,
                "wall_seconds": 300.0,
                "cpu_seconds": 240.0,
                "seconds": 290.0,
                "train_queries": 808_000,
                "classes": 1000,
                "chunk_size": 65536,
                "steps_per_stage": 1,
                "random_negatives": 1,
                "passage_rows": 500_000,
                "pair_seconds": 280.0,
                "whole_logits_and_gradients_gib": 9.75,
            },
        },
    }


def test_scale_page_states_targets_from_the_results() -> None:
    page = table.render(_doc(exact_qps=12.0))
    assert "= 1.20x (target >= 0.9x: met)" in page
    assert "CPU time alone (the disk wait left out): 80.0 s vs 160.0 s = 2.00x" in page
    assert "| ivfpq | `faiss:ivfpq:nlist=256` build + search | not finished after 50.0 |" in page
    assert "peak RSS 9.50 GiB (target < 8: NOT met)" in page
    # the forest's seed extrapolation: 240 CPU s / 3 steps x 130 steps x 2,000 pairs
    assert f"{240 / 3 * 130 * 2000 / 3600:,.0f} h in all" in page
    assert "1-minute load average 3.0 to 5.0" in page
    assert table.render(_doc(exact_qps=8.0)).count("(target >= 0.9x: NOT met)") == 1


def test_merge_joins_stage_runs_and_refuses_another_store(tmp_path: Path) -> None:
    import json

    import pytest

    base = {"root": "/tmp/r", "passages": 10, "snr": 4.0, "timeout": 100.0, "n_eval": 500}
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps({"settings": base, "stages": {"data": {"cpu_seconds": 1.0}}}))
    b.write_text(
        json.dumps(
            {"settings": {**base, "timeout": 50.0, "n_eval": 2000}, "stages": {"exact": {"x": 2}}}
        )
    )
    doc = table.merge([a, b])
    assert doc["settings"]["n_eval"] == 2000
    assert doc["stages"]["exact"] == {"x": 2}
    assert doc["stages"]["data"] == {
        "cpu_seconds": 1.0,
        "run_settings": {"timeout": 100.0, "n_eval": 500},
    }
    b.write_text(json.dumps({"settings": {**base, "passages": 20}, "stages": {}}))
    with pytest.raises(ValueError, match="passages"):
        table.merge([a, b])


def test_a_stopped_forest_lists_the_steps_that_ended() -> None:
    doc = _doc(exact_qps=12.0)
    doc["stages"]["forest"] = {
        "wall_seconds": 600.0,
        "peak_rss_gib": 3.25,
        "cpu_seconds": 250.0,
        "exit": -9,
        "error": "stopped at its time limit",
        "steps": [{"stage": "query", "seconds": 120.0, "peak_rss_gib": 3.0}],
    }
    page = table.render(doc)
    assert "steps that ended: query 120.0 s (peak RSS 3.00 GiB)" in page
    assert "peak RSS 3.25 GiB when it was stopped" in page


def test_update_keeps_the_rows_not_rerun_marked_with_their_commit(tmp_path: Path) -> None:
    old = _doc(exact_qps=8.0)
    rerun = {
        "settings": {**old["settings"], "train_queries": 0},  # a search-only store
        "stages": {"exact": {**old["stages"]["exact"], "qps": 20.0}},
    }
    (tmp_path / "exact.json").write_text(json.dumps(rerun))
    doc = table.update(old, [tmp_path / "exact.json"], "abc1234")
    assert doc["stages"]["exact"]["qps"] == 20.0
    assert doc["stages"]["exact"]["run_settings"] == {"train_queries": 0}
    assert "measured_at_commit" not in doc["stages"]["exact"]
    assert doc["stages"]["flat-reference"]["measured_at_commit"] == "abc1234"
    assert "measured_at_commit" not in old["stages"]["flat-reference"]  # the input is kept
    page = table.render(doc)
    assert "(not rerun: measured at commit abc1234)" in page
    other = {"settings": {**old["settings"], "passages": 100_000}, "stages": {}}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="passages differ"):
        table.update(old, [tmp_path / "other.json"], "abc1234")


def _run(code: str, chunk: int, query: float, passage: float) -> dict[str, Any]:
    steps = [
        {"stage": s, "seconds": 1.0, "peak_rss_gib": v, "step_peak_gib": {"VmRSS": v}}
        for s, v in (("query", query), ("passage", passage))
    ]
    return {
        "code": code,
        "chunk_size": chunk,
        "train_queries": 20,
        "dim": 8,
        "passage_rows": 30,
        "steps": steps,
    }


def test_forest_memory_model_by_hand() -> None:
    """Two runs differing only in B: query 1.0 vs 0.5 GiB at B = 10 vs 5 -> alpha 0.1 GiB per
    block row, intercept 0; passage 2.0 vs 1.5 -> alpha 0.1, intercept 1.0. At n = 40 (n0 =
    20, d = 8, N = 100 passages, 30 passage rows measured): query adds (64 + 8 / 8) * 20 =
    1,300 bytes; passage adds 64 * 20 + 1 * (100 * (1 - e^-0.4) + 1,024 - 30) = 2,306.97."""
    doc = {"passages": 100, "runs": [_run("after", 10, 1.0, 2.0), _run("after", 5, 0.5, 1.5)]}
    alphas = table.forest_alphas(doc)
    assert alphas["query"] == pytest.approx(0.1 * 2**30) and alphas["passage"] == pytest.approx(
        0.1 * 2**30
    )
    pred = table.forest_model(doc, 40, 10, n_passages=100)
    assert pred["query"] == pytest.approx(1.0 + 1300 / 2**30, abs=1e-12)
    new_rows = 100 * (1 - np.exp(-0.4)) + 1024 - 30
    assert pred["passage"] == pytest.approx(2.0 + (1280 + new_rows) / 2**30, abs=1e-12)
    assert table.forest_model(doc, 40, 5, n_passages=100)["query"] == pytest.approx(
        0.5 + 1300 / 2**30
    )
