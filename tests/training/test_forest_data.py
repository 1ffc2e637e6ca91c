"""Forest training data: per-pair seeds and draws."""

from __future__ import annotations

import numpy as np

from treerank.training.forest_data import pair_seed


def test_pair_seed_draws_do_not_depend_on_the_group() -> None:
    a = np.random.default_rng(pair_seed(0, 5)).integers(1 << 30, size=4)
    b = np.random.default_rng(pair_seed(0, 5)).integers(1 << 30, size=4)
    c = np.random.default_rng(pair_seed(0, 6)).integers(1 << 30, size=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
