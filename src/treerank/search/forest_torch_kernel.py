"""Match counting of the forest search in torch: the numba kernel's results on any torch device.

:mod:`treerank.search.forest_kernel` walks a query's inverted lists on the CPU (numba). This
module computes the same ranking with dense torch operations, so that it runs on a GPU (or, for
testing, on the CPU): the passages' class codes (the inverted lists turned back into a table,
:func:`passage_table`) are compared with the query's probed classes one model at a time, a block
of passages at a time, and the counts and secondary scores are accumulated in the numba kernel's
order, then a running top-``k`` is merged block by block.

Exactness (the same ids, counts, secondary scores and keys as the numba kernel, bit for bit):

* the secondary score is accumulated in **float64, in model order**, one model per elementwise
  step (``sec = where(hit, sec + w * float64(P_m(c|p)), sec)``), the order and the operations
  of the numba loop, so no reduction order of the device enters it;
* the key is formed as the numba kernel forms it: ``(count if count_on else 0) + sec /
  divisor`` in float64;
* the top ``k`` is a **stable** descending sort of the running top-``k`` followed by the new
  block (ids ascending within and across blocks), so equal keys rank by passage id ascending.

Multi-probe and multi-assignment follow :func:`~treerank.search.forest_kernel.count_topk_probes`:
a passage counts at most once per model, with the weight of the first (most probable) probed
class it is indexed in. Every scoring of :data:`treerank.models.forest.SCORINGS` is a choice of
the weights ``w``, ``count_on``, ``use_passage_prob`` and ``divisor`` (as for the numba kernel).

Cost: ``O(B * n * M * t * K)`` elementwise work for ``B`` queries, ``n`` passages, ``M``
models, ``t`` probes and ``K`` assignments (dense: every passage of a block is compared), against
the numba kernel's ``O(B * M * t * n / C)`` posting reads; memory ``O(B * block)`` per step plus
the ``(n, M, K)`` class table on the device. It is the GPU path, not a faster CPU path: on the
CPU the numba kernel stays the default.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["BLOCK_ELEMENTS", "count_topk_torch", "passage_table"]

BLOCK_ELEMENTS = 1 << 24
"""``B * block`` entries per accumulation step (float64 secondary + int32 count + masks:
~250 MiB at the default); the passage block is ``max(1, BLOCK_ELEMENTS // B)``. Results do not
depend on it."""


def passage_table(
    offsets: np.ndarray, ids: np.ndarray, probs: np.ndarray, n_models: int, n_classes: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """The passage-class table of CSR inverted lists (the inverse of
    :func:`treerank.search.forest_index.build_inverted_lists`).

    Args:
        offsets: ``int64 (M * C + 1,)``; list ``m * C + c`` is ``ids[offsets[l]:offsets[l+1]]``.
        ids: ``int (nnz,)`` passage ids in ``[0, n)``. probs: ``float32 (nnz,)``.
        n_models: M. n_classes: C. n: passages.

    Returns:
        ``(classes int32 (n, M, K), probs float32 (n, M, K))`` with ``K`` = the most lists of one
        model a passage is in (at least 1); ``-1`` / ``0`` in unused slots (a passage a model
        does not index has ``-1`` in every slot of that model). Slots hold a passage's classes in
        ascending order.
    """
    sizes: np.ndarray = np.diff(np.asarray(offsets, dtype=np.int64)).astype(np.int64)
    lists = np.repeat(np.arange(n_models * n_classes, dtype=np.int64), sizes)
    pid = np.asarray(ids, dtype=np.int64)
    model, cls = lists // n_classes, lists % n_classes
    cell = pid * n_models + model  # (passage, model)
    order = np.lexsort((cls, cell))  # by cell, then class
    cell, cls, pr = cell[order], cls[order], np.asarray(probs, dtype=np.float32)[order]
    first = np.r_[True, cell[1:] != cell[:-1]] if len(cell) else np.zeros(0, dtype=bool)
    start = np.flatnonzero(first)
    run = np.repeat(start, np.diff(np.r_[start, len(cell)]))
    slot = np.arange(len(cell)) - run
    kk = int(slot.max()) + 1 if len(slot) else 1
    table = np.full((n * n_models, kk), -1, dtype=np.int32)
    tprob = np.zeros((n * n_models, kk), dtype=np.float32)
    table[cell, slot] = cls
    tprob[cell, slot] = pr
    return table.reshape(n, n_models, kk), tprob.reshape(n, n_models, kk)


def count_topk_torch(
    passage_classes: Tensor,
    passage_probs: Tensor,
    query_classes: Tensor,
    list_weights: Tensor,
    k: int,
    *,
    count_on: bool = True,
    use_passage_prob: bool = True,
    divisor: float = float("inf"),
    block: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Top ``k`` passages of every query by ``key = (count if count_on else 0) + secondary /
    divisor`` descending, then passage id ascending (see the module docstring).

    Args:
        passage_classes: ``int (n, M, K)`` each passage's classes per model (``-1`` = none),
            distinct within a (passage, model) cell (:func:`passage_table`).
        passage_probs: ``float32 (n, M, K)`` the postings' ``P_m(c | p)``.
        query_classes: ``int64 (B, M, t)`` each query's probed classes per model, most probable
            first (``t = 1``: the seed's argmax class).
        list_weights: ``float64 (B, M, t)`` the weight of each probed class (``P_m(c | q)`` for
            the shipped order; :meth:`~treerank.search.forest_index.ForestIndex.search_probes`
            for the others).
        k: depth (``>= 1``).
        count_on: add the match count to the key. use_passage_prob: multiply a match's weight by
            ``P_m(c | p)``. divisor: of the secondary score (``inf``: rank by count alone;
            ``M + 1``: the shipped order).
        block: passages per step (default ``BLOCK_ELEMENTS // B``); results do not depend on it.

    All tensors on one device (the CPU or CUDA).

    Returns:
        ``(ids int64 (B, k), keys float64 (B, k), counts int32 (B, k), secondary float64 (B,
        k))`` on that device, padded with ``-1`` / ``-inf`` / ``0`` / ``0.0`` past the passages
        with at least one match.

    Raises:
        ValueError: shapes that disagree, or ``k < 1``.
    """
    n, n_models, n_assign = passage_classes.shape
    b, m_q, probe = query_classes.shape
    if m_q != n_models or tuple(list_weights.shape) != (b, m_q, probe):
        raise ValueError(
            f"count_topk_torch: passages {tuple(passage_classes.shape)}, query classes "
            f"{tuple(query_classes.shape)} and weights {tuple(list_weights.shape)} disagree"
        )
    if tuple(passage_probs.shape) != (n, n_models, n_assign):
        raise ValueError("count_topk_torch: passage classes and probs differ in shape")
    if k < 1:
        raise ValueError(f"count_topk_torch: k must be >= 1 (got {k})")
    dev = passage_classes.device
    pc = passage_classes.to(torch.int64)
    qc = query_classes.to(dev, torch.int64)
    w = list_weights.to(dev, torch.float64)
    step = max(1, block if block is not None else BLOCK_ELEMENTS // max(1, b))
    top_keys = torch.empty(b, 0, dtype=torch.float64, device=dev)
    top_ids = torch.empty(b, 0, dtype=torch.int64, device=dev)
    top_cnt = torch.empty(b, 0, dtype=torch.int32, device=dev)
    top_sec = torch.empty(b, 0, dtype=torch.float64, device=dev)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        pcb, ppb = pc[lo:hi], passage_probs[lo:hi]  # (P, M, K)
        counts = torch.zeros(b, hi - lo, dtype=torch.int32, device=dev)
        sec = torch.zeros(b, hi - lo, dtype=torch.float64, device=dev)
        for m in range(n_models):
            done: Tensor | None = None  # (B, P) already matched under model m
            for j in range(probe):
                cj = qc[:, m, j, None]  # (B, 1)
                hit: Tensor | None = None
                pp: Tensor | None = None
                for a in range(n_assign):  # a passage's classes are distinct: one slot at most
                    eq = pcb[None, :, m, a] == cj  # (B, P)
                    hit = eq if hit is None else hit | eq
                    if use_passage_prob:
                        part = torch.where(eq, ppb[None, :, m, a], 0.0)
                        pp = part if pp is None else pp + part
                assert hit is not None
                new = hit if done is None else hit & ~done
                wj = w[:, m, j, None]  # (B, 1) float64
                add = wj * pp.to(torch.float64) if pp is not None else wj
                sec = torch.where(new, sec + add, sec)
                counts += new.to(torch.int32)
                done = new if done is None else done | new
        key = sec / divisor
        if count_on:
            key = counts.to(torch.float64) + key
        key = torch.where(counts > 0, key, float("-inf"))
        ids = torch.arange(lo, hi, dtype=torch.int64, device=dev).expand(b, -1)
        # running top-k first (smaller ids), then the block: a stable sort keeps ids ascending
        all_keys = torch.cat([top_keys, key], 1)
        order = torch.sort(all_keys, dim=1, descending=True, stable=True).indices[:, :k]
        top_keys = all_keys.gather(1, order)
        top_ids = torch.cat([top_ids, ids], 1).gather(1, order)
        top_cnt = torch.cat([top_cnt, counts], 1).gather(1, order)
        top_sec = torch.cat([top_sec, sec], 1).gather(1, order)
    out_ids = torch.full((b, k), -1, dtype=torch.int64, device=dev)
    out_keys = torch.full((b, k), float("-inf"), dtype=torch.float64, device=dev)
    out_cnt = torch.zeros(b, k, dtype=torch.int32, device=dev)
    out_sec = torch.zeros(b, k, dtype=torch.float64, device=dev)
    got = top_ids.shape[1]
    valid = top_cnt > 0
    out_ids[:, :got] = torch.where(valid, top_ids, -1)
    out_keys[:, :got] = torch.where(valid, top_keys, float("-inf"))
    out_cnt[:, :got] = torch.where(valid, top_cnt, 0)
    out_sec[:, :got] = torch.where(valid, top_sec, 0.0)
    return out_ids, out_keys, out_cnt, out_sec
