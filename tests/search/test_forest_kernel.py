"""The forest's one counting kernel (``treerank.forest.kernel.count_topk``) on a hand-computed
fixture: the seed's rule (one list per model, its fast path) and several probed lists per model
(a passage counted once per model, with its first list's weight)."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.forest.kernel import count_topk

# 2 models x 2 classes = 4 lists (list = m * 2 + c); 4 passages.
#   list 0 (m0 c0): p0 (0.5), p1 (0.25)      list 1 (m0 c1): p1 (0.5), p2 (1.0)
#   list 2 (m1 c0): p0 (1.0)                 list 3 (m1 c1): p0 (0.5), p3 (0.75)
OFFSETS = np.array([0, 2, 4, 5, 7], dtype=np.int64)
IDS = np.array([0, 1, 1, 2, 0, 0, 3], dtype=np.int32)
PROBS = np.array([0.5, 0.25, 0.5, 1.0, 1.0, 0.5, 0.75], dtype=np.float32)


def _run(lists, weights, probe, k, count_on=True, use_pp=True, divisor=3.0, block=16384):
    return count_topk(
        OFFSETS,
        IDS,
        PROBS,
        np.array(lists, dtype=np.int64),
        np.array(weights, dtype=np.float64),
        probe,
        4,
        k,
        count_on,
        use_pp,
        divisor,
        1,
        block,
    )


@pytest.mark.parametrize("block", [1, 2, 16384])  # results independent of the id block
def test_the_seed_rule_by_hand(block: int) -> None:
    # query: model 0 -> class 0 (P = 0.5), model 1 -> class 1 (P = 0.25); M + 1 = 3
    ids, keys, counts, sec, scanned = _run([[0, 3]], [[0.5, 0.25]], 1, 4, block=block)
    # p0: both models, sec = 0.5*0.5 + 0.25*0.5 = 0.375, key = 2 + 0.125
    # p3: model 1, sec = 0.25*0.75 = 0.1875, key = 1 + 0.0625
    # p1: model 0, sec = 0.5*0.25 = 0.125, key = 1 + 0.041666...
    assert ids.tolist() == [[0, 3, 1, -1]]
    assert counts.tolist() == [[2, 1, 1, 0]]
    assert sec.tolist() == [[0.375, 0.1875, 0.125, 0.0]]
    assert keys[0, :3].tolist() == [2.125, 1.0625, 1.0 + 0.125 / 3.0]
    assert keys[0, 3] == -np.inf and scanned.tolist() == [4]


def test_probed_lists_count_a_passage_once_per_model_with_its_first_weight() -> None:
    # t = 2: model 0 probes class 1 (w 0.6) then class 0 (w 0.4); model 1 class 0 then class 1
    lists = [[1, 0, 2, 3]]
    w = [[0.6, 0.4, 0.3, 0.2]]
    ids, keys, counts, sec, scanned = _run(lists, w, 2, 3, count_on=True, use_pp=False, divisor=1.0)
    # p1 is in lists 1 and 0 (model 0): counted once, weight 0.6 -> count 1, sec 0.6
    # p0: list 0 (model 0, w 0.4), lists 2 and 3 (model 1: first w 0.3) -> count 2, sec 0.7
    # p2: list 1 (w 0.6) -> count 1, sec 0.6; p3: list 3 (w 0.2) -> count 1, sec 0.2
    assert ids.tolist() == [[0, 1, 2]]  # p1 and p2 tie at 1.6: ids ascending
    assert counts.tolist() == [[2, 1, 1]]
    np.testing.assert_allclose(sec, [[0.7, 0.6, 0.6]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(keys, [[2.7, 1.6, 1.6]], rtol=0, atol=1e-15)
    assert scanned.tolist() == [7]
    # divisor inf ranks by count alone (ties by id)
    ids, keys, *_ = _run(lists, w, 2, 4, divisor=np.inf)
    assert ids.tolist() == [[0, 1, 2, 3]] and keys.tolist() == [[2.0, 1.0, 1.0, 1.0]]


def test_the_fast_path_equals_the_general_path() -> None:
    """t = 1 through the fast path against the same lists with a never-matching second probe
    (an empty list stands in: t = 2 takes the general path)."""
    offsets = np.concatenate([OFFSETS, [OFFSETS[-1]]])  # list 4: empty
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.integers(0, 2, size=(3, 2))
        lists = q + np.array([0, 2])
        w = rng.random((3, 2))
        fast = count_topk(OFFSETS, IDS, PROBS, lists, w, 1, 4, 4, True, True, 3.0, 2, 2)
        two = np.stack([lists[:, 0], np.full(3, 4), lists[:, 1], np.full(3, 4)], axis=1)
        w2 = np.stack([w[:, 0], w[:, 0], w[:, 1], w[:, 1]], axis=1)
        general = count_topk(offsets, IDS, PROBS, two, w2, 2, 4, 4, True, True, 3.0, 2, 2)
        for a, b in zip(fast[:4], general[:4], strict=True):
            np.testing.assert_array_equal(a, b)
