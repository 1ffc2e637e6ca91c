"""Exact streaming top-k inner-product search over all passages of a split.

The passages are read in chunks (a memory-mapped store is never loaded whole) and every chunk's
top-k is merged into a running top-k per query, the scheme of FAISS's
``contrib/exhaustive_search.py``. The running top-k is held as int64 rank keys (score and id in
one sortable integer, :func:`rank_keys`), so merging is one ``np.partition`` with exact ties.
Peak memory is ``O(chunk_size * d + n_queries * k)`` whatever the corpus size (plus
``query_batch * chunk_size`` scores for the ``"torch"`` backend and for tie repairs); pages of a
memory-mapped corpus are dropped from the resident set once their chunk is done
(:func:`release_pages`), so RSS stays bounded by the chunk, not the corpus.

Two backends compute a chunk's top-k; both are exact and give the same ids:

- ``"faiss"`` (default): ``faiss.knn`` (BLAS matmul + heap selection in C++), asked for ``k + 1``
  results so that a tie crossing the k-th position is detected and that row redone exactly.
- ``"torch"``: a torch matmul and ``torch.topk`` plus the same tie repair; no FAISS needed.
- ``"auto"``: whichever of the two is faster on this CPU, measured once and cached
  (:func:`treerank.kernels.device.cpu_search_backend`).

``device="cuda"`` (or ``"auto"`` on a machine with CUDA) runs the chunk's matmul and
``torch.topk`` on the GPU in float32 (TF32 off), ``k + 1`` results per query so that a tie at the
k-th position is detected and that row redone exactly on the CPU; the query block is moved once,
each passage chunk once. GPU and CPU float32 dot products differ in their last bits, so two
passages whose scores differ by less than about ``1e-6`` may swap (``scripts/gpu_check.sh``
measures the agreement); otherwise the ids are the CPU's.

**Ties** are broken by ascending passage id (store row), everywhere: inside a chunk, across
chunks and at the k-th position. A constant scorer therefore returns passages ``0, 1, ..., k-1``
for every query and earns exactly the MRR that this id order earns, never a perfect score
(toolkits that keep the first-listed candidate on ties, or sort positives first, report 1.0).
FAISS ``IndexFlatIP`` keeps the same *set* on ties but lists tied ids in descending order.

Under ``torchrun``, inside :func:`treerank.distributed.search.sharded_search` (``treerank
evaluate`` enters it), each rank searches a contiguous passage shard and the top-k lists are
merged to the same result (:mod:`treerank.distributed.search`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from collections.abc import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from treerank.distributed.context import search_hook
from treerank.kernels.device import resolve_device, search_backend

DEFAULT_CHUNK_BYTES = 384 * 2**20  # passage block per chunk: 262,144 rows at 384 dims
DEFAULT_CHUNK_SIZE: int | None = None  # None: as many rows as fit DEFAULT_CHUNK_BYTES
DEFAULT_QUERY_BATCH = 256
BACKENDS = ("faiss", "torch", "auto")


_PAD_ID = 0xFFFFFFFF

DEPTH_SETTING = "the run depth k (--k; evaluate.k in an experiment)"
"""How errors name the run depth, the same in every command and in the library."""


def check_run_depth(k: int) -> None:
    """Refuse a run depth (passages retrieved per query) below 1.

    The one place that words this error: ``treerank evaluate``, ``treerank search``,
    :func:`treerank.evaluation.checks.check_depth` and ``search_texts`` all call it.

    Raises:
        ValueError: ``k < 1`` (``"the run depth k (--k; ...) must be at least 1, got 0"``).
    """
    if int(k) < 1:
        raise ValueError(f"{DEPTH_SETTING} must be at least 1, got {k}")


class NonFiniteVectorError(ValueError):
    """A query or passage vector holds NaN or infinity; the message names the store (or array)
    and the first bad row. Raised by :func:`exact_search` on every backend, before scoring."""


def check_finite(x: np.ndarray, what: str, source: str, row_offset: int = 0) -> None:
    """Raise :class:`NonFiniteVectorError` naming ``source`` and the row if ``x`` has NaN/inf.

    Args:
        x: ``float32 (n, d)`` vectors; row ``i`` is row ``row_offset + i`` of ``source``.
        what: ``"query"`` or ``"passage"``. source: the store path (or a description).
    """
    bad = ~np.isfinite(x)
    if bad.any():
        row = row_offset + int(np.flatnonzero(bad.any(axis=1))[0])
        raise NonFiniteVectorError(
            f"{source}: {what} row {row} holds a non-finite value (NaN or inf); the store is "
            "corrupt or the model diverged"
        )


def rank_keys(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Encode ``(score, id)`` pairs as int64 keys whose ascending order is the ranking order.

    The high 32 bits hold the negated order-preserving integer image of the float32 score, the
    low 32 bits the passage id, so ``np.sort`` / ``np.partition`` on keys rank by score descending
    then id ascending, with no separate tie pass. ``-1`` ids (padding) sort after real ids.

    Args:
        ids: ``int64 (...)`` passage ids in ``[-1, 2**32 - 1)``.
        scores: ``float32 (...)`` scores, no NaN; ``-0.0`` is treated as ``0.0``.

    Returns:
        ``int64 (...)`` keys; :func:`decode_keys` inverts them exactly.
    """
    b = (np.asarray(scores, dtype=np.float32) + np.float32(0)).view(np.int32).astype(np.int64)
    b = np.where(b < 0, b ^ 0x7FFFFFFF, b)
    low = np.where(ids < 0, _PAD_ID, ids).astype(np.int64)
    return ((-b) << 32) | low


