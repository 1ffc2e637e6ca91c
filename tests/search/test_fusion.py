"""Fusion: RRF and normalised linear fusion on hand-computed fixtures."""

from __future__ import annotations

import numpy as np
import pytest

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
