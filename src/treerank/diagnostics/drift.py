"""Drift between two stores of the same data: frozen vectors against a fine-tuned encoder's.

The DRT seed reads a fine-tune's effect as "drift, not damage" from a linear CKA of 0.945
between the two encoders; :func:`store_drift` gives that reading for any two stores of the same
split (``treerank drift A B``):

* linear CKA (:func:`treerank.diagnostics.cka.linear_cka`) of the query vectors, row for row,
  and of the passage vectors (on at most ``max_items`` rows of each, a seeded sample);
* nearest-neighbour overlap@k: for each query, the share of its top-``k`` passages by cosine
  in store A that are also in its top-``k`` in store B (``|A_k ∩ B_k| / k``), averaged over
  queries; 1 when the two stores rank alike, ``k / n_passages`` expected by chance.

Both are 1 for a store against itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treerank.diagnostics.cka import linear_cka
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.storelike import StoreLike

__all__ = ["StoreDataMismatchError", "neighbour_overlap", "store_drift"]


class StoreDataMismatchError(ValueError):
    """Two stores compared item by item hold different data; the message names both."""


def neighbour_overlap(a_ids: np.ndarray, b_ids: np.ndarray) -> np.ndarray:
    """Per-row overlap of two top-k id lists: ``float64 (n,)`` in ``[0, 1]``.

    Args:
        a_ids, b_ids: ``int (n, k)`` ids per row (``-1`` padding is never counted).

    Raises:
        ValueError: different shapes.
    """
    a, b = np.asarray(a_ids), np.asarray(b_ids)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"neighbour_overlap needs two (n, k) arrays, got {a.shape} and {b.shape}")
    k = a.shape[1]
    if k == 0:
        return np.zeros(a.shape[0])
    hit = (a[:, :, None] == b[:, None, :]) & (a[:, :, None] >= 0)
    return hit.any(axis=2).sum(axis=1) / float(k)


def _sample(n: int, max_items: int | None, seed: int) -> np.ndarray:
    if max_items is None or n <= max_items:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_items, replace=False))


def store_drift(
    a: StoreLike,
    b: StoreLike,
    *,
    k: int = 10,
    passages: bool = True,
    max_items: int | None = 20_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Linear CKA and neighbour overlap@k between two stores of the same split.

    Args:
        a, b: store splits of the same data (same ``data_sha256`` in ``meta.json``).
        k: neighbours compared per query.
        passages: also compute the passages' CKA (skip it when ``b`` copied ``a``'s passage
            vectors, e.g. a query tower: it is 1 by construction).
        max_items: rows per CKA at most (a seeded sample; None: all).
        seed: the sample's seed.

    Returns:
        ``{"k", "n_queries", "n_passages", "cka_queries", "cka_passages" (or None),
        "overlap_at_k", "overlap_chance", "a", "b"}``.

    Raises:
        StoreDataMismatchError: the stores hold different data or different row counts.
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    da, db = a.meta.get("data_sha256"), b.meta.get("data_sha256")
    if da != db or a.n_queries != b.n_queries or a.n_passages != b.n_passages:
        raise StoreDataMismatchError(
            f"drift compares the same items: {a.path} holds data {str(da)[:19]}... "
            f"({a.n_queries} queries, {a.n_passages} passages), {b.path} holds "
            f"{str(db)[:19]}... ({b.n_queries} queries, {b.n_passages} passages)"
        )
    nq, npas = int(a.n_queries), int(a.n_passages)
    qa = np.asarray(a.queries, dtype=np.float32)
    qb = np.asarray(b.queries, dtype=np.float32)
    rows = _sample(nq, max_items, seed)
    cka_q = linear_cka(qa[rows], qb[rows])
    cka_p = None
    if passages:
        prow = _sample(npas, max_items, seed + 1)
        cka_p = linear_cka(np.asarray(a.passages)[prow], np.asarray(b.passages)[prow])
    kk = min(k, npas)
    ids_a, _ = exact_search(l2_normalize(qa), a.passages, k=kk, passage_transform=l2_normalize)
    ids_b, _ = exact_search(l2_normalize(qb), b.passages, k=kk, passage_transform=l2_normalize)
    overlap = neighbour_overlap(ids_a, ids_b)
    return {
        "k": kk,
        "n_queries": nq,
        "n_passages": npas,
        "cka_queries": float(cka_q),
        "cka_passages": None if cka_p is None else float(cka_p),
        "overlap_at_k": float(overlap.mean()) if overlap.size else float("nan"),
        "overlap_chance": kk / npas if npas else float("nan"),
        "a": str(a.path),
        "b": str(b.path),
    }
