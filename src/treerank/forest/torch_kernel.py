"""Match counting of the forest search in torch: the numba kernel's results on any torch device.

:mod:`treerank.forest.kernel` walks a query's inverted lists on the CPU (numba). This
module computes the same ranking with torch gathers and scatters, so that it runs on a GPU (or,
for testing, on the CPU), with the same work: a block of queries at a time, their lists are
walked **one list position at a time across the block** (model by model, probe by probe): the
postings of every query's ``j``-th list are gathered from the CSR arrays at once and scattered
into the block's ``(B, n)`` counters, then the block's top ``k`` is taken.

Exactness (the same ids, counts, secondary scores and keys as the numba kernel, bit for bit):

* a (query, passage) counter receives at most one update per model (a passage is in a list at
  most once; with several probes the first probed list of a model that holds the passage counts,
  as in the numba kernel, through a ``last model`` mark), and models are processed in ascending
  order, so the float64 secondary score is accumulated **in model order** with the numba
  kernel's operations, ``sec = sec + w * float64(P_m(c|p))``: no reduction order of the device
  enters it;
* the key is formed as the numba kernel forms it: ``(count if count_on else 0) + sec /
  divisor`` in float64;
* the top ``k`` is the ``k`` largest keys with ties by passage id ascending: the exact ``k``-th
  largest key from ``torch.topk``, every key above it and the lowest ids at it, then a stable
  sort of those ``k`` by key; passages with no match are not retrieved (``-1`` padding).

Every scoring of :data:`treerank.forest.model.SCORINGS` is a choice of the list weights ``w``,
``count_on``, ``use_passage_prob`` and ``divisor``, as for the numba kernel.

Cost: the postings of the query's lists (``~B * M * t * n / C``, as the numba kernel) plus a
``(B, n)`` float64 + int32 counter block and its top-``k`` selection per query block, in
``M * t`` gather/scatter steps per block (kernel launches on a GPU), so large query blocks pay:
a block holds ``block_elements // n`` queries (default :func:`default_block_elements`: 16M
entries on the CPU, a fifth of the free memory at ~40 bytes an entry on a GPU). On the CPU the
numba kernel stays the default (it keeps its counters in cache; this one is the GPU path, run
on the CPU by the tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["CPU_BLOCK_ELEMENTS", "count_topk_torch", "default_block_elements"]

CPU_BLOCK_ELEMENTS = 1 << 24
"""``B * n`` counter entries per query block on the CPU (~650 MiB with the sort)."""
BYTES_PER_ENTRY = 40
"""float64 secondary + int32 count + int32 mark + float64 key + int64 tie rank."""


def default_block_elements(device: torch.device) -> int:
    """Counter entries per query block: :data:`CPU_BLOCK_ELEMENTS` on the CPU; on a GPU a fifth
    of its free memory at :data:`BYTES_PER_ENTRY` bytes an entry (at least 16M)."""
    if device.type != "cuda":
        return CPU_BLOCK_ELEMENTS
    free, _ = torch.cuda.mem_get_info(device)
    return max(CPU_BLOCK_ELEMENTS, int(free) // (5 * BYTES_PER_ENTRY))


def _topk_by_key_then_id(key: Tensor, k: int) -> Tensor:
    """``int64 (B, k)`` columns of the ``k`` largest entries of ``key float64 (B, n)`` per row,
    by key descending then column ascending (``k <= n``), without sorting the whole row.

    ``torch.topk`` gives the exact ``k``-th largest value ``v`` (its order among ties is not
    defined, so only the value is used); every entry ``> v`` is taken, and the first entries
    ``== v`` by column fill the rest; the ``k`` taken columns (ascending) are then sorted by key
    with a stable sort, so ties keep ascending columns (the reference's selection, ``tests``).
    """
    kth = torch.topk(key, k, dim=1).values[:, -1:]  # (B, 1)
    gt = key > kth
    eq = key == kth
    need = k - gt.sum(1, keepdim=True)
    take = gt | (eq & (torch.cumsum(eq.to(torch.int64), 1) <= need))
    cols = take.nonzero()[:, 1].view(key.shape[0], k)  # row-major: columns ascending
    order = torch.sort(key.gather(1, cols), dim=1, descending=True, stable=True).indices
    return cols.gather(1, order)


def count_topk_torch(
    offsets: Tensor,
    ids: Tensor,
    probs: Tensor,
    query_lists: Tensor,
    list_weights: Tensor,
    probe: int,
    n_passages: int,
    k: int,
    *,
    count_on: bool = True,
    use_passage_prob: bool = True,
    divisor: float = float("inf"),
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Top ``k`` passages of every query by ``key = (count if count_on else 0) + secondary /
    divisor`` descending, then passage id ascending (the torch twin of
    :func:`treerank.forest.kernel.count_topk_probes`; see the module docstring).

    Args:
        offsets: ``int64 (M * C + 1,)`` CSR offsets of the inverted lists.
        ids: ``int (nnz,)`` passage ids, each at most once per list. probs: ``float32 (nnz,)``
            the postings' ``P_m(c | p)``.
        query_lists: ``int64 (B, M * t)`` model-major probed lists (``m * C + c``; ``[b, m * t
            + j]`` is model ``m``'s ``j``-th probed class, the most probable first).
        list_weights: ``float64 (B, M * t)`` the weight of each probed list (``P_m(c | q)`` for
            the shipped order).
        probe: t. n_passages: ``n``, ids lie in ``[0, n)``. k: depth (``>= 1``).
        count_on: add the match count to the key. use_passage_prob: multiply a match's weight by
            ``P_m(c | p)``. divisor: of the secondary score (``inf``: rank by count alone;
            ``M + 1``: the shipped order).
        block_elements: ``B * n`` counter entries per query block (default
            :func:`default_block_elements`); results do not depend on it.

    All tensors on one device (the CPU or CUDA).

    Returns:
        ``(ids int64 (B, k), keys float64 (B, k), counts int32 (B, k), secondary float64 (B,
        k))`` on that device, padded with ``-1`` / ``-inf`` / ``0`` / ``0.0`` past the passages
        with at least one match.

    Raises:
        ValueError: shapes that disagree, ``probe`` not dividing the lists, or ``k < 1``.
    """
    b_all, n_lists = query_lists.shape
    if tuple(list_weights.shape) != (b_all, n_lists):
        raise ValueError(
            f"count_topk_torch: query lists {tuple(query_lists.shape)} and weights "
            f"{tuple(list_weights.shape)} differ"
        )
    if probe < 1 or n_lists % probe:
        raise ValueError(f"count_topk_torch: probe {probe} does not divide {n_lists} lists")
    if k < 1:
        raise ValueError(f"count_topk_torch: k must be >= 1 (got {k})")
    dev = ids.device
    n = int(n_passages)
    budget = block_elements if block_elements is not None else default_block_elements(dev)
    rows = max(1, min(max(b_all, 1), budget // max(1, n)))
    out_ids = torch.full((b_all, k), -1, dtype=torch.int64, device=dev)
    out_keys = torch.full((b_all, k), float("-inf"), dtype=torch.float64, device=dev)
    out_cnt = torch.zeros(b_all, k, dtype=torch.int32, device=dev)
    out_sec = torch.zeros(b_all, k, dtype=torch.float64, device=dev)
    if n == 0 or b_all == 0:
        return out_ids, out_keys, out_cnt, out_sec
    offsets = offsets.to(dev, torch.int64)
    probs = probs.to(dev)
    kk = min(k, n)
    for r0 in range(0, b_all, rows):
        r1 = min(b_all, r0 + rows)
        b = r1 - r0
        ql = query_lists[r0:r1].to(dev, torch.int64)
        wl = list_weights[r0:r1].to(dev, torch.float64)
        counts = torch.zeros(b * n, dtype=torch.int32, device=dev)
        sec = torch.zeros(b * n, dtype=torch.float64, device=dev)
        last = torch.full((b * n,), -1, dtype=torch.int32, device=dev) if probe > 1 else None
        base = torch.arange(b, dtype=torch.int64, device=dev) * n
        for j in range(n_lists):  # model-major: models in ascending order
            start = offsets[ql[:, j]]
            size = offsets[ql[:, j] + 1] - start  # (B,)
            total = int(size.sum())
            if total == 0:
                continue
            owner = torch.repeat_interleave(
                torch.arange(b, device=dev), size, output_size=total
            )  # (T,) the query of each posting
            first = torch.cumsum(size, 0) - size
            pos = torch.arange(total, device=dev) - first[owner] + start[owner]
            cells = base[owner] + ids[pos].to(torch.int64)  # distinct within one list
            if last is not None:  # a passage counts once per model: its first probed list
                model = j // probe
                fresh = last[cells] != model
                cells, owner, pos = cells[fresh], owner[fresh], pos[fresh]
                last[cells] = model
            w = wl[owner, j]
            add = w * probs[pos].to(torch.float64) if use_passage_prob else w
            sec[cells] = sec[cells] + add
            counts[cells] = counts[cells] + 1
        key = sec / divisor
        if count_on:
            key = counts.to(torch.float64) + key
        key = torch.where(counts > 0, key, float("-inf")).view(b, n)
        order = _topk_by_key_then_id(key, kk)
        top_cnt = counts.view(b, n).gather(1, order)
        hit = top_cnt > 0
        out_ids[r0:r1, :kk] = torch.where(hit, order, -1)
        out_keys[r0:r1, :kk] = torch.where(hit, key.gather(1, order), float("-inf"))
        out_cnt[r0:r1, :kk] = torch.where(hit, top_cnt, 0)
        out_sec[r0:r1, :kk] = torch.where(hit, sec.view(b, n).gather(1, order), 0.0)
    return out_ids, out_keys, out_cnt, out_sec
