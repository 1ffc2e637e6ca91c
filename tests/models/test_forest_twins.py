"""Untrained twins of the forest: sign hyperplanes, k-means on bootstrap samples, random."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.forest.model import Forest, ForestConfig


def test_sign_twin_reproduces_a_hand_computed_hash() -> None:
    # two hyperplanes, the axes: class = [x0 > 0] * 1 + [x1 > 0] * 2
    cfg = ForestConfig(1, 4, 2)
    forest = Forest.from_hyperplanes(cfg, np.eye(2)[None])
    x = np.array([[0.6, 0.8], [-0.6, 0.8], [0.6, -0.8], [-0.6, -0.8], [0.99, 0.1]], np.float32)
    qc, _ = forest.query_classes(x)
    np.testing.assert_array_equal(qc[:, 0], [3, 2, 1, 0, 3])
    pc, pp = forest.passage_classes(x)  # the passage side hashes the same (nr never chosen)
    np.testing.assert_array_equal(pc[:, 0], [3, 2, 1, 0, 3])
    assert (pp > 0).all()


def test_sign_twin_of_a_seed_equals_the_bits_of_its_hyperplanes() -> None:
    cfg = ForestConfig(5, 8, 6)
    hs = Forest.hyperplanes(cfg, seed=3)
    assert hs.shape == (5, 6, 3)
    np.testing.assert_array_equal(hs, np.random.default_rng(3).standard_normal((5, 6, 3)))
    x = np.random.default_rng(0).standard_normal((50, 6)).astype(np.float32)
    qc, _ = Forest.sign_hyperplanes(cfg, seed=3).query_classes(x)
    for m in range(5):
        proj = x.astype(np.float64) @ hs[m]  # (50, 3)
        expect = sum(((proj[:, i] > 0).astype(int) << i) for i in range(3))
        np.testing.assert_array_equal(qc[:, m], expect)
    with pytest.raises(ValueError, match="power of two"):
        Forest.sign_hyperplanes(ForestConfig(2, 6, 6))


def test_kmeans_twin_puts_each_vector_with_its_nearest_centroid() -> None:
    rng = np.random.default_rng(0)
    centres = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    x = centres[rng.integers(0, 3, 300)] + 0.05 * rng.standard_normal((300, 3))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    forest = Forest.kmeans(ForestConfig(4, 3, 3), x, seed=1, sample=200)
    qc, _ = forest.query_classes(x)
    truth = np.argmax(x @ centres.T, axis=1)
    for m in range(4):
        # a perfect clustering up to the label permutation
        perm = {int(t): int(c) for t, c in zip(truth, qc[:, m], strict=True)}
        assert len(set(perm.values())) == 3
        np.testing.assert_array_equal(qc[:, m], [perm[int(t)] for t in truth])
        w = forest.query_weights[0][m].numpy()  # (d, C): centroids / s_m
        np.testing.assert_array_equal(qc[:, m], np.argmax(x @ w, axis=1))
    with pytest.raises(ValueError, match=">= C rows"):
        Forest.kmeans(ForestConfig(1, 5, 3), x[:4])


def test_random_twin_is_the_argmax_of_its_weights() -> None:
    cfg = ForestConfig(3, 4, 5)
    forest = Forest.twin("random", cfg, seed=7)
    x = np.random.default_rng(1).standard_normal((40, 5)).astype(np.float32)
    qc, _ = forest.query_classes(x)
    for m in range(3):
        np.testing.assert_array_equal(
            qc[:, m], np.argmax(x @ forest.query_weights[0][m].numpy(), 1)
        )
    assert forest.name == "forest-random"
    with pytest.raises(ValueError, match="unknown kind"):
        Forest.twin("pca", cfg)