def decode_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`rank_keys`: ``int64`` keys -> ``(ids int64, scores float32)``."""
    low = keys & 0xFFFFFFFF
    ids = np.where(low == _PAD_ID, -1, low)
    b = -(keys >> 32)
    b = np.where(b < 0, b ^ 0x7FFFFFFF, b).astype(np.int32)
    return ids, b.view(np.float32)


def sort_rows(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort each row by score descending, ties by ascending id (``-1`` padding last among ties).

    Args:
        ids: ``int64 (nq, k)`` passage ids.
        scores: ``float32 (nq, k)``, no NaN.

    Returns:
        ``(ids int64, scores float32)`` reordered, same shapes.
    """
    if ids.size == 0:
        return ids.astype(np.int64), scores.astype(np.float32)
    return decode_keys(np.sort(rank_keys(ids, scores), axis=1))


def topk_desc(scores: np.ndarray, k: int, id_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` columns of each row by score, ties by ascending column (passage id).

    Args:
        scores: ``float32 (nq, n)`` scores; NaN is not allowed.
        k: results per row; clipped to ``n``.
        id_offset: added to the column index to give passage ids (the chunk's first row).

    Returns:
        ``(ids int64 (nq, k'), scores float32 (nq, k'))`` with ``k' = min(k, n)``, each row sorted
        by score descending then id ascending.

    Raises:
        ValueError: NaN in ``scores``.
    """
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    nq, n = scores.shape
    k = min(int(k), n)
    if nq == 0 or k == 0:
        return np.empty((nq, k), np.int64), np.empty((nq, k), np.float32)
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN; a scorer must return finite or -inf scores")
    if k < n:
        top_vals, top_idx = torch.topk(torch.from_numpy(scores), k, dim=1, sorted=False)
        idx = top_idx.numpy().astype(np.int64)
        vals = top_vals.numpy()
        # The k-th value may be tied with entries that topk left out: only then is the choice
        # arbitrary. Such rows are redone exactly (a stable sort keeps ascending ids among ties).
        kth = vals.min(axis=1)
        n_eq_all = (scores == kth[:, None]).sum(axis=1)
        n_eq_sel = (vals == kth[:, None]).sum(axis=1)
        bad = np.nonzero(n_eq_all != n_eq_sel)[0]
        if bad.size:
            idx[bad] = np.argsort(-scores[bad], axis=1, kind="stable")[:, :k]
            vals[bad] = np.take_along_axis(scores[bad], idx[bad], axis=1)
    else:
        idx = np.broadcast_to(np.arange(n, dtype=np.int64), (nq, n)).copy()
        vals = scores.copy()
    ids, vals = sort_rows(idx, vals)
    return ids + id_offset, vals


def _chunk_topk_torch(
    q: np.ndarray, block: np.ndarray, k: int, start: int, query_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    kk = min(k, block.shape[0])
    ids = np.empty((q.shape[0], kk), np.int64)
    vals = np.empty((q.shape[0], kk), np.float32)
    p_t = torch.from_numpy(np.ascontiguousarray(block)).T
    for qs in range(0, q.shape[0], query_batch):
        s = (torch.from_numpy(q[qs : qs + query_batch]) @ p_t).numpy()
        ids[qs : qs + query_batch], vals[qs : qs + query_batch] = topk_desc(s, k, start)
    return ids, vals


def _chunk_topk_faiss(
    q: np.ndarray, block: np.ndarray, k: int, start: int, query_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    c = block.shape[0]
    if c <= k:  # the whole chunk is kept: scores only
        s = q @ block.T
        ids = np.broadcast_to(np.arange(c, dtype=np.int64), s.shape).copy()
        ids, s = sort_rows(ids, s)
        return ids + start, s
    vals, ids = faiss.knn(q, block, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    ids = ids.astype(np.int64, copy=False)
    if np.isnan(vals).any():
        raise ValueError("scores contain NaN; a scorer must return finite or -inf scores")
    # A tie between the k-th and (k+1)-th result means the boundary choice was arbitrary.
    bad = np.nonzero(vals[:, k - 1] == vals[:, k])[0]
    ids, vals = ids[:, :k], vals[:, :k]
    for bs in range(0, bad.size, query_batch):
        rows = bad[bs : bs + query_batch]
        ids[rows], vals[rows] = topk_desc(q[rows] @ block.T, k)
    return ids + start, vals


def chunk_topk_tensor(
    q: torch.Tensor, block: np.ndarray, k: int, start: int, query_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """One passage chunk's exact top-``k`` on ``q``'s device (the GPU kernel; runs on any device).

    Args:
        q: ``float32 (nq, d)`` query tensor, already on the device.
        block: ``float32 (c, d)`` passage rows ``start .. start + c`` (host memory).
        k: results per query. start: the chunk's first passage id.
        query_batch: queries scored at once (memory ``query_batch * c`` scores on the device).

    Returns:
        ``(ids int64 (nq, min(k, c)), scores float32 (nq, min(k, c)))`` on the host, rows sorted by
        score descending then id ascending; a row whose ``k``-th and ``(k+1)``-th scores tie is
        redone exactly from its full score row.
    """
    c = block.shape[0]
    kk = min(k, c)
    ids = np.empty((q.shape[0], kk), np.int64)
    vals = np.empty((q.shape[0], kk), np.float32)
    b = torch.from_numpy(np.ascontiguousarray(block)).to(q.device, non_blocking=False)
    for qs in range(0, q.shape[0], query_batch):
        s = q[qs : qs + query_batch] @ b.T  # (qb, c) float32
        if torch.isnan(s).any():
            raise ValueError("scores contain NaN; a scorer must return finite or -inf scores")
        if c <= k:
            ids[qs : qs + query_batch], vals[qs : qs + query_batch] = topk_desc(s.cpu().numpy(), k)
            continue
        tv, ti = torch.topk(s, k + 1, dim=1, sorted=True)
        tv_h, ti_h = tv.cpu().numpy(), ti.cpu().numpy().astype(np.int64)
        bad = np.nonzero(tv_h[:, k - 1] == tv_h[:, k])[0]
        r_ids, r_vals = sort_rows(ti_h[:, :k], tv_h[:, :k])
        if bad.size:
            r_ids[bad], r_vals[bad] = topk_desc(
                s[torch.from_numpy(bad).to(q.device)].cpu().numpy(), k
            )
        ids[qs : qs + query_batch], vals[qs : qs + query_batch] = r_ids, r_vals
    return ids + start, vals


_CHUNK_TOPK = {"faiss": _chunk_topk_faiss, "torch": _chunk_topk_torch}
_LIBC: ctypes.CDLL | None = None


def release_pages(passages: np.ndarray, start: int, stop: int) -> bool:
    """Drop rows ``[start, stop)`` of a read-only ``np.memmap`` from this process's resident set.

    Pages of a file mapping stay resident (and counted in RSS) after they were read; this
    ``madvise(MADV_DONTNEED)``s the whole pages of the range so that streaming a corpus keeps RSS
    bounded by the chunk size. Safe only for read-only file mappings (the page cache keeps the
    data; a later read faults it back in): anything else is left alone.

    Returns:
        True when pages were released.
    """
    global _LIBC
    if not (isinstance(passages, np.memmap) and passages.mode == "r" and sys.platform == "linux"):
        return False
    if not passages.flags.c_contiguous or stop <= start:
        return False
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    row = passages.strides[0]
    page = mmap.PAGESIZE
    lo = passages.ctypes.data + start * row
    hi = passages.ctypes.data + stop * row
    lo = -(-lo // page) * page
    hi = hi // page * page
    if hi <= lo:
        return False
    return _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4) == 0  # MADV_DONTNEED


def merge_topk(keys_a: np.ndarray, keys_b: np.ndarray, k: int) -> np.ndarray:
    """Merge two per-row lists of :func:`rank_keys` into the top-``k`` keys of each row.

    Keys are unique per row (ids are), so the selected set is exact, ties included.

    Args:
        keys_a, keys_b: ``int64 (nq, ka)`` and ``(nq, kb)`` rank keys.
        k: results to keep (clipped to ``ka + kb``).

    Returns:
        ``int64 (nq, k')`` keys, rows in no particular order.
    """
    keys = np.concatenate([keys_a, keys_b], axis=1)
    k = min(k, keys.shape[1])
    if k == keys.shape[1]:
        return keys
    return np.partition(keys, k - 1, axis=1)[:, :k]


def exact_search(
    queries: np.ndarray,
    passages: np.ndarray,
    k: int = 1000,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    passage_transform: Callable[[np.ndarray], np.ndarray] | None = None,
    progress: bool = False,
    query_batch: int = DEFAULT_QUERY_BATCH,
    backend: str = "faiss",
    source: str = "vectors",
    *,
    device: str | torch.device | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` passages by inner product for every query.

    Args:
        queries: ``float32 (nq, d')`` query search vectors (already through the model's query
            tower; e.g. L2-normalised for cosine).
        passages: ``(n_passages, d)`` stored passage vectors, an ndarray or a read-only
            ``np.memmap``; read ``chunk_size`` rows at a time, never written.
        k: results per query (default 1000), clipped to ``n_passages``.
        chunk_size: passages per chunk; the block costs ``chunk_size * d * 4`` bytes. ``None``
            (default): ``DEFAULT_CHUNK_BYTES // (d * 4)`` rows (384 MiB: 262,144 rows at 384
            dims, 26,214 at 3,840).
        passage_transform: the model's passage tower applied to each chunk, ``float32 (c, d) ->
            float32 (c, d')``; ``None`` scores the stored vectors as they are.
        progress: show a tqdm bar over passages.
        query_batch: queries scored at once by the torch backend and by tie repairs.
        backend: ``"faiss"``, ``"torch"`` or ``"auto"`` (the faster on this CPU, measured once;
            see module docstring); same results. Ignored on a GPU (torch there).
        source: names the vectors in errors (the store path).
        device: ``"auto"`` | ``"cpu"`` | ``"cuda[:n]"`` | None (the CPU;
            :func:`treerank.kernels.device.resolve_device`). On a GPU the matmul and top-k run
            there; the passage transform still runs on the host, chunk by chunk.

    Returns:
        ``(ids int64 (nq, k'), scores float32 (nq, k'))``, ``k' = min(k, n_passages)``; score is
        the inner product (a cosine for normalised vectors); rows sorted by score descending,
        ties by ascending passage id.

    Raises:
        NonFiniteVectorError: a query or passage row (stored, or after the transform) holds NaN
            or inf, whatever the backend.
        ValueError: non-2-D inputs, bad sizes, an unknown backend, a dimension mismatch after the
            transform, or NaN scores.
        DeviceError: ``device`` is unknown, or ``cuda`` without CUDA.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown exact-search backend {backend!r}; known: {', '.join(BACKENDS)}")
    if (hook := search_hook()) is not None:  # torchrun evaluation: shard the passages
        return hook(  # type: ignore[no-any-return]
            queries,
            passages,
            k,
            chunk_size=chunk_size,
            passage_transform=passage_transform,
            progress=progress,
            query_batch=query_batch,
            backend=backend,
            device=device,
        )
    dev = resolve_device(device)
    backend = search_backend(backend, dev)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if q.ndim != 2 or passages.ndim != 2:
        raise ValueError(f"queries {q.shape} and passages {passages.shape} must be 2-D")
    nq, n = q.shape[0], passages.shape[0]
    k = min(int(k), n)
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_BYTES // (4 * max(int(passages.shape[1]), 1)))
    if k <= 0 or chunk_size <= 0 or query_batch <= 0:
        raise ValueError(f"k={k}, chunk_size={chunk_size}, query_batch={query_batch} must be > 0")
    check_finite(q, "query", source)
    chunk_topk: Callable[[np.ndarray, np.ndarray, int, int, int], tuple[np.ndarray, np.ndarray]]
    if dev.type == "cpu":
        chunk_topk = _CHUNK_TOPK[backend]
    else:
        q_dev = torch.from_numpy(q).to(dev)
        chunk_topk = lambda _q, blk, kk, st, qb: chunk_topk_tensor(q_dev, blk, kk, st, qb)  # noqa: E731

    keys = np.empty((nq, 0), np.int64)
    bar = tqdm(total=n, unit="passage", disable=not progress, desc="exact search")
    for start in range(0, n, chunk_size):
        block = np.asarray(passages[start : start + chunk_size], dtype=np.float32)
        check_finite(block, "passage", source, start)
        if passage_transform is not None:
            block = np.asarray(passage_transform(block), dtype=np.float32)
            check_finite(block, "transformed passage", source, start)
        if block.ndim != 2 or block.shape[1] != q.shape[1]:
            raise ValueError(
                f"passage block {block.shape} does not match the query dimension {q.shape[1]}"
            )
        block = np.ascontiguousarray(block)
        new_ids, new_vals = chunk_topk(q, block, k, start, query_batch)
        keys = merge_topk(keys, rank_keys(new_ids, new_vals), k)
        bar.update(block.shape[0])
        del block
        release_pages(passages, start, min(start + chunk_size, n))
    bar.close()
    return decode_keys(np.sort(keys, axis=1))
