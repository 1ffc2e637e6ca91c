"""Capacity-bounded multi-assignment of items to classes (power-of-K-choices), compiled.

Used by the forest's multi-assignment index (:func:`treerank.forest.index.assign_passages`)
and by IRLI re-partitioning (:mod:`treerank.forest.repartition`).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def assign_capacity(
    probs: np.ndarray, n_assign: int, capacity: int, nr_threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-assignment of one model's passages under a per-class capacity (power-of-K-choices,
    the greedy of IRLI, Gupta et al. 2021, arXiv 2103.09944).

    Passages whose ``P(not retrievable) > nr_threshold`` are not indexed. The others choose in
    order of their best real-class probability (most confident first, ties by id); each takes
    its ``n_assign`` most probable real classes that still have room (falling back down its own
    ranking when one is full; ties by class), so no list exceeds ``capacity``. A passage gets
    fewer than ``n_assign`` classes only when fewer classes have room.

    Args:
        probs: ``float32 (n, C + 1)`` passage-model softmax (last column = not retrievable).
        n_assign: K (``1 <= K <= C``). capacity: passages per class (``>= 1``).
        nr_threshold: the model's not-retrievable threshold.

    Returns:
        ``(classes int32 (n, K), probs float32 (n, K))``, ``-1`` / ``0`` where unassigned;
        each row's classes in the passage's own descending order.
    """
    n, width = probs.shape
    c = width - 1
    out_c = np.full((n, n_assign), -1, dtype=np.int32)
    out_p = np.zeros((n, n_assign), dtype=np.float32)
    best = np.empty(n, dtype=np.float64)
    for i in range(n):
        b = -1.0
        for j in range(c):
            if probs[i, j] > b:
                b = probs[i, j]
        best[i] = b
    order = np.argsort(-best, kind="mergesort")
    load = np.zeros(c, dtype=np.int64)
    for r in range(n):
        i = order[r]
        if probs[i, c] > nr_threshold:
            continue
        pref = np.argsort(-probs[i, :c], kind="mergesort")
        got = 0
        for j in range(c):
            cls = pref[j]
            if load[cls] < capacity:
                out_c[i, got] = cls
                out_p[i, got] = probs[i, cls]
                load[cls] += 1
                got += 1
                if got == n_assign:
                    break
    return out_c, out_p
