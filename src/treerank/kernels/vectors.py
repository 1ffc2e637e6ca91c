"""The one normalisation rule of treerank: "cosine" means L2-normalised vectors, always.

Stores may hold vectors that are not unit length (``meta["normalized"]`` false: a Go-layout
store, an encoder without normalisation). Everything called cosine -- the ``cosine`` system, the
diagnostics' cosine baseline, the forest's hard-negative mining, the sampler's false-negative
margin guard -- normalises through :func:`l2_normalize`, so they all agree with each other on
any store (on a normalised store it changes nothing beyond float rounding).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ROW_CHUNK", "F32", "F64", "I64", "Scores", "Vecs", "l2_normalize"]

Vecs = npt.NDArray[np.float16 | np.float32 | np.float64]
"""``float (n, d)`` vectors of any float precision (ndarrays or read-only memmaps)."""
F32 = npt.NDArray[np.float32]
"""``float32`` vectors or scores."""
F64 = npt.NDArray[np.float64]
"""``float64`` sums and weights (fusion contributions, relevance-model weights)."""
Scores = npt.NDArray[np.float32 | np.float64]
"""``float32`` / ``float64`` scores."""
I64 = npt.NDArray[np.int64]
"""``int64`` ids, rows or rank keys."""

ROW_CHUNK = 65_536
"""Rows of an ``(n, d)`` array handled per block by the row-wise passes over a corpus (a model
tower over the passages, a store scan, FAISS adds, embedding copies): 96 MiB at 384 float32
dims. The one definition; every such pass imports it."""

_EPS = 1e-12


def l2_normalize(x: Vecs) -> F32:
    """Row-wise L2 normalisation.

    Args:
        x: ``float (n, d)`` vectors (any float dtype; memmaps are read, never written).

    Returns:
        ``float32 (n, d)`` unit-norm rows; an all-zero row stays all-zero (its norm is floored at
        1e-12), so it scores 0 against everything instead of NaN.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D (n, d) array, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, _EPS)).astype(np.float32, copy=False)
