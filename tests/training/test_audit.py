"""False-negative curve on hand-built rankings with planted positives; the guard-depth rule."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.training.audit import false_negative_curve, guard_depth

# 3 queries, 5 passages; labelled positives: q0 -> {2}, q1 -> {0, 4}, q2 -> none
CAND = np.array([[2, -1], [0, 4], [1, -1]], dtype=np.int32)
LAB = np.array([[1, 0], [1, 2], [0, 0]], dtype=np.uint8)
RANKED = np.array(
    [
        [1, 2, 3, 0],  # q0: its positive at rank 2
        [0, 3, 4, -1],  # q1: positives at ranks 1 and 3; rank 4 empty
        [2, 1, 0, 3],  # q2: no positive, left out (grade-0 candidate is not a positive)
    ]
)


def test_curve_by_hand():
    c = false_negative_curve(RANKED, CAND, LAB, miner="toy", max_rate=0.4)
    assert c.n_queries == 2 and c.n_positives == 3 and c.depth == 4
    np.testing.assert_array_equal(c.hits, [1, 1, 1, 0])
    np.testing.assert_array_equal(c.slots, [2, 2, 2, 1])
    np.testing.assert_allclose(c.rate, [0.5, 0.5, 0.5, 0.0])
    np.testing.assert_allclose(c.cumulative_rate, [1 / 2, 2 / 4, 3 / 6, 3 / 7])
    np.testing.assert_allclose(c.recall, [1 / 3, 2 / 3, 1.0, 1.0])
    assert c.guard_depth == 3  # f > 0.4 up to rank 3
    assert c.residual_rate(3) == 0.0 and c.residual_rate(1) == pytest.approx(2 / 5)
    d = c.to_dict()
    assert d["guard_depth"] == 3 and d["rate_at"]["3"] == 0.5 and d["hits"] == [1, 1, 1, 0]


def test_planted_false_negative_moves_one_rank():
    base = false_negative_curve(RANKED, CAND, LAB)
    # plant: label passage 0 (rank 4 for q0) as a positive of q0
    cand = np.array([[2, 0], [0, 4], [1, -1]], dtype=np.int32)
    lab = np.array([[1, 1], [1, 2], [0, 0]], dtype=np.uint8)
    planted = false_negative_curve(RANKED, cand, lab)
    np.testing.assert_array_equal(planted.hits - base.hits, [0, 0, 0, 1])
    assert planted.n_positives == base.n_positives + 1


def test_threshold_and_query_rows():
    # threshold 2: only q1's passage 4 is a positive
    c = false_negative_curve(RANKED[1:2], CAND, LAB, relevance_threshold=2, query_rows=[1])
    np.testing.assert_array_equal(c.hits, [0, 0, 1, 0])
    with pytest.raises(ValueError, match="ranked rows"):
        false_negative_curve(RANKED, CAND, LAB, query_rows=[0])


def test_guard_depth_rule():
    assert guard_depth(np.array([0.3, 0.1, 0.01, 0.03, 0.0]), 0.02) == 4
    assert guard_depth(np.array([0.01, 0.0]), 0.02) == 0
    assert guard_depth(np.array([0.5, 0.5]), 0.02) == 2
    with pytest.raises(ValueError):
        guard_depth(np.array([0.1]), 1.5)
