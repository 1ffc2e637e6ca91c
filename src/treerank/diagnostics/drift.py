"""Drift between two stores of the same data: frozen vectors against a fine-tuned encoder's.

The DRT seed reads a fine-tune's effect as "drift, not damage" from a linear CKA of 0.945
between the two encoders; :func:`store_drift` gives that reading for any two stores of the same
split (``treerank drift A B``):

* linear CKA (:func:`treerank.diagnostics.cka.linear_cka`) of the query vectors, row for row,
  and of the passage vectors (on at most ``max_items`` rows of each, a seeded sample);
* nearest-neighbour overlap@k: for each query, the share of its top-``k`` passages by cosine
  in store A that are also in its top-``k`` in store B (``|A_k ∩ B_k| / k``), averaged over
  queries; 1 when the two stores rank alike, ``k / n_passages`` expected by chance.

Both are 1 for a store against itself. For DRT, :func:`slot_cka` gives the seed's other two
comparisons: the CKA of the concatenated slots and of each slot, between two sets of
``(n, k, d_s)`` slot vectors of the same items (e.g. the ``drt-e2e`` heads applied to the
frozen and to the tuned vectors, :func:`drt_slot_drift`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treerank.diagnostics.cka import linear_cka
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.storelike import StoreLike

__all__ = [
    "StoreDataMismatchError",
    "drt_slot_drift",
    "scale2_cka_table",
    "neighbour_overlap",
    "slot_cka",
    "store_drift",
]


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


def slot_cka(a_slots: np.ndarray, b_slots: np.ndarray) -> dict[str, Any]:
    """Linear CKA between two slot decompositions of the same items.

    Args:
        a_slots, b_slots: ``float (n, k, d_s)`` slot vectors, row ``r`` the same item in both
            (``k`` and ``d_s`` may differ between the two only for ``concatenated``; the
            per-slot table needs the same ``k``).

    Returns:
        ``{"concatenated": CKA of the (n, k*d_s) flattened slots, "slots": [CKA of slot i,
        i < k]}``; every value is 1 for a decomposition against itself.

    Raises:
        ValueError: not 3-D, different row counts or different ``k``.
    """
    a, b = np.asarray(a_slots, dtype=np.float64), np.asarray(b_slots, dtype=np.float64)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[1] != b.shape[1]:
        raise ValueError(
            "slot_cka needs two (n, k, d_s) arrays of the same n and k, "
            f"got {a.shape} and {b.shape}"
        )
    n, k = a.shape[:2]
    return {
        "concatenated": float(linear_cka(a.reshape(n, -1), b.reshape(n, -1))),
        "slots": [float(linear_cka(a[:, i], b[:, i])) for i in range(k)],
    }


def drt_slot_drift(
    head: Any, a: np.ndarray, b: np.ndarray, *, side: str = "passage"
) -> dict[str, Any]:
    """:func:`slot_cka` of one DRT head applied to two sets of vectors of the same items.

    Args:
        head: a :class:`~treerank.models.drt.DRTHead` (``query_slots`` / ``passage_slots``).
        a, b: ``float32 (n, d)`` vectors of the same ``n`` items from two encoders (e.g. the
            frozen store's and the tuned store's).
        side: ``query`` or ``passage`` (which decomposition of the head).

    Returns:
        :func:`slot_cka`'s dict plus ``"raw"`` (the CKA of ``a`` and ``b`` themselves),
        ``"side"`` and ``"n"``.

    Raises:
        ValueError: an unknown ``side`` or mismatched rows.
    """
    if side not in ("query", "passage"):
        raise ValueError(f"side must be 'query' or 'passage', got {side!r}")
    fn = head.query_slots if side == "query" else head.passage_slots
    xa, xb = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    if xa.shape[0] != xb.shape[0]:
        raise ValueError(f"drt_slot_drift: {xa.shape[0]} rows against {xb.shape[0]}")
    return {
        "side": side,
        "n": int(xa.shape[0]),
        "raw": float(linear_cka(xa, xb)),
        **slot_cka(fn(xa), fn(xb)),
    }


def scale2_cka_table(head: Any, frozen: StoreLike, cos_arm: StoreLike, drt_arm: StoreLike) -> dict:
    """The DRT seed's Scale-2 CKA table of one pair of runs on the same items: linear CKA of
    the raw vectors (the cosine arm's against the DRT arm's encoder, frozen against each) and
    of the DRT arm's heads applied to the cosine arm's and to the DRT arm's vectors, and to the
    frozen and to the DRT arm's vectors (:func:`drt_slot_drift`: concatenated slots and each
    slot), for the passages and for the queries.

    Args:
        head: the DRT arm's :class:`~treerank.models.drt.DRTHead`.
        frozen, cos_arm, drt_arm: three stores of the same split (the frozen store and each
            arm's re-embedded one); ``float32 (n, d)`` vectors each.

    Returns:
        ``{"passages" | "queries": {"raw_bi_vs_drt", "raw_frozen_vs_bi", "raw_frozen_vs_drt":
        float, "slots_bi_vs_drt", "slots_frozen_vs_drt": drt_slot_drift dict}}`` (``bi``: the
        cosine arm). A query tower's passages are the frozen ones, so their entries are 1.

    Raises:
        ValueError: stores of different sizes.
    """
    from treerank.diagnostics.cka import linear_cka

    out: dict[str, Any] = {}
    for side in ("passages", "queries"):
        f, b, d = (
            np.asarray(s.passages if side == "passages" else s.queries, dtype=np.float32)
            for s in (frozen, cos_arm, drt_arm)
        )
        one = "passage" if side == "passages" else "query"
        out[side] = {
            "raw_bi_vs_drt": float(linear_cka(b, d)),
            "raw_frozen_vs_bi": float(linear_cka(f, b)),
            "raw_frozen_vs_drt": float(linear_cka(f, d)),
            "slots_bi_vs_drt": drt_slot_drift(head, b, d, side=one),
            "slots_frozen_vs_drt": drt_slot_drift(head, f, d, side=one),
        }
    return out
