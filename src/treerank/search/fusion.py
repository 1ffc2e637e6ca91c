"""Fusion of two runs over the same queries: RRF and normalised linear combination.

- ``rrf``: Reciprocal Rank Fusion (Cormack, Clarke & Buettcher, SIGIR 2009):
  ``score(p) = sum_runs 1 / (rrf_k + rank_run(p))`` with ranks from 1 and ``rrf_k = 60``; a
  passage missing from a run gets nothing from it. Weighted RRF (``weight=w``) scores
  ``w / (rrf_k + rank_a) + (1 - w) / (rrf_k + rank_b)``; ``w = 0.5`` ranks exactly like plain RRF.
- ``linear``: ``w * norm(a) + (1 - w) * norm(b)`` (DPR's hybrid, Karpukhin et al. 2020, with the
  per-query normalisations of ranx): ``norm`` is ``"minmax"`` (scores mapped to [0, 1] within the
  query's retrieved list) or ``"zscore"`` (mean 0, standard deviation 1 within that list).

**Only what a run really retrieved earns credit** (issue 10, item 8). A run lists fewer than ``k``
passages when the system found fewer (BM25 lists only passages with a positive score; ``-1`` ids
and ``-inf`` scores pad the row). A passage missing from a run gets that run's lowest normalised
score for the query: 0 with min-max, the lowest z-score with z-score, i.e. never more than the
run's worst retrieved passage. A row whose retrieved scores are all equal (a single hit included)
normalises them to 1 (min-max) or 0 (z-score) and its missing passages to 0 or -1, so a single hit
stays above every passage the run missed. A query for which a run retrieved nothing gets no
contribution from that run.

``weight`` may be one float or a ``float (n_queries,)`` array (one weight per query, as
query-adaptive fusion predicts). Fused rows are sorted by fused score, ties by ascending passage
id, cut to ``k``; they hold only passages that at least one run retrieved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from treerank.kernels.topk import RUN_DEPTH, decode_keys, rank_keys
from treerank.kernels.vectors import F32, F64, I64
from treerank.search.run import Run

DEFAULT_RRF_K = 60


def rrf_contrib(run: Run, rrf_k: int = DEFAULT_RRF_K) -> F64:
    """``float64 (nq, k)`` ``1 / (rrf_k + rank)`` of each retrieved passage (0 on padding).

    Ranks count retrieved passages only (padding never shifts a rank)."""
    v = _valid(run)
    ranks = np.cumsum(v, axis=1, dtype=np.float64)
    return np.where(v, 1.0 / (rrf_k + ranks), 0.0)


def _valid(run: Run) -> npt.NDArray[np.bool_]:
    return (run.ids >= 0) & np.isfinite(run.scores)


def _retrieved_ids(run: Run) -> I64:
    """``int64 (nq, k)`` the run's ids with ``-1`` wherever nothing was retrieved."""
    return np.where(_valid(run), run.ids, -1)


def minmax_norm(run: Run) -> F64:
    """``float64 (nq, k)`` scores mapped to [0, 1] per query over the retrieved entries (all 1
    when they are equal, e.g. a single hit); 0 on padding."""
    s = run.scores.astype(np.float64)
    v = _valid(run)
    lo = np.where(v, s, np.inf).min(axis=1, keepdims=True)
    hi = np.where(v, s, -np.inf).max(axis=1, keepdims=True)
    span = hi - lo
    out = np.divide(s - lo, span, out=np.ones_like(s), where=(span > 0) & v)
    return np.where(v, out, 0.0)


def zscore_norm(run: Run) -> F64:
    """``float64 (nq, k)`` scores standardised per query over the retrieved entries (population
    standard deviation; 0 when they are equal, e.g. a single hit); 0 on padding."""
    s = run.scores.astype(np.float64)
    v = _valid(run)
    n = np.maximum(v.sum(axis=1, keepdims=True), 1)
    mu = np.where(v, s, 0).sum(axis=1, keepdims=True) / n
    sd = np.sqrt(np.where(v, (s - mu) ** 2, 0).sum(axis=1, keepdims=True) / n)
    out = np.divide(s - mu, sd, out=np.zeros_like(s), where=(sd > 0) & v)
    return np.where(v, out, 0.0)


FusionMethod = Literal["rrf", "linear"]
"""How two runs are fused: Reciprocal Rank Fusion or a weighted sum of normalised scores."""
FUSION_METHOD_NAMES: tuple[FusionMethod, ...] = get_args(FusionMethod)
Normalisation = Literal["minmax", "zscore"]
"""How linear fusion normalises each run's scores per query."""

NORMALISATIONS: dict[Normalisation, Callable[[Run], F64]] = {
    "minmax": minmax_norm,
    "zscore": zscore_norm,
}


