"""Fusion: RRF and normalised linear fusion on hand-computed fixtures."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.search.fusion import linear_fusion, minmax_norm, rrf, zscore_norm
from treerank.search.run import Run

A = Run("a", np.array([[1, 2, 3]]), np.array([[3.0, 2.0, 1.0]]))
B = Run("b", np.array([[3, 4, -1]]), np.array([[10.0, 0.0, -np.inf]]))


def test_rrf_hand_values() -> None:
    f = rrf(A, B, k=10, rrf_k=60)
    expected = {1: 1 / 61, 2: 1 / 62, 3: 1 / 63 + 1 / 61, 4: 1 / 62}
    assert f.ids[0].tolist() == [3, 1, 2, 4]  # 2 and 4 tie: ascending id
    np.testing.assert_allclose(f.scores[0], [expected[i] for i in f.ids[0]], rtol=1e-6)


def test_linear_minmax_and_missing_passages() -> None:
    f = linear_fusion(A, B, k=2, weight=0.25, norm="minmax")
    # norm(a): 1 -> 1, 2 -> .5, 3 -> 0 ; norm(b): 3 -> 1, 4 -> 0 ; missing -> 0
    expected = {1: 0.25 * 1, 2: 0.25 * 0.5, 3: 0.25 * 0 + 0.75 * 1, 4: 0.0}
    assert f.ids[0].tolist() == [3, 1]
    np.testing.assert_allclose(f.scores[0], [expected[3], expected[1]], rtol=1e-6)


def test_zscore_and_minmax_kernels() -> None:
    z = zscore_norm(A)[0]
    np.testing.assert_allclose(z, [np.sqrt(1.5), 0.0, -np.sqrt(1.5)], rtol=1e-9)
    np.testing.assert_allclose(minmax_norm(B)[0], [1.0, 0.0, 0.0])
    f = linear_fusion(A, B, k=4, weight=0.5, norm="zscore")
    # b's z-scores: 3 -> 1, 4 -> -1; missing from b -> b's minimum (-1); missing from a -> a's min
    zs = {1: np.sqrt(1.5) - 1, 2: 0 - 1, 3: -np.sqrt(1.5) + 1, 4: -np.sqrt(1.5) - 1}
    got = dict(zip(f.ids[0].tolist(), f.scores[0].tolist(), strict=True))
    for pid, v in zs.items():
        assert got[pid] == pytest.approx(0.5 * v, rel=1e-6)


def test_errors() -> None:
    with pytest.raises(ValueError, match="weight"):
        linear_fusion(A, B, weight=2.0)
    with pytest.raises(ValueError, match="queries"):
        rrf(A, Run("c", np.zeros((2, 1), np.int64), np.zeros((2, 1))))


# ------------------------------------------------------------------ issue 10, item 8: no credit
# d0 "stock market", d1 "Felines" (relevant, found only by cosine), d2 "cat food"; query "cat".
# BM25 lists only its positive-score hit d2; cosine ranks d2, d1, d0.
BM25_CAT = Run("bm25", np.array([[2, -1, -1]]), np.array([[1.3, -np.inf, -np.inf]]))
COS_CAT = Run("cosine", np.array([[2, 1, 0]]), np.array([[0.6, 0.5, 0.1]]))
CAT_QRELS = Qrels(np.array([[1]]), np.array([[1]]))


def _mrr(run: Run) -> float:
    return evaluate_run(run, CAT_QRELS, ["mrr@10"]).mean["mrr@10"]


def test_cat_fixture_rrf_gives_no_rank_credit_to_unretrieved() -> None:
    f = rrf(BM25_CAT, COS_CAT, k=10)
    # d2: 1/61 + 1/61; d1: 1/62 (cosine only); d0: 1/63 (cosine only)
    assert f.ids[0].tolist() == [2, 1, 0]
    np.testing.assert_allclose(f.scores[0], [2 / 61, 1 / 62, 1 / 63], rtol=1e-6)
    assert _mrr(f) == pytest.approx(0.5)  # = cosine alone; the zero-score filler gave 0.333
    assert _mrr(COS_CAT) == pytest.approx(0.5)
    # the same fixture with BM25's old zero-score filler (d0, d1 in id order) loses d1 to d0
    filler = Run("bm25", np.array([[2, 0, 1]]), np.array([[1.3, 0.0, 0.0]]))
    assert _mrr(rrf(filler, COS_CAT, k=10)) == pytest.approx(1 / 3)


@pytest.mark.parametrize("norm", ["minmax", "zscore"])
def test_single_hit_run_does_not_give_missed_passages_the_top_score(norm: str) -> None:
    cos = Run("cosine", np.array([[1, 0, 2]]), np.array([[0.9, 0.5, 0.1]]))
    f = linear_fusion(BM25_CAT, cos, k=10, weight=0.5, norm=norm)
    got = dict(zip(f.ids[0].tolist(), f.scores[0].tolist(), strict=True))
    if norm == "minmax":
        # bm25: d2 -> 1, missing -> 0 ; cosine: d1 -> 1, d0 -> 0.5, d2 -> 0
        expected = {2: 0.5 * 1 + 0.5 * 0, 1: 0.5 * 0 + 0.5 * 1, 0: 0.5 * 0 + 0.5 * 0.5}
    else:
        # bm25: d2 -> 0, missing -> -1 ; cosine z: (0.9, 0.5, 0.1) -> (sqrt(1.5), 0, -sqrt(1.5))
        r = np.sqrt(1.5)
        expected = {2: 0.5 * 0 + 0.5 * -r, 1: 0.5 * -1 + 0.5 * r, 0: 0.5 * -1 + 0.5 * 0}
    for pid, v in expected.items():
        assert got[pid] == pytest.approx(v, rel=1e-6, abs=1e-9)
    # (before the fix, min-max gave the missed d1 BM25's top score: 0.5 * 1 + 0.5 * 1 = 1.0)


def test_query_with_no_hits_in_one_run_takes_the_other_runs_order() -> None:
    empty = Run("bm25", np.array([[-1, -1, -1]]), np.full((1, 3), -np.inf))
    for f in (
        rrf(empty, COS_CAT, k=10),
        linear_fusion(empty, COS_CAT, k=10, norm="minmax"),
        linear_fusion(empty, COS_CAT, k=10, norm="zscore"),
    ):
        assert f.ids[0].tolist() == [2, 1, 0]


def test_rrf_ranks_count_retrieved_entries_only() -> None:
    # an -inf entry (not retrieved) before a real hit must not push the hit's rank down
    a = Run("a", np.array([[5, 7]]), np.array([[-np.inf, 2.0]]))
    b = Run("b", np.array([[-1, -1]]), np.full((1, 2), -np.inf))
    f = rrf(a, b, k=10)
    assert f.ids[0].tolist()[:1] == [7]
    assert f.scores[0, 0] == pytest.approx(1 / 61)


def test_weighted_rrf_and_per_query_weights() -> None:
    two_a = Run("a", np.array([[1, 2], [1, 2]]), np.array([[2.0, 1.0], [2.0, 1.0]]))
    two_b = Run("b", np.array([[2, 1], [2, 1]]), np.array([[2.0, 1.0], [2.0, 1.0]]))
    f = rrf(two_a, two_b, k=2, weight=np.array([0.8, 0.2]))
    assert f.ids.tolist() == [[1, 2], [2, 1]]
    np.testing.assert_allclose(f.scores[0], [0.8 / 61 + 0.2 / 62, 0.8 / 62 + 0.2 / 61], rtol=1e-6)
    # w = 0.5 orders exactly like plain RRF
    plain, half = rrf(A, B, k=4), rrf(A, B, k=4, weight=0.5)
    assert plain.ids.tolist() == half.ids.tolist()
    np.testing.assert_allclose(half.scores, plain.scores / 2, rtol=1e-6)
    lin = linear_fusion(two_a, two_b, k=2, weight=np.array([1.0, 0.0]))
    assert lin.ids.tolist() == [[1, 2], [2, 1]]
    with pytest.raises(ValueError, match="weight"):
        rrf(two_a, two_b, weight=np.array([0.5, 1.5]))
