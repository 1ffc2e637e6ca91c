"""Exact streaming top-k inner-product search over all passages of a split.

The passages are read in chunks (a memory-mapped store is never loaded whole) and every chunk's
top-k is merged into a running top-k per query, the scheme of FAISS's
``contrib/exhaustive_search.py``. The running top-k is held as int64 rank keys (score and id in
one sortable integer, :func:`rank_keys`), so merging is one ``np.partition`` with exact ties.
Peak memory is ``O(chunk_size * d + n_queries * k)`` whatever the corpus size (plus
``query_batch * chunk_size`` scores for the ``"torch"`` backend and for tie repairs, and
:data:`GATHER_BYTES` of rows gathered for the exact rescoring). A memory-mapped store larger
than one chunk is read with ``pread`` into one reused chunk buffer
(:class:`treerank.kernels.rows.FileRows`), never through the map: a map's pages stay in the
resident set once read, and each page fault also maps the cached neighbours of the row, so the
rescoring's scattered gathers made most of a 15 GB file resident (6.39 GiB at 1M x 3,840,
``docs/scale.md``). Other arrays are sliced, a read-only map's pages released after each chunk
(:func:`treerank.kernels.rows.release_pages`). RSS stays bounded by the chunk, not the corpus.

**Scores come from one kernel.** A BLAS product's last bits depend on how the library blocks
the matrix (its shape, the thread count, the CPU), so two callers that score the same pair
through different products can disagree by an ulp and swap a near-tie. Every score that
:func:`exact_search` returns is therefore recomputed by :func:`pair_scores` (float32 inputs,
exact float64 products, a fixed-order sum, one rounding to float32), whose value for a pair
depends on the two vectors only, never on the batch, the chunk or the machine. The BLAS pass
only preselects the top ``k + margin`` (:func:`preselect_depth`); a query whose preselection
margin is smaller than the proven float32 error bound (:func:`dot_error_bound`) is rescored
over every passage by :func:`pair_scores`, so the result is the exact top-``k`` of
:func:`pair_scores`. :func:`treerank.search.rescore.rescore` scores its candidates with the same
function, so rescoring every passage equals exact search by construction.

Two backends compute a chunk's (preselection) top-k; both are exact and give the same ids:

- ``"faiss"`` (default): ``faiss.knn`` (BLAS matmul + heap selection in C++), asked for ``k + 1``
  results so that a tie crossing the k-th position is detected and that row redone exactly.
- ``"torch"``: a torch matmul and ``torch.topk`` plus the same tie repair; no FAISS needed.
- ``"auto"``: whichever of the two is faster on this CPU, measured once and cached
  (:func:`cpu_search_backend`).

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

Under ``torchrun``, :func:`treerank.kernels.sharded.sharded_exact_search` (given the process
group as its ``ctx`` argument; ``treerank evaluate`` hands it to the dense systems as their
``shard``) searches a contiguous passage shard on each rank and merges the top-k lists to the
same result; this kernel knows nothing of process groups.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import torch
from tqdm.auto import tqdm

from treerank.kernels.device import (
    DEFAULT_DEVICE,
    Device,
    cache_dir,
    read_probe_cache,
    resolve_device,
    write_probe_cache,
)
from treerank.kernels.rows import FileRows, release_pages
from treerank.kernels.vectors import F32, I64, ROW_CHUNK, Scores, Vecs
from treerank.storelike import Vectors

DEFAULT_CHUNK_BYTES = 384 * 2**20  # passage block per chunk: 262,144 rows at 384 dims
DEFAULT_CHUNK_SIZE: int | None = None  # None: as many rows as fit DEFAULT_CHUNK_BYTES
DEFAULT_QUERY_BATCH = 256
GATHER_BYTES = 64 * 2**20
"""Passage rows gathered at once by the exact rescoring of :func:`exact_search` (stored
vectors, no passage transform): 64 MiB, i.e. 37 queries' 116 rows at 3,840 dims."""
SearchBackend = Literal["faiss", "torch", "auto"]
"""The CPU exact-search kernel: FAISS, torch, or the measured faster one (a GPU runs torch)."""
BACKENDS: tuple[SearchBackend, ...] = get_args(SearchBackend)
PROBE_FILE = "search-backend.json"
"""The cache file of the measured CPU kernel choice (:func:`cpu_search_backend`)."""