def missing_fill(run: Run, normed: F64, norm: str) -> F64:
    """``float64 (nq,)`` the normalised score a passage absent from ``run`` gets, per query.

    The run's lowest normalised retrieved score; one below it when the retrieved scores are all
    equal (min-max: 0 below the constant 1; z-score: -1 below the constant 0); 0 when the run
    retrieved nothing for the query (see module docstring).
    """
    v = _valid(run)
    s = run.scores.astype(np.float64)
    lo = np.where(v, normed, np.inf).min(axis=1)
    raw_lo = np.where(v, s, np.inf).min(axis=1)
    raw_hi = np.where(v, s, -np.inf).max(axis=1)
    any_hit = v.any(axis=1)
    constant = any_hit & (raw_hi <= raw_lo)
    if norm == "minmax":
        return np.where(any_hit, np.where(constant, 0.0, lo), 0.0)
    return np.where(any_hit, np.where(constant, lo - 1.0, lo), 0.0)


def _weights(weight: float | F64, nq: int) -> F64:
    w = np.broadcast_to(np.asarray(weight, dtype=np.float64), (nq,)).copy()
    if not np.all((w >= 0.0) & (w <= 1.0)):
        bad = w[~((w >= 0.0) & (w <= 1.0))][0]
        raise ValueError(f"fusion weight must be in [0, 1], got {bad}")
    return w


def _fuse(
    ids_a: I64,
    sa: F64,
    fill_a: F64,
    ids_b: I64,
    sb: F64,
    fill_b: F64,
    k: int,
) -> tuple[I64, F32]:
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


def rrf(
    a: Run,
    b: Run,
    k: int = RUN_DEPTH,
    rrf_k: int = DEFAULT_RRF_K,
    name: str | None = None,
    weight: float | F64 | None = None,
) -> Run:
    """Reciprocal Rank Fusion of two runs (see module docstring).

    Args:
        weight: ``None`` = plain RRF (both runs weigh 1); else ``w`` weighs ``a`` and ``1 - w``
            weighs ``b`` (one float or ``float (n_queries,)``).

    Raises:
        ValueError: the runs have different numbers of queries; a weight outside [0, 1]; an
            ``rrf_k`` that is not > 0 (``1 / (rrf_k + rank)`` must stay finite and decreasing).
    """
    _check(a, b)
    if not rrf_k > 0:
        raise ValueError(f"the RRF constant k must be > 0, got {rrf_k}")
    zero = np.zeros(a.n_queries)
    wa = np.ones(a.n_queries) if weight is None else _weights(weight, a.n_queries)
    wb = np.ones(a.n_queries) if weight is None else 1.0 - wa
    ids, sc = _fuse(
        _retrieved_ids(a),
        wa[:, None] * rrf_contrib(a, rrf_k),
        zero,
        _retrieved_ids(b),
        wb[:, None] * rrf_contrib(b, rrf_k),
        zero,
        k,
    )
    return Run(name or f"rrf({a.name},{b.name})", ids, sc)


def linear_fusion(
    a: Run,
    b: Run,
    k: int = RUN_DEPTH,
    weight: float | F64 = 0.5,
    norm: str = "minmax",
    name: str | None = None,
) -> Run:
    """``weight * norm(a) + (1 - weight) * norm(b)`` per passage (see module docstring).

    Args:
        weight: weight of ``a`` in [0, 1], one float or ``float (n_queries,)``.

    Raises:
        ValueError: different numbers of queries, a weight outside [0, 1], unknown ``norm``.
    """
    _check(a, b)
    w = _weights(weight, a.n_queries)
    if norm not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation {norm!r}; known: {', '.join(NORMALISATIONS)}")
    na, nb = NORMALISATIONS[norm](a), NORMALISATIONS[norm](b)
    fill_a = missing_fill(a, na, norm) * w
    fill_b = missing_fill(b, nb, norm) * (1.0 - w)
    ids, sc = _fuse(
        _retrieved_ids(a),
        w[:, None] * na,
        fill_a,
        _retrieved_ids(b),
        (1.0 - w)[:, None] * nb,
        fill_b,
        k,
    )
    label = f"{weight}" if np.ndim(weight) == 0 else "per-query"
    return Run(name or f"linear({a.name},{b.name},w={label})", ids, sc)


FUSION_METHODS = {"rrf": rrf, "linear": linear_fusion}


def _check(a: Run, b: Run) -> None:
    if a.n_queries != b.n_queries:
        raise ValueError(
            f"cannot fuse {a.name!r} ({a.n_queries} queries) with {b.name!r} ({b.n_queries})"
        )
