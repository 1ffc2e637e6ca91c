"""Forest diagnostics against hand-computed collisions."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.forest.diagnostics import collisions, forest_diagnostics, vote_correlation
from treerank.forest.model import Forest, ForestConfig, ForestSearch


def test_collisions_hand_fixture_sign_twin() -> None:
    # class = [x0 > 0] + 2 [x1 > 0] under the one model
    forest = Forest.from_hyperplanes(ForestConfig(1, 4, 2), np.eye(2)[None])
    q = np.array([[1, 1], [1, 1], [-1, 1]], np.float32)
    p = np.array([[2, 3], [1, -1], [1, 1]], np.float32)
    np.testing.assert_array_equal(collisions(forest, q, p)[:, 0], [True, False, False])


def test_identical_models_have_vote_correlation_one_and_probe_raises_collisions() -> None:
    cfg = ForestConfig(3, 8, 6)
    base = Forest.random(ForestConfig(1, 8, 6), seed=1)
    same = Forest(
        cfg,
        [w.repeat(3, 1, 1) for w in base.query_weights],
        [b.repeat(3, 1) for b in base.query_biases],
        [w.repeat(3, 1, 1) for w in base.passage_weights],
        [b.repeat(3, 1) for b in base.passage_biases],
    )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((200, 6)).astype(np.float32)
    p = (q + 0.3 * rng.standard_normal((200, 6))).astype(np.float32)
    pairs = np.stack([np.arange(200), np.arange(200)], 1)
    d = forest_diagnostics(same, q, p, pairs)
    assert d["vote_correlation_relevant"] == pytest.approx(1.0)
    assert d["collision_relevant_mean"] > 2 * d["collision_random_mean"]
    d2 = forest_diagnostics(same.with_search(ForestSearch(probe=3)), q, p, pairs)
    assert d2["collision_relevant_mean"] >= d["collision_relevant_mean"]
    assert vote_correlation(np.array([[1, 0], [0, 1], [1, 0]])) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="pairs must be"):
        forest_diagnostics(same, q, p, np.zeros((0, 2)))


def test_balance_stats_and_report_carry_the_diagnostics() -> None:
    from treerank.forest.index import ForestSystem, forest_report

    rng = np.random.default_rng(0)

    class Store:
        passages = rng.standard_normal((60, 6)).astype(np.float32)
        queries = (passages[:20] + 0.2 * rng.standard_normal((20, 6))).astype(np.float32)
        candidates = np.arange(20, dtype=np.int32)[:, None]
        labels = np.ones((20, 1), dtype=np.uint8)
        relevance_threshold = 1

        def iter_passage_chunks(self, size):
            yield 0, self.passages

    forest = Forest.random(ForestConfig(4, 4, 6), seed=0)
    system = ForestSystem(forest)
    system.retrieve(Store(), 10)
    dg = system.balance_stats()["diagnostics"]
    ref = forest_diagnostics(
        forest, Store.queries, Store.passages, np.stack([np.arange(20)] * 2, 1)
    )
    assert dg["collision_relevant_mean"] == pytest.approx(ref["collision_relevant_mean"])
    assert "x) |" in forest_report({"f": system})["markdown"]
