"""Linear CKA between two representations of the same items (Kornblith et al., 2019).

``CKA(X, Y) = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F * ||Yc^T Yc||_F)`` with ``Xc``, ``Yc`` the
column-centred matrices (Kornblith, Norouzi, Lee, Hinton: "Similarity of Neural Network
Representations Revisited", ICML 2019, eq. for linear HSIC in feature space). It is 1 for
identical representations, invariant to orthogonal transforms and isotropic scaling of either
side (not to arbitrary invertible linear maps), and near 0 for independent ones when
``n >> dims``. The two sides may have different widths.

In the DRT seed's diagnostic procedure, high CKA between a trained head and the frozen baseline
means the head *drifted* the geometry slightly rather than damaging it.
"""

from __future__ import annotations

import numpy as np


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two representations of the same ``n`` items.

    Args:
        x: ``(n, d1)`` representation (any float dtype; computed in float64).
        y: ``(n, d2)`` representation of the same ``n`` items, row for row.

    Returns:
        CKA in ``[0, 1]``; ``nan`` when either side is constant (zero variance).

    Raises:
        ValueError: not 2-D, different row counts, or fewer than 2 rows.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"linear_cka needs 2-D arrays, got shapes {x.shape} and {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"linear_cka: row counts differ ({x.shape[0]} vs {y.shape[0]})")
    if x.shape[0] < 2:
        raise ValueError("linear_cka needs at least 2 rows")
    x = x - x.mean(axis=0, keepdims=True)
    y = y - y.mean(axis=0, keepdims=True)
    if x.shape[0] < max(x.shape[1], y.shape[1]):  # n small: Gram (n x n) form is cheaper
        kx, ky = x @ x.T, y @ y.T
        hsic_xy = float(np.sum(kx * ky))
        hsic_xx = float(np.sum(kx * kx))
        hsic_yy = float(np.sum(ky * ky))
    else:
        hsic_xy = float(np.sum((y.T @ x) ** 2))
        hsic_xx = float(np.sum((x.T @ x) ** 2))
        hsic_yy = float(np.sum((y.T @ y) ** 2))
    denom = np.sqrt(hsic_xx) * np.sqrt(hsic_yy)
    if denom <= 0.0:
        return float("nan")
    return float(hsic_xy / denom)