_PAD_ID = 0xFFFFFFFF
_PAIR_BLOCK = 1 << 21  # float64 products held at once by pair_scores (16 MiB)
_UNIT_ROUNDOFF = 2.0**-24  # float32

RUN_DEPTH = 1000
"""The default run depth: passages retrieved per query (Recall@1000, trec_eval's depth)."""
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


def _rows_surely_finite(x: Vecs) -> bool:
    """A one-read screen: every row of a float ``(n, d)`` block sums to a finite value.

    A NaN or inf element makes its row's sum NaN or inf, so ``True`` proves every element is
    finite; ``False`` (a non-finite element, or a float overflow of finite values) sends the
    caller to the exact elementwise check. The sum is a BLAS matrix-vector product: it reads the
    block once and allocates ``n`` floats, where ``np.isfinite`` allocates ``n * d`` booleans.
    """
    a = np.asarray(x)
    if a.ndim != 2 or a.dtype not in (np.float32, np.float64) or a.size == 0:
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(a @ np.ones(a.shape[1], dtype=a.dtype)).all())


def check_finite(x: Vecs, what: str, source: str, row_offset: int = 0) -> None:
    """Raise :class:`NonFiniteVectorError` naming ``source`` and the row if ``x`` has NaN/inf.

    Args:
        x: ``float32 (n, d)`` vectors; row ``i`` is row ``row_offset + i`` of ``source``.
        what: ``"query"`` or ``"passage"``. source: the store path (or a description).
    """
    if _rows_surely_finite(x):
        return
    bad = ~np.isfinite(x)
    if bad.any():
        row = row_offset + int(np.flatnonzero(bad.any(axis=1))[0])
        raise NonFiniteVectorError(
            f"{source}: {what} row {row} holds a non-finite value (NaN or inf); the store is "
            "corrupt or the model diverged"
        )


def check_rows_finite(x: Vecs, rows: I64, what: str, source: str) -> None:
    """Raise :class:`NonFiniteVectorError` naming ``source`` and the store row of the first bad
    row of a gathered block (``x[i]`` is row ``rows[i]``; ``-1`` marks padding, never checked).

    Args:
        x: ``float32 (m, d)`` gathered vectors. rows: ``int (m,)`` their store rows.
        what: ``"passage"`` / ``"transformed passage"``. source: the store file (or path).
    """
    if _rows_surely_finite(x):
        return
    ids = np.asarray(rows).ravel()
    bad = (ids >= 0) & ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise NonFiniteVectorError(
            f"{source}: {what} row {int(ids[np.flatnonzero(bad)[0]])} holds a non-finite value "
            "(NaN or inf); the store is corrupt or the model diverged"
        )


