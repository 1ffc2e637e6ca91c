"""Sharded exact search: each rank streams a contiguous passage shard, the top-k are merged.

Rank ``r`` of ``W`` searches rows ``[lo_r, hi_r)`` of the memory-mapped passage file
(:func:`~treerank.distributed.context.shard_bounds`: contiguous, in rank order), so it only
ever touches its ``1/W`` of the corpus (the pages of other shards are never read). Its local
top-``k`` ids are shifted by ``lo_r`` to store rows and turned into the
:func:`~treerank.kernels.topk.rank_keys` of the one-process search (score descending, then
passage id ascending, in one int64). The ranks all-gather their keys block of queries by block
of queries and keep the ``k`` smallest keys of the union: the keys are a total order without
duplicates, so the global top-``k`` is contained in the union of the shard top-``k`` lists and
the merged ranking equals the one-process ranking exactly, ties included (a tie at the
``k``-th position is resolved by passage id, whichever shard holds the passages).

Per rank: the one-process search's memory for a ``1/W`` corpus, plus the gathered keys of one
query block (``W * block * k * 8`` bytes, about 32 MiB by default). Every rank returns the merged
run (the queries are small, every rank holds them all).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from treerank.distributed.context import DistContext, shard_bounds
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import (
    DEFAULT_QUERY_BATCH,
    RUN_DEPTH,
    decode_keys,
    exact_search,
    rank_keys,
)
from treerank.kernels.vectors import F32, I64, Vecs

__all__ = ["GATHER_BYTES", "sharded_exact_search"]

GATHER_BYTES = 32 * 2**20
"""Bytes of gathered keys per query block (all ranks together)."""


def sharded_exact_search(
    queries: Vecs,
    passages: Vecs,
    k: int = RUN_DEPTH,
    *,
    ctx: DistContext | None = None,
    chunk_size: int | None = None,
    passage_transform: Callable[[F32], Vecs] | None = None,
    progress: bool = False,
    query_batch: int | None = None,
    backend: str = "faiss",
    device: Device = DEFAULT_DEVICE,
) -> tuple[I64, F32]:
    """:func:`treerank.kernels.topk.exact_search` over ``W`` ranks (same arguments and result).

    Args:
        queries: ``float32 (nq, d')`` query search vectors, the same on every rank.
        passages: ``(n_passages, d)`` stored passage vectors (a read-only memmap: each rank
            reads only its shard).
        k: results per query, clipped to ``n_passages``.
        ctx: the process group whose rank picks the shard
            (:func:`~treerank.distributed.context.launch` / ``current()``); None runs the
            one-process search. Given as an argument: no process-global state is read.
        chunk_size, passage_transform, query_batch, backend, device: as ``exact_search``
            (``device="cuda"`` is ``cuda:LOCAL_RANK`` on each rank).
        progress: a bar on rank 0 (the local search and the merge).

    Returns:
        ``(ids int64 (nq, k'), scores float32 (nq, k'))``, ``k' = min(k, n_passages)``, equal to
        the one-process result (scores descending, ties by ascending passage id).

    Raises:
        ValueError: as ``exact_search``.
    """
    qb = query_batch or DEFAULT_QUERY_BATCH
    if ctx is None:
        return exact_search(
            queries,
            passages,
            k,
            chunk_size=chunk_size,
            passage_transform=passage_transform,
            progress=progress,
            query_batch=qb,
            backend=backend,
            device=device,
        )
    cpu = ctx.cpu()
    q = np.ascontiguousarray(queries, dtype=np.float32)
    n = int(passages.shape[0])
    k = min(int(k), n)
    if q.ndim != 2 or k <= 0:
        raise ValueError(f"queries {q.shape} must be 2-D and k={k} > 0")
    lo, hi = shard_bounds(n, ctx.world_size, ctx.rank)
    nq = q.shape[0]
    # local top-k as rank keys, padded to k columns with (-1, -inf) keys that sort last
    pad = rank_keys(np.array([-1]), np.array([-np.inf], dtype=np.float32))[0]
    keys = np.full((nq, k), pad, dtype=np.int64)
    if hi > lo:
        ids, vals = exact_search(
            q,
            passages[lo:hi],
            k,
            chunk_size=chunk_size,
            passage_transform=passage_transform,
            progress=progress and ctx.is_main,
            query_batch=qb,
            backend=backend,
            device=device,
        )
        keys[:, : ids.shape[1]] = rank_keys(ids + lo, vals)
    block = max(1, GATHER_BYTES // (8 * k * ctx.world_size))
    out = np.empty((nq, k), dtype=np.int64)
    bar = tqdm(total=nq, unit="query", desc="merge top-k", disable=not (progress and ctx.is_main))
    for s in range(0, nq, block):
        mine = torch.from_numpy(np.ascontiguousarray(keys[s : s + block]))
        bufs = [torch.empty_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(bufs, mine, group=cpu.group)
        merged = np.concatenate([b.numpy() for b in bufs], axis=1)  # (block, W * k)
        out[s : s + block] = np.partition(merged, k - 1, axis=1)[:, :k]
        bar.update(mine.shape[0])
    bar.close()
    return decode_keys(np.sort(out, axis=1))
