"""Fusion of two runs over the same queries: RRF and normalised linear combination.

- ``rrf``: Reciprocal Rank Fusion (Cormack, Clarke & Buettcher, SIGIR 2009):
  ``score(p) = sum_runs 1 / (rrf_k + rank_run(p))`` with ranks from 1 and ``rrf_k = 60``; a
  passage missing from a run gets nothing from it.
- ``linear``: ``w * norm(a) + (1 - w) * norm(b)`` (DPR's hybrid, Karpukhin et al. 2020, with the
  per-query normalisations of ranx): ``norm`` is ``"minmax"`` (scores mapped to [0, 1] within the
  query's retrieved list) or ``"zscore"`` (mean 0, standard deviation 1 within that list). A
  passage missing from one run gets that run's lowest normalised score for the query (0 for
  min-max), i.e. it counts as that run's worst retrieved passage.

Fused rows are sorted by fused score, ties by ascending passage id, cut to ``k``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from treerank.kernels.topk import decode_keys, rank_keys
from treerank.search.run import Run

DEFAULT_RRF_K = 60


def rrf_contrib(run: Run, rrf_k: int = DEFAULT_RRF_K) -> np.ndarray:
    """``float64 (nq, k)`` ``1 / (rrf_k + rank)`` of each retrieved passage (0 on padding)."""
    ranks = np.arange(1, run.k + 1, dtype=np.float64)
    return np.where(run.ids >= 0, 1.0 / (rrf_k + ranks)[None, :], 0.0)


def _valid(run: Run) -> np.ndarray:
    return (run.ids >= 0) & np.isfinite(run.scores)


def minmax_norm(run: Run) -> np.ndarray:
    """``float64 (nq, k)`` scores mapped to [0, 1] per query (all 1 when a row is constant)."""
    s = run.scores.astype(np.float64)
    v = _valid(run)
    lo = np.where(v, s, np.inf).min(axis=1, keepdims=True)
    hi = np.where(v, s, -np.inf).max(axis=1, keepdims=True)
    span = hi - lo
    out = np.divide(s - lo, span, out=np.ones_like(s), where=(span > 0) & v)
    return np.where(v, out, 0.0)


def zscore_norm(run: Run) -> np.ndarray:
    """``float64 (nq, k)`` scores standardised per query over the retrieved list (0 if constant)."""
    s = run.scores.astype(np.float64)
    v = _valid(run)
    n = np.maximum(v.sum(axis=1, keepdims=True), 1)
    mu = np.where(v, s, 0).sum(axis=1, keepdims=True) / n
    sd = np.sqrt(np.where(v, (s - mu) ** 2, 0).sum(axis=1, keepdims=True) / n)
    out = np.divide(s - mu, sd, out=np.zeros_like(s), where=(sd > 0) & v)
    return np.where(v, out, 0.0)


NORMALISATIONS: dict[str, Callable[[Run], np.ndarray]] = {
    "minmax": minmax_norm,
    "zscore": zscore_norm,
}


def _fuse(
    ids_a: np.ndarray,
    sa: np.ndarray,
    fill_a: np.ndarray,
    ids_b: np.ndarray,
    sb: np.ndarray,
    fill_b: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Sum per-passage contributions of two runs; a passage missing from a run gets its fill."""
    nq = ids_a.shape[0]
    q = np.concatenate(
        [np.repeat(np.arange(nq), ids_a.shape[1]), np.repeat(np.arange(nq), ids_b.shape[1])]
    ).astype(np.int64)
    pid = np.concatenate([ids_a.ravel(), ids_b.ravel()])
    # value from a, value from b (NaN where absent)
    va = np.concatenate([sa.ravel(), np.full(ids_b.size, np.nan)])
    vb = np.concatenate([np.full(ids_a.size, np.nan), sb.ravel()])
    keep = pid >= 0
    q, pid, va, vb = q[keep], pid[keep], va[keep], vb[keep]
    key = (q << 32) | pid
    uk, inv = np.unique(key, return_inverse=True)
    got_a = np.full(uk.size, np.nan)
    got_b = np.full(uk.size, np.nan)
    ma, mb = ~np.isnan(va), ~np.isnan(vb)
    got_a[inv[ma]] = va[ma]
    got_b[inv[mb]] = vb[mb]
    uq = uk >> 32
    fused = np.where(np.isnan(got_a), fill_a[uq], got_a) + np.where(
        np.isnan(got_b), fill_b[uq], got_b
    )
    # pad per query into a dense matrix, then rank with (score desc, id asc) keys
    counts = np.bincount(uq, minlength=nq)
    width = max(int(counts.max(initial=0)), 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    col = np.arange(uk.size) - starts[uq]
    ids = np.full((nq, width), -1, np.int64)
    sc = np.full((nq, width), -np.inf, np.float32)
    ids[uq, col] = uk & 0xFFFFFFFF
    sc[uq, col] = fused.astype(np.float32)
    ids, sc = decode_keys(np.sort(rank_keys(ids, sc), axis=1))
    k = min(k, width)
    return ids[:, :k], sc[:, :k]


def rrf(a: Run, b: Run, k: int = 1000, rrf_k: int = DEFAULT_RRF_K, name: str | None = None) -> Run:
    """Reciprocal Rank Fusion of two runs (see module docstring).

    Raises:
        ValueError: the runs have different numbers of queries.
    """
    _check(a, b)
    zero = np.zeros(a.n_queries)
    ids, sc = _fuse(a.ids, rrf_contrib(a, rrf_k), zero, b.ids, rrf_contrib(b, rrf_k), zero, k)
    return Run(name or f"rrf({a.name},{b.name})", ids, sc)


def linear_fusion(
    a: Run,
    b: Run,
    k: int = 1000,
    weight: float = 0.5,
    norm: str = "minmax",
    name: str | None = None,
) -> Run:
    """``weight * norm(a) + (1 - weight) * norm(b)`` per passage (see module docstring).

    Raises:
        ValueError: different numbers of queries, ``weight`` outside [0, 1], unknown ``norm``.
    """
    _check(a, b)
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"fusion weight must be in [0, 1], got {weight}")
    if norm not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation {norm!r}; known: {', '.join(NORMALISATIONS)}")
    na, nb = NORMALISATIONS[norm](a), NORMALISATIONS[norm](b)
    fill_a = np.where(_valid(a), na, np.inf).min(axis=1)
    fill_b = np.where(_valid(b), nb, np.inf).min(axis=1)
    fill_a = np.where(np.isfinite(fill_a), fill_a, 0.0) * weight
    fill_b = np.where(np.isfinite(fill_b), fill_b, 0.0) * (1.0 - weight)
    ids, sc = _fuse(a.ids, weight * na, fill_a, b.ids, (1.0 - weight) * nb, fill_b, k)
    return Run(name or f"linear({a.name},{b.name},w={weight})", ids, sc)


FUSION_METHODS = {"rrf": rrf, "linear": linear_fusion}


def _check(a: Run, b: Run) -> None:
    if a.n_queries != b.n_queries:
        raise ValueError(
            f"cannot fuse {a.name!r} ({a.n_queries} queries) with {b.name!r} ({b.n_queries})"
        )
