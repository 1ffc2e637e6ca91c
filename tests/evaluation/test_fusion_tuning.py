"""Tuned and query-adaptive fusion: weight chosen on another split, frozen, never the eval split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.evaluation.settings import EvaluationSettings
from treerank.metrics.qrels import Qrels
from treerank.search.fusion_tuning import (
    AdaptiveWeightModel,
    TunedFusionSystem,
    cross_validate,
    fusion_curve,
    select_weight,
    tuning_rows,
)
from treerank.search.specs import build_system
from treerank.store import EmbeddingStore
from treerank.store.view import QuerySubset


def _two_splits(tmp_path: Path) -> tuple[EmbeddingStore, EmbeddingStore]:
    write_tiny_store(tmp_path / "train", seed=3)
    meta = json.loads((tmp_path / "train" / "meta.json").read_text())
    (tmp_path / "train" / "meta.json").write_text(json.dumps({**meta, "split": "train"}))
    return EmbeddingStore.open(tmp_path / "train"), write_tiny_store(tmp_path / "test", seed=1)


class _NoLabels:
    """The evaluation store with its judgments hidden: reading them fails the test."""

    def __init__(self, store: EmbeddingStore) -> None:
        self._s = store

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name in ("candidates", "labels"):
            raise AssertionError(f"the fusion weight was tuned with the evaluation split's {name}")
        return getattr(self._s, name)


def test_select_weight_ties_go_to_the_middle() -> None:
    grid = np.linspace(0, 1, 5)
    assert select_weight(grid, np.array([0.1, 0.3, 0.3, 0.3, 0.2])) == 2
    assert select_weight(grid, np.array([0.3, 0.3, 0.1, 0.1, 0.1])) == 1
    assert select_weight(grid, np.array([0.1, 0.2, 0.1, 0.2, 0.1])) == 1  # 0.25 vs 0.75: smaller
    assert select_weight(grid, np.array([0.0, 0.0, 0.0, 0.0, 0.9])) == 4


def test_weight_is_tuned_on_the_train_split_and_never_reads_eval_labels(tmp_path: Path) -> None:
    train, test = _two_splits(tmp_path)
    spec = "tuned-fusion:bm25+cosine:method=linear,norm=minmax,queries=all,grid=5"
    system = build_system(spec)
    assert isinstance(system, TunedFusionSystem)
    run = system.retrieve(_NoLabels(test), k=8)  # judgments of the eval split never read
    assert run.n_queries == test.n_queries
    t = system.tuning
    assert t["tuned_on"]["split"] == "train" and t["tuned_on"]["n_queries"] == 4
    # the curve is the train split's: recompute it from the train runs directly
    a, b = build_system("bm25"), build_system("cosine")
    grid = np.linspace(0, 1, 5)
    y = fusion_curve(
        a.retrieve(train, 1000),
        b.retrieve(train, 1000),
        Qrels.from_store(train),
        grid,
        "linear",
        "minmax",
    )
    assert list(t["curve"].values()) == pytest.approx(np.nanmean(y, axis=0).tolist())
    assert t["weight"] == grid[select_weight(grid, np.nanmean(y, axis=0))]
    # frozen: the evaluation run is the fusion at that one weight
    from treerank.search.fusion import linear_fusion

    want = linear_fusion(a.retrieve(test, 1000), b.retrieve(test, 1000), k=8, weight=t["weight"])
    assert run.ids.tolist() == want.ids.tolist()


def test_tuning_on_the_evaluated_split_is_refused(tmp_path: Path) -> None:
    _, test = _two_splits(tmp_path)
    with pytest.raises(ValueError, match="evaluated split"):
        build_system("tuned-fusion:bm25+cosine:on=test").retrieve(test, 8)
    with pytest.raises(FileNotFoundError, match="dev"):
        build_system("tuned-fusion:bm25+cosine:on=dev").retrieve(test, 8)
    with pytest.raises(ValueError, match="method"):
        build_system("tuned-fusion:bm25+cosine:method=max")


def test_adaptive_fusion_runs_and_reports(tmp_path: Path) -> None:
    _, test = _two_splits(tmp_path)
    system = build_system("adaptive-fusion:bm25+cosine:method=rrf,queries=all,grid=3")
    run = system.retrieve(_NoLabels(test), k=8)
    assert run.n_queries == 4
    t = system.tuning
    assert sum(t["eval_weights"]["histogram"].values()) == 4
    assert set(t["cv_on_tuning_queries"]) == {"global", "adaptive", "folds", "n_queries"}
    assert t["cv_on_tuning_queries"]["n_queries"] == 4


def test_cross_validation_on_two_queries_reports_not_enough_queries() -> None:
    # 2 tuning queries, 5 folds: each fold would fit on 1 query, so every fold is skipped; the
    # old code returned np.mean(np.empty(2)), numbers from uninitialised memory
    grid = np.linspace(0, 1, 3)
    x = np.array([[0.0, 1.0], [1.0, 0.0]])
    y = np.array([[0.2, 0.5, 0.9], [0.7, 0.4, 0.1]])
    cv = cross_validate(x, y, grid)
    assert cv == {
        "status": "not enough queries",
        "folds": 5,
        "n_queries": 0,
        "tuning_queries": 2,
        "needed": 3,
    }


def test_cross_validation_global_mean_is_over_scored_queries_hand_computed() -> None:
    # 3 queries, one per fold: query 0 and 1 see means [0.5, 0.5] (tie -> w = 0), query 2 sees
    # [1, 0] (w = 0): global = (1 + 1 + 0) / 3
    grid = np.array([0.0, 1.0])
    x = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    y = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    cv = cross_validate(x, y, grid)
    assert cv["n_queries"] == 3 and cv["folds"] == 5
    assert cv["global"] == pytest.approx(2 / 3, abs=1e-12)
    assert 0.0 <= cv["adaptive"] <= 1.0


def test_adaptive_fusion_with_two_tuning_queries_says_not_enough(tmp_path: Path) -> None:
    from treerank.search.fusion_tuning import tuning_markdown

    _, test = _two_splits(tmp_path)
    system = build_system("adaptive-fusion:bm25+cosine:queries=all,max_queries=2,grid=3")
    system.retrieve(_NoLabels(test), k=8)
    t = system.tuning
    assert t["tuned_on"]["n_queries"] == 2
    cv = t["cv_on_tuning_queries"]
    assert cv["status"] == "not enough queries" and "global" not in cv and "adaptive" not in cv
    text = tuning_markdown({system.name: t})
    assert "5-fold CV on tuning queries: not enough queries (2, needs 3)" in text


def test_adaptive_model_learns_a_feature_dependent_weight() -> None:
    rng = np.random.default_rng(0)
    grid = np.linspace(0, 1, 3)
    x = rng.standard_normal((400, 5))
    # queries with x0 > 0 do best at w = 1, the others at w = 0 (a tuned global weight can't)
    y = np.where(x[:, :1] > 0, grid[None, :], 1 - grid[None, :])
    w = (
        AdaptiveWeightModel(grid)
        .fit(x, y)
        .weights(np.array([[2.0, 0, 0, 0, 0], [-2.0, 0, 0, 0, 0]]))
    )
    assert w.tolist() == [1.0, 0.0]
    cv = cross_validate(x, y, grid)
    assert cv["adaptive"] > 0.9 and cv["global"] < 0.6


def test_tuning_rows_heldout_is_the_trainers_holdout() -> None:
    from treerank.training.holdout import holdout_split

    class S:
        candidates = np.array([[0], [1], [-1], [3], [4], [5], [6], [7], [8], [9]])
        labels = np.array([[1], [1], [0], [1], [1], [1], [1], [1], [1], [1]])
        relevance_threshold = 1
        queries = np.arange(20.0).reshape(10, 2)
        n_queries = 10
        meta: dict[str, object] = {}

        def source_qrels(self) -> None:
            return None  # judged by candidates / labels alone

    rows, has_rel = tuning_rows(S(), "heldout", 100, seed=0)
    assert rows.tolist() == holdout_split(has_rel, 0.2, 0, 2000)[1].tolist()
    assert 2 not in tuning_rows(S(), "all", 100, seed=0)[0]
    sub = QuerySubset(S(), np.array([3, 1]))
    assert sub.candidates.ravel().tolist() == [3, 1] and sub.n_queries == 2
    assert sub.queries.tolist() == [[6.0, 7.0], [2.0, 3.0]]


def test_compare_systems_reports_the_frozen_weight_and_curve(tmp_path: Path) -> None:
    from treerank.evaluation.compare import compare_systems

    _, test = _two_splits(tmp_path)
    spec = "tuned-fusion:bm25+cosine:queries=all,grid=3"
    comp = compare_systems(
        test,
        ["cosine", "bm25", spec],
        settings=EvaluationSettings(baseline="cosine", k=8),
        out_dir=tmp_path / "ev",
    )
    assert set(comp.tuning) == {spec}
    doc = json.loads((tmp_path / "ev" / "tuning.json").read_text())
    assert doc[spec]["weight"] in (0.0, 0.5, 1.0) and len(doc[spec]["curve"]) == 3
    assert (tmp_path / "ev" / "plots" / "fusion_tuning.png").stat().st_size > 0
    assert "then frozen" in comp.markdown() and spec in comp.markdown()


def test_cross_fitting_never_chooses_a_query_weight_with_its_own_judgments(tmp_path: Path) -> None:
    _, test = _two_splits(tmp_path)
    system = build_system("tuned-fusion:bm25+cosine:on=cv,method=rrf,grid=5")
    a, b = build_system("bm25").retrieve(test, 1000), build_system("cosine").retrieve(test, 1000)
    weights = system.cross_fit(test, a, b)  # 4 queries, 5 folds: one query per fold
    grid = np.linspace(0, 1, 5)
    y = fusion_curve(a, b, Qrels.from_store(test), grid, "rrf")
    for i in range(4):
        others = np.delete(y, i, axis=0)
        assert weights[i] == grid[select_weight(grid, others.mean(axis=0))]
    assert system.tuning["tuned_on"]["split"] == "cv" and len(system.tuning["fold_weights"]) == 5
    run = system.retrieve(test, 8)
    assert run.n_queries == 4
