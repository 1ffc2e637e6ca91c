"""IRLI re-partitioning: the objective decreases, capacity holds, the index follows the table."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.models.forest import Forest, ForestConfig
from treerank.search.forest_index import ForestIndex
from treerank.training.forest_repartition import repartition


def _fixture(seed=0, n=300, nq=200, d=12):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n, d)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    pos_p = rng.integers(0, n // 2, size=nq)  # half the passages are cited
    q = p[pos_p] + 0.4 * rng.standard_normal((nq, d)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q, np.arange(nq), pos_p, p


def test_repartition_decreases_its_objective_and_respects_capacity() -> None:
    q, pos_q, pos_p, p = _fixture()
    forest = Forest.random(ForestConfig(4, 8, 12), seed=0)
    out = repartition(forest, q, pos_q, pos_p, p, rounds=3, steps=15, assign=2, group_size=2)
    hist = np.asarray(out.objective)
    assert hist[-1, 1] < hist[0, 0] < out.objective_initial + 1.0
    assert hist[-1, 1] < out.objective_initial
    assert np.all(hist[:, 1] <= hist[:, 0] + 1e-6)  # each training step lowers J
    cap = int(np.ceil(1.2 * 2 * 300 / 8))
    assert ForestIndex.build(out.classes, out.probs, 8).list_sizes().max() <= cap
    assert (out.classes >= 0).all()
    # a passage no training query cites is assigned by its own vector through the query model
    uncited = np.setdiff1d(np.arange(300), pos_p)
    own, _ = out.forest.passage_classes(p[uncited])
    agree = (out.classes[uncited, :, 0] == own).mean()
    assert agree > 0.5  # capacity may move some


def test_repartition_bad_pairs_raise() -> None:
    q, pos_q, pos_p, p = _fixture()
    forest = Forest.random(ForestConfig(2, 4, 12), seed=0)
    with pytest.raises(ValueError, match="rounds >= 1"):
        repartition(forest, q, pos_q[:0], pos_p[:0], p)
    with pytest.raises(ValueError, match="out of range"):
        repartition(forest, q, pos_q, pos_p + 1000, p)
