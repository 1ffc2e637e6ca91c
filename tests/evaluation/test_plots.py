"""Comparison plots: titles name the dataset; deltas carry the paired CIs."""

from __future__ import annotations

from pathlib import Path

from treerank.evaluation.plots import dataset_label, delta_rows, plot_deltas, plot_recall_curve

TESTS = {
    "bm25": {"ndcg@10": {"delta": 0.031, "ci_low": -0.006, "ci_high": 0.068}},
    "linear": {
        "ndcg@10": {"delta": 0.135, "ci_low": 0.1, "ci_high": 0.17},
        "mrr@10": {"delta": 0.14, "ci_low": 0.1, "ci_high": 0.18},
    },
}


def test_dataset_label_from_store_path() -> None:
    assert dataset_label("runs/sample/stores/scifact/test") == "scifact/test"
    assert dataset_label(None, "test") == "test"


def test_delta_rows_keep_delta_and_paired_ci() -> None:
    assert delta_rows(TESTS, ["ndcg@10"]) == [
        ("bm25", "ndcg@10", 0.031, -0.006, 0.068),
        ("linear", "ndcg@10", 0.135, 0.1, 0.17),
    ]
    assert delta_rows(TESTS, ["mrr@10"]) == [("linear", "mrr@10", 0.14, 0.1, 0.18)]


def test_plots_write_pngs(tmp_path: Path) -> None:
    p = plot_deltas(TESTS, ["mrr@10", "ndcg@10"], "cosine", tmp_path / "d.png", "scifact/test")
    assert p.read_bytes()[:4] == b"\x89PNG"
    r = plot_recall_curve({"cosine": {1: 0.2, 10: 0.6}}, tmp_path / "r.png", "scifact/test")
    assert r.stat().st_size > 1000