def pair_scores(queries: Vecs, rows: Vecs) -> F32:
    """Inner products computed pair by pair in one fixed order: the one score kernel.

    Each score is ``float32(sum_j float64(q_j) * float64(p_j))``: the float32 products are exact
    in float64, the sum runs in numpy's fixed pairwise order over a contiguous row of length
    ``d``, and the result is rounded to float32 once. The value for a pair therefore depends
    only on the two vectors (and ``d``), never on which other pairs share the call, their
    order, the chunking, the thread count or the CPU; it is within one float32 rounding of the
    exact inner product.

    Args:
        queries: ``float32 (b, d)`` query vectors.
        rows: ``float32 (b, c, d)`` passage vectors per query (candidates), or ``(c, d)``
            passages shared by every query.

    Returns:
        ``float32 (b, c)`` inner products.

    Raises:
        ValueError: shapes that disagree.
    """
    q = np.asarray(queries, dtype=np.float32)
    r = np.asarray(rows, dtype=np.float32)
    if q.ndim != 2 or r.ndim not in (2, 3) or r.shape[-1] != q.shape[1]:
        raise ValueError(f"queries {q.shape} and rows {r.shape} do not match")
    if r.ndim == 3 and r.shape[0] != q.shape[0]:
        raise ValueError(f"queries {q.shape} and per-query rows {r.shape} do not match")
    b, d = q.shape
    c = r.shape[-2]
    out = np.empty((b, c), dtype=np.float32)
    if b == 0 or c == 0:
        return out
    step = max(1, _PAIR_BLOCK // max(d, 1))
    q64 = q.astype(np.float64)
    buf = np.empty((min(step, c), d), dtype=np.float64)
    for cs in range(0, c, step):
        ce = min(cs + step, c)
        m = buf[: ce - cs]
        shared = r[cs:ce].astype(np.float64) if r.ndim == 2 else None
        for i in range(b):
            np.multiply(shared if shared is not None else r[i, cs:ce], q64[i], out=m)
            out[i, cs:ce] = m.sum(axis=1)  # pairwise, per row: independent of the other rows
    return out


def dot_error_bound(d: int) -> float:
    """Relative bound ``g`` on a float32 inner product computed in any order (BLAS included).

    ``|fl(q . p) - q . p| <= g * ||q|| * ||p||`` with ``g = gamma_d = d u / (1 - d u)``, ``u =
    2**-24`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5, with
    ``sum |q_j p_j| <= ||q|| ||p||``), plus one float32 rounding of :func:`pair_scores`' result.
    Fused multiply-adds and blocked sums only make the true error smaller.
    """
    du = int(d) * _UNIT_ROUNDOFF
    return du / (1.0 - du) + 2 * _UNIT_ROUNDOFF


def preselect_depth(k: int, n: int) -> int:
    """How many passages the BLAS pass of :func:`exact_search` keeps per query before
    :func:`pair_scores` rescores them: ``k + max(16, k // 8)``, at most ``n``."""
    return min(int(n), int(k) + max(16, int(k) // 8))


FINITE_SCAN_ROWS = ROW_CHUNK


def nonfinite_rows(x: Vecs, block: int = FINITE_SCAN_ROWS) -> tuple[int, int | None]:
    """Count the rows of ``x`` holding NaN or inf, reading ``block`` rows at a time.

    Args:
        x: ``float (n, d)`` vectors, an ndarray or a read-only memmap (never copied whole).
        block: rows read per step.

    Returns:
        ``(count, first)``: the number of non-finite rows and the first such row (``None``
        when every row is finite).
    """
    count, first = 0, None
    for start in range(0, int(x.shape[0]), block):
        bad = ~np.isfinite(np.asarray(x[start : start + block])).all(axis=1)
        n_bad = int(bad.sum())
        if n_bad and first is None:
            first = start + int(np.flatnonzero(bad)[0])
        count += n_bad
    return count, first


def finite_record(queries: Vecs, passages: Vecs) -> dict[str, object]:
    """The ``meta.json`` record of a store's finiteness, written when its vectors are written.

    Returns:
        ``{"finite": bool, "non_finite_rows": {"queries": int, "passages": int},
        "first_non_finite_row": {"queries": int | None, "passages": int | None}}``; readers
        trust ``finite`` instead of scanning (:func:`recorded_finite`).
    """
    nq, fq = nonfinite_rows(queries)
    npas, fp = nonfinite_rows(passages)
    return {
        "finite": nq == 0 and npas == 0,
        "non_finite_rows": {"queries": nq, "passages": npas},
        "first_non_finite_row": {"queries": fq, "passages": fp},
    }


def recorded_finite(meta: object) -> bool | None:
    """What a store's ``meta.json`` records about its vectors' finiteness: ``True`` (every
    query and passage row is finite), ``False``, or ``None`` for a store written before the
    record existed (a reader must then scan, e.g. with :func:`check_finite`)."""
    value = meta.get("finite") if isinstance(meta, dict) else None
    return value if isinstance(value, bool) else None


def check_store_finite(store: Vectors, what: Literal["passage", "query"] = "passage") -> None:
    """Raise :class:`NonFiniteVectorError` if a store's ``what`` vectors hold NaN/inf.

    Trusts the ``meta.json`` record (:func:`finite_record`) when there is one; scans the
    memory map block by block only for stores without it.

    Args:
        store: an :class:`~treerank.store.EmbeddingStore` split (``meta``, ``queries``,
            ``passages``, ``path``).
        what: ``"passage"`` or ``"query"``.
    """
    meta = store.meta
    recorded = recorded_finite(meta)
    if recorded is True:
        return
    key = "passages" if what == "passage" else "queries"
    if recorded is False:
        rows = meta.get("first_non_finite_row")
        row = rows.get(key) if isinstance(rows, dict) else None
        if row is None:
            return
    else:
        _, row = nonfinite_rows(store.passages if what == "passage" else store.queries)
        if row is None:
            return
    raise NonFiniteVectorError(
        f"{store.path}: {what} row {row} holds a non-finite value (NaN or "
        "inf); the store is corrupt or the model diverged"
    )


def rank_keys(ids: I64, scores: Scores) -> I64:
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


def decode_keys(keys: I64) -> tuple[I64, F32]:
    """Inverse of :func:`rank_keys`: ``int64`` keys -> ``(ids int64, scores float32)``."""
    low = keys & 0xFFFFFFFF
    ids = np.where(low == _PAD_ID, -1, low)
    b = -(keys >> 32)
    b = np.where(b < 0, b ^ 0x7FFFFFFF, b).astype(np.int32)
    return ids, b.view(np.float32)


def sort_rows(ids: I64, scores: Scores) -> tuple[I64, F32]:
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


def topk_desc(scores: Scores, k: int, id_offset: int = 0) -> tuple[I64, F32]:
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


def _chunk_topk_torch(q: F32, block: F32, k: int, start: int, query_batch: int) -> tuple[I64, F32]:
    kk = min(k, block.shape[0])
    ids = np.empty((q.shape[0], kk), np.int64)
    vals = np.empty((q.shape[0], kk), np.float32)
    p_t = torch.from_numpy(np.ascontiguousarray(block)).T
    for qs in range(0, q.shape[0], query_batch):
        s = (torch.from_numpy(q[qs : qs + query_batch]) @ p_t).numpy()
        ids[qs : qs + query_batch], vals[qs : qs + query_batch] = topk_desc(s, k, start)
    return ids, vals


def _chunk_topk_faiss(q: F32, block: F32, k: int, start: int, query_batch: int) -> tuple[I64, F32]:
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
    q: torch.Tensor, block: F32, k: int, start: int, query_batch: int
) -> tuple[I64, F32]:
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


def _probe_key(probe: dict[str, int] | None = None) -> str:
    """The cache key of a measured kernel choice: everything that changes which kernel wins.

    The CPU model and machine type, the CPUs this process may run on, torch's and FAISS's
    (OpenMP) thread counts, the torch / FAISS / numpy versions, and the probe's shape
    (``probe``: queries, passages, dimension, k, repeats): a measurement at another shape or
    thread count is another entry, never reused.
    """
    try:
        import faiss

        fv = str(faiss.__version__)
        faiss_threads = str(faiss.omp_get_max_threads())
    except (ImportError, AttributeError):
        fv, faiss_threads = "none", "none"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    shape = ",".join(f"{k}={v}" for k, v in sorted((probe or {}).items()))
    return (
        f"{cpu}|machine={platform.machine()}|cpus={cpus}|threads={torch.get_num_threads()}"
        f"|faiss_threads={faiss_threads}|torch={torch.__version__}|faiss={fv}"
        f"|numpy={np.__version__}|probe={shape}"
    )


def _time_backend(backend: str, q: F32, p: F32, k: int, repeats: int) -> float:
    exact_search(q[:8], p, k=k, backend=backend)  # warm-up (imports, thread pools)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        exact_search(q, p, k=k, backend=backend)
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_search_backend(
    *,
    refresh: bool = False,
    n_queries: int = 256,
    n_passages: int = 16_384,
    dim: int = 384,
    k: int = 100,
    repeats: int = 2,
) -> str:
    """The faster exact-search kernel on this CPU: ``"torch"`` or ``"faiss"``.

    Measured once (best of ``repeats`` runs of :func:`exact_search` with
    each backend on a random ``n_queries x n_passages x dim`` probe, about a second) and cached
    in ``cache_dir() / "search-backend.json"`` under :func:`_probe_key` (the CPU model, the
    usable CPUs, torch's and FAISS's thread counts, the torch / FAISS / numpy versions and the
    probe's shape); a later call with the same key reads the cache.
    Without FAISS the answer is ``"torch"`` (nothing is measured). The cache is advisory: an
    unreadable or unwritable cache directory only means measuring again.

    Args:
        refresh: measure even when a cached answer exists.

    Returns:
        ``"torch"`` or ``"faiss"``.
    """
    try:
        import faiss  # noqa: F401
    except ImportError:
        return "torch"
    probe = {"n_queries": n_queries, "n_passages": n_passages, "dim": dim, "k": k}
    key = _probe_key({**probe, "repeats": repeats})
    path = cache_dir() / PROBE_FILE
    doc = read_probe_cache(path)
    hit = doc.get(key)
    if not refresh and isinstance(hit, dict) and hit.get("backend") in ("torch", "faiss"):
        return str(hit["backend"])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n_queries, dim), dtype=np.float32)
    p = rng.standard_normal((n_passages, dim), dtype=np.float32)
    seconds = {b: _time_backend(b, q, p, k, repeats) for b in ("torch", "faiss")}
    backend = "torch" if seconds["torch"] < seconds["faiss"] else "faiss"
    doc[key] = {
        "backend": backend,
        "seconds": seconds,
        "probe": probe,
        "measured_unix": time.time(),
    }
    write_probe_cache(path, doc)
    return backend


