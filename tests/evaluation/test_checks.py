"""`check_depth` / `check_evaluable`: refusals that name the setting and the store."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from treerank.evaluation.checks import check_depth, check_evaluable, too_deep


def _store(n_queries: int = 2, n_passages: int = 3, labels: list[list[int]] | None = None):
    cands = np.array([[0, 1], [2, -1]], np.int32)[:n_queries]
    lab = np.array(labels if labels is not None else [[1, 0], [2, 0]], np.uint8)[:n_queries]
    return SimpleNamespace(
        path="stores/x/test",
        n_queries=n_queries,
        n_passages=n_passages,
        candidates=cands,
        labels=lab,
        relevance_threshold=1,
    )


def test_depth_below_one_names_the_flag() -> None:
    with pytest.raises(ValueError, match=r"run depth k \(--k; evaluate.k.*\) must be at least 1"):
        check_depth(0, ["mrr@10"])


def test_metric_deeper_than_depth_is_refused_with_every_such_metric() -> None:
    with pytest.raises(
        ValueError,
        match=r"recall@100, recall@1000 cannot be measured on a top-5 run .* at least 1000",
    ):
        check_depth(5, ["mrr@10", "recall@100", "recall@1000"])
    with pytest.raises(ValueError, match="mrr@10 cannot be measured on a top-5 run"):
        check_depth(5, ["mrr@10"])
    check_depth(10, ["mrr@10", "ndcg@10"])  # equal cutoff is fine


def test_evaluable_store_passes_and_threshold_override_is_used() -> None:
    check_evaluable(_store())
    with pytest.raises(ValueError, match="grade >= 3"):
        check_evaluable(_store(), relevance_threshold=3)


@pytest.mark.parametrize(
    ("store", "expect"),
    [
        (_store(n_passages=0), "store stores/x/test has no passages, so there is nothing to rank"),
        (_store(n_queries=0), "store stores/x/test has no queries"),
        (_store(labels=[[0, 0], [0, 0]]), "none of its 2 queries has a relevant passage"),
    ],
)
def test_unevaluable_stores_are_refused_in_user_terms(store, expect: str) -> None:
    with pytest.raises(ValueError, match=expect):
        check_evaluable(store)


def test_a_depth_covering_every_passage_serves_every_cutoff() -> None:
    assert too_deep(50, ["mrr@10", "recall@100", "recall@1000"], n_passages=500) == [
        "recall@100",
        "recall@1000",
    ]
    assert too_deep(500, ["recall@1000"], n_passages=500) == []
    check_depth(8, ["recall@1000"], n_passages=8)
