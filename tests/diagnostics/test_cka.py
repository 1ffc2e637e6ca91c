"""Linear CKA (Kornblith et al., 2019) on fixtures."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from treerank.diagnostics.cka import linear_cka


def _x(n: int = 200, d: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


def test_identical_is_one() -> None:
    x = _x()
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_invariant_to_orthogonal_transform_and_isotropic_scaling() -> None:
    x = _x()
    y = _x(seed=1)[:, :8] + 0.5 * x[:, :8]  # partially related, so the value is not trivial
    base = linear_cka(x, y)
    assert 0.05 < base < 0.95
    rot = ortho_group.rvs(16, random_state=3)
    assert linear_cka(x @ rot, y) == pytest.approx(base, abs=1e-10)
    assert linear_cka(x, 7.5 * y) == pytest.approx(base, abs=1e-10)
    assert linear_cka(3.0 * x @ rot, 0.1 * y) == pytest.approx(base, abs=1e-10)
    assert linear_cka(x @ rot, x) == pytest.approx(1.0, abs=1e-10)
    # ... but not to arbitrary (anisotropic) scaling
    scale = np.diag(np.linspace(0.1, 10, 16))
    assert abs(linear_cka(x @ scale, x) - 1.0) > 0.05


def test_independent_random_is_near_zero() -> None:
    x, y = _x(n=5000, d=8, seed=10), _x(n=5000, d=8, seed=11)
    assert linear_cka(x, y) < 0.01


def test_hand_value_and_both_code_paths() -> None:
    # 1-d each side: CKA = squared Pearson correlation.
    x = np.array([[1.0], [2.0], [3.0], [4.0]])
    y = np.array([[1.0], [3.0], [2.0], [5.0]])
    r = np.corrcoef(x[:, 0], y[:, 0])[0, 1]
    assert linear_cka(x, y) == pytest.approx(r**2, abs=1e-12)
    # n < d uses the Gram form; it must agree with the feature-space form
    a, b = _x(n=10, d=30, seed=4), _x(n=10, d=5, seed=5)
    xa, xb = a - a.mean(0), b - b.mean(0)
    feat = np.sum((xb.T @ xa) ** 2) / (np.linalg.norm(xa.T @ xa) * np.linalg.norm(xb.T @ xb))
    assert linear_cka(a, b) == pytest.approx(feat, rel=1e-10)


def test_errors() -> None:
    with pytest.raises(ValueError, match="row counts"):
        linear_cka(_x(n=5), _x(n=6))
    assert np.isnan(linear_cka(np.ones((5, 2)), _x(n=5)))