def search_backend(backend: str, device: torch.device) -> str:
    """The exact-search kernel to run: ``"torch"`` on a GPU; on the CPU ``backend`` itself, or
    the measured faster one (:func:`cpu_search_backend`) for ``"auto"``."""
    if device.type != "cpu":
        return "torch"
    return cpu_search_backend() if backend == "auto" else backend


def merge_topk(keys_a: I64, keys_b: I64, k: int) -> I64:
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
    queries: Vecs,
    passages: Vecs,
    k: int = RUN_DEPTH,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    passage_transform: Callable[[F32], Vecs] | None = None,
    progress: bool = False,
    query_batch: int = DEFAULT_QUERY_BATCH,
    backend: str = "faiss",
    source: str = "vectors",
    *,
    device: Device = DEFAULT_DEVICE,
) -> tuple[I64, F32]:
    """Exact top-``k`` passages by inner product for every query.

    Args:
        queries: ``float32 (nq, d')`` query search vectors (already through the model's query
            tower; e.g. L2-normalised for cosine).
        passages: ``(n_passages, d)`` stored passage vectors, an ndarray or a read-only
            ``np.memmap``; read ``chunk_size`` rows at a time (a whole map larger than one
            chunk: with ``pread``, into one reused buffer), never written.
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
        the inner product (a cosine for normalised vectors) as :func:`pair_scores` computes it;
        rows sorted by score descending, ties by ascending passage id; the exact top-``k'`` of
        :func:`pair_scores` over every passage (see the module docstring).

    Raises:
        NonFiniteVectorError: a query or passage row (stored, or after the transform) holds NaN
            or inf, whatever the backend.
        ValueError: non-2-D inputs, bad sizes, an unknown backend, a dimension mismatch after the
            transform, or NaN scores.
        DeviceError: ``device`` is unknown, or ``cuda`` without CUDA.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown exact-search backend {backend!r}; known: {', '.join(BACKENDS)}")
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
    kk = preselect_depth(k, n)  # the BLAS pass keeps a margin; pair_scores decides the top k
    p_norm = 0.0  # largest (transformed) passage norm: scales the error bound
    chunk_topk: Callable[[F32, F32, int, int, int], tuple[I64, F32]]
    if dev.type == "cpu":
        chunk_topk = _CHUNK_TOPK[backend]
    else:
        q_dev = torch.from_numpy(q).to(dev)
        chunk_topk = lambda _q, blk, kk, st, qb: chunk_topk_tensor(q_dev, blk, kk, st, qb)  # noqa: E731

    keys = np.empty((nq, 0), np.int64)
    reader = _ChunkReader(passages, chunk_size)
    bar = tqdm(total=n, unit="passage", disable=not progress, desc="exact search")
    for start in range(0, n, chunk_size):
        block = reader.read(start, min(start + chunk_size, n))
        check_finite(block, "passage", source, start)
        if passage_transform is not None:
            block = np.asarray(passage_transform(block), dtype=np.float32)
            check_finite(block, "transformed passage", source, start)
        if block.ndim != 2 or block.shape[1] != q.shape[1]:
            raise ValueError(
                f"passage block {block.shape} does not match the query dimension {q.shape[1]}"
            )
        block = np.ascontiguousarray(block)
        if block.size:
            p_norm = max(p_norm, float(np.sqrt(np.einsum("ij,ij->i", block, block).max())))
        new_ids, new_vals = chunk_topk(q, block, kk, start, query_batch)
        keys = merge_topk(keys, rank_keys(new_ids, new_vals), kk)
        bar.update(block.shape[0])
        del block
        reader.done(start, min(start + chunk_size, n))
    bar.close()
    pre_ids, pre_vals = decode_keys(np.sort(keys, axis=1))
    try:
        return _exact_top_k(
            q, reader, pre_ids, pre_vals, k, passage_transform, p_norm, chunk_size, query_batch
        )
    finally:
        reader.close()


class _ChunkReader:
    """How :func:`exact_search` reads the passages: blocks of rows and gathers of rows, with
    resident memory bounded by what the caller holds, not by the corpus.

    A whole read-only ``np.memmap`` larger than one chunk is read with ``pread``
    (:class:`treerank.kernels.rows.FileRows`): blocks into one reused ``chunk_size``-row buffer,
    gathers into their own array, so no page of the map enters the resident set (a map's pages
    stay resident once read, and each fault also maps up to 64 KiB of cached neighbours). Any
    other array (an ndarray, a small map, a view of a map) is sliced as it is, and the pages of a
    read-only map are released after each block (:func:`release_pages`). Either way the bytes
    are the stored ones, so the results are bit-identical.
    """

    def __init__(self, passages: Vecs, chunk_size: int) -> None:
        self.passages = passages
        self.n = int(passages.shape[0])
        self.file = FileRows.of(passages) if self.n > chunk_size else None
        self._buf: F32 | None = None
        self.chunk_size = chunk_size

    def read(self, start: int, stop: int) -> F32:
        """``float32 (stop - start, d)`` rows; with a file reader, a view of the reused buffer
        (valid until the next :meth:`read`)."""
        if self.file is None:
            return np.asarray(self.passages[start:stop], dtype=np.float32)
        if self._buf is None:
            self._buf = np.empty((self.chunk_size, self.file.shape[1]), self.file.dtype)
        return np.asarray(self.file.read(start, stop, self._buf), dtype=np.float32)

    def done(self, start: int, stop: int) -> None:
        """The caller is done with rows ``start .. stop - 1`` (a map's pages are released)."""
        if self.file is None:
            release_pages(self.passages, start, stop)

    def gather(self, ids: I64) -> F32:
        """``float32 (ids.size, d)`` rows ``ids.ravel()`` (any order, repeats allowed)."""
        if self.file is not None:
            return np.asarray(self.file.gather(ids.ravel()), dtype=np.float32)
        rows = np.take(np.asarray(self.passages), ids.ravel(), axis=0)
        release_pages(self.passages, 0, self.n)  # the gathered rows' pages
        return np.asarray(rows, dtype=np.float32)

    def free_buffer(self) -> None:
        """Drop the reused block buffer (a later :meth:`read` allocates it again)."""
        self._buf = None

    def close(self) -> None:
        self.free_buffer()
        if self.file is not None:
            self.file.close()


def _transformed_rows(
    reader: _ChunkReader, ids: I64, transform: Callable[[F32], Vecs] | None
) -> F32:
    rows = reader.gather(ids)
    if transform is not None:
        rows = np.asarray(transform(rows), dtype=np.float32)
    return rows.reshape(*ids.shape, -1)


def _exact_top_k(
    q: F32,
    reader: _ChunkReader,
    pre_ids: I64,
    pre_vals: F32,
    k: int,
    transform: Callable[[F32], Vecs] | None,
    p_norm: float,
    chunk_size: int,
    query_batch: int,
) -> tuple[I64, F32]:
    """The exact top-``k`` by :func:`pair_scores`, from the BLAS preselection ``pre_ids``.

    A query's preselection (its top ``kk`` by BLAS score, tie-exact) holds the whole top-``k``
    by :func:`pair_scores` when its BLAS score at rank ``k`` exceeds the one at rank ``kk`` by
    more than twice the error bound (every passage left out is then beaten by ``k`` kept ones
    under either score). Queries without that margin (near-ties across the cut, constant
    scorers) are rescored over every passage.

    The stored rows are gathered :data:`GATHER_BYTES` at a time (their scores depend on each
    pair alone); with a passage transform, ``query_batch`` queries' rows at a time (the batch
    the transform has always been given).
    """
    reader.free_buffer()  # the gathers below do not need the block buffer
    n = reader.n
    nq, kk = pre_ids.shape
    ids = np.empty((nq, k), np.int64)
    vals = np.empty((nq, k), np.float32)
    step = query_batch
    if transform is None:
        step = max(1, min(query_batch, GATHER_BYTES // max(1, kk * q.shape[1] * 4)))
    for s in range(0, nq, step):
        rows = _transformed_rows(reader, pre_ids[s : s + step], transform)
        exact = pair_scores(q[s : s + step], rows)
        del rows  # before the next gather: one batch of rows held at a time
        b_ids, b_vals = sort_rows(pre_ids[s : s + step], exact)
        ids[s : s + step], vals[s : s + step] = b_ids[:, :k], b_vals[:, :k]
    if kk >= n:
        return ids, vals
    # 2x: the bound for both scores, a second 2x for a learned tower's batch effects
    bound = 4 * dot_error_bound(q.shape[1]) * np.linalg.norm(q, axis=1) * p_norm
    bad = np.flatnonzero(pre_vals[:, k - 1] - pre_vals[:, kk - 1] <= bound)
    for s in range(0, bad.size, query_batch):
        rows_q = bad[s : s + query_batch]
        best = np.empty((rows_q.size, 0), np.int64)
        for start in range(0, n, chunk_size):
            block = reader.read(start, min(start + chunk_size, n))
            if transform is not None:
                block = np.asarray(transform(block), dtype=np.float32)
            b_ids, b_vals = topk_desc(pair_scores(q[rows_q], block), k, start)
            best = merge_topk(best, rank_keys(b_ids, b_vals), k)
            del block
            reader.done(start, min(start + chunk_size, n))
        ids[rows_q], vals[rows_q] = decode_keys(np.sort(best, axis=1))
    return ids, vals
