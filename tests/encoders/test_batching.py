"""Length-bucketed batching: hand-computed plans, permutation, budget and padding bounds."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.encoders.batching import padding_stats, plan_batches


def test_hand_plan():
    lengths = np.array([10, 9, 8, 10, 3])
    # sorted (stable) longest first: ids 0,3 (10), 1 (9), 2 (8), 4 (3)
    # budget 30 -> at most 3 rows of 10; padding 0.1 -> floor 9: 8 starts a new batch
    got = plan_batches(lengths, token_budget=30, max_batch_size=8, max_padding=0.1)
    assert [b.tolist() for b in got] == [[0, 3, 1], [2], [4]]
    assert padding_stats(lengths, got) == (30 + 8 + 3, 40)
    got = plan_batches(lengths, token_budget=100, max_batch_size=2, max_padding=0.9)
    assert [b.tolist() for b in got] == [[0, 3], [1, 2], [4]]


def test_long_item_gets_own_batch():
    got = plan_batches(np.array([500, 4, 4]), token_budget=100, max_batch_size=8)
    assert [b.tolist() for b in got] == [[0], [1, 2]]


@pytest.mark.parametrize("max_padding", [0.0, 0.1, 0.3])
def test_random_plan_is_permutation_within_bounds(max_padding):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 257, size=3000)
    plan = plan_batches(lengths, token_budget=4096, max_batch_size=64, max_padding=max_padding)
    flat = np.concatenate(plan)
    assert sorted(flat.tolist()) == list(range(3000))
    for b in plan:
        longest = lengths[b].max()
        assert len(b) <= 64 and (len(b) * longest <= 4096 or len(b) == 1)
        assert lengths[b].min() >= (1 - max_padding) * longest
    padded, real = padding_stats(lengths, plan)
    assert real == lengths.sum()
    assert 1 - real / padded <= max_padding + 1e-12


def test_bad_arguments():
    with pytest.raises(ValueError):
        plan_batches(np.array([1]), token_budget=0)
    with pytest.raises(ValueError):
        plan_batches(np.array([1]), max_padding=1.0)
    assert plan_batches(np.array([], dtype=np.int64)) == []
