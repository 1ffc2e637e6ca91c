"""False-negative audit of a negative miner: where do relevant passages sit in its ranking?

A miner (BM25, the frozen cosine, a trained checkpoint) ranks every passage of the split for a
query; hard negatives are drawn from the top of that ranking after the query's *labelled*
positives are removed. The passages that are relevant but unlabelled stay in the pool as false
negatives, and nothing in the labels says where they are. The audit uses the labelled positives
of labelled queries as the stand-in: for each rank ``r`` it measures

    f(r) = (# queries whose rank-r passage is one of their labelled positives)
           / (# queries with a passage at rank r)

i.e. the chance that a miner that did not know the labels would have taken a positive as its
rank-``r`` negative. The assumption (stated in every report): an unlabelled relevant passage
ranks like a labelled one, so the *shape* of ``f`` says how deep the false negatives go. The
cumulative rate ``F(r) = (hits in ranks 1..r) / (slots in ranks 1..r)`` is the fraction of the
miner's top-``r`` negatives that are positives.

The **guard depth** chosen from the curve is the smallest ``d`` such that ``f(r) <= max_rate``
for every rank ``r > d``: skipping the first ``d`` ranks of each mined list
(``guard_mined_negatives(skip_top=d)``) leaves a pool whose per-rank false-negative rate never
exceeds ``max_rate``.

Reference: Qu et al. (2021), "RocketQA" (false negatives among mined hard negatives); Xiong et
al. (2021), "ANCE" (negatives re-mined with the current model, whose false negatives move).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treerank.training.sampler import relevant_lists

__all__ = ["DEFAULT_MAX_RATE", "AuditCurve", "false_negative_curve", "guard_depth"]

DEFAULT_MAX_RATE = 0.02


@dataclass
class AuditCurve:
    """A miner's false-negative curve over ranks ``1..R``.

    Attributes:
        miner: the miner's name (a system spec).
        hits: ``int64 (R,)`` queries whose rank-``r`` passage is a labelled positive.
        slots: ``int64 (R,)`` queries that have a passage at rank ``r`` (and at least one
            labelled positive).
        n_queries: queries audited (with at least one labelled positive).
        n_positives: labelled positives of those queries.
        max_rate: the tolerance the guard depth was chosen with.
        guard_depth: :func:`guard_depth` of the curve at ``max_rate``.
        meta: free-form provenance.
    """

    miner: str
    hits: np.ndarray
    slots: np.ndarray
    n_queries: int
    n_positives: int
    max_rate: float = DEFAULT_MAX_RATE
    guard_depth: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        """``R``: ranks audited."""
        return int(self.hits.size)

    @property
    def rate(self) -> np.ndarray:
        """``float64 (R,)`` ``f(r)``: per-rank fraction of mined passages that are positives."""
        return self.hits / np.maximum(self.slots, 1)

    @property
    def cumulative_rate(self) -> np.ndarray:
        """``float64 (R,)`` ``F(r)``: share of the top-``r`` mined passages that are positives."""
        return np.cumsum(self.hits) / np.maximum(np.cumsum(self.slots), 1)

    @property
    def recall(self) -> np.ndarray:
        """``float64 (R,)``: share of all labelled positives found in the top ``r``."""
        return np.cumsum(self.hits) / max(self.n_positives, 1)

    def residual_rate(self, skip_top: int, pool_depth: int | None = None) -> float:
        """False-negative rate of the pool ``(skip_top, pool_depth]`` (ranks, 1-based)."""
        stop = self.depth if pool_depth is None else min(pool_depth, self.depth)
        h, s = self.hits[skip_top:stop].sum(), self.slots[skip_top:stop].sum()
        return float(h / s) if s else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the whole curve included)."""
        marks = [r for r in (1, 3, 5, 10, 20, 30, 50, 100, 200, 1000) if r <= self.depth]
        return {
            "miner": self.miner,
            "n_queries": self.n_queries,
            "n_positives": self.n_positives,
            "depth": self.depth,
            "max_rate": self.max_rate,
            "guard_depth": self.guard_depth,
            "rate_at": {str(r): float(self.rate[r - 1]) for r in marks},
            "cumulative_rate_at": {str(r): float(self.cumulative_rate[r - 1]) for r in marks},
            "recall_at": {str(r): float(self.recall[r - 1]) for r in marks},
            "residual_rate_after_guard": self.residual_rate(self.guard_depth),
            "hits": self.hits.tolist(),
            "slots": self.slots.tolist(),
            "meta": dict(self.meta),
        }


def false_negative_curve(
    ranked: np.ndarray,
    candidates: np.ndarray,
    labels: np.ndarray,
    *,
    relevance_threshold: int = 1,
    query_rows: np.ndarray | None = None,
    miner: str = "miner",
    max_rate: float = DEFAULT_MAX_RATE,
) -> AuditCurve:
    """The false-negative curve of one miner's ranking (see the module docstring).

    Args:
        ranked: ``int (nq, R)`` passage ids of each query's top-``R`` in rank order, ``-1``
            padding; the miner's raw ranking (labelled passages **not** removed). Row ``i`` is
            query ``query_rows[i]`` (or query ``i`` when ``query_rows`` is None).
        candidates: ``int32 (n_all, K)`` labelled passage ids of every query of the split.
        labels: ``uint8 (n_all, K)`` grades.
        relevance_threshold: grade ``>=`` this is a positive.
        query_rows: ``int (nq,)`` the split's query ids of ``ranked``'s rows (None: ``0..nq-1``).
        miner: name recorded in the curve.
        max_rate: tolerance for :func:`guard_depth`.

    Returns:
        :class:`AuditCurve` over the queries with at least one labelled positive.

    Raises:
        ValueError: ``ranked`` is not 2-D or its rows do not match ``query_rows``.
    """
    ranked = np.asarray(ranked, dtype=np.int64)
    if ranked.ndim != 2:
        raise ValueError(f"audit: ranked must be (n_queries, R), got shape {ranked.shape}")
    rows = np.arange(ranked.shape[0]) if query_rows is None else np.asarray(query_rows, np.int64)
    if rows.shape != (ranked.shape[0],):
        raise ValueError(f"audit: {ranked.shape[0]} ranked rows for {rows.size} query ids")
    relevant, _ = relevant_lists(np.asarray(candidates), np.asarray(labels), relevance_threshold)
    rel = relevant[rows]  # (nq, K)
    keep = (rel >= 0).any(axis=1)
    ranked, rel = ranked[keep], rel[keep]
    hit = np.zeros(ranked.shape, dtype=bool)
    for s in range(0, ranked.shape[0], 4096):  # (b, R, K) comparison in blocks
        r_b, l_b = ranked[s : s + 4096, :, None], rel[s : s + 4096, None, :]
        hit[s : s + 4096] = ((r_b == l_b) & (l_b >= 0)).any(axis=2)
    hits = hit.sum(axis=0).astype(np.int64)
    slots = (ranked >= 0).sum(axis=0).astype(np.int64)
    curve = AuditCurve(
        miner=miner,
        hits=hits,
        slots=slots,
        n_queries=int(keep.sum()),
        n_positives=int((rel >= 0).sum()),
        max_rate=float(max_rate),
    )
    curve.guard_depth = guard_depth(curve.rate, max_rate)
    return curve


def guard_depth(rate: np.ndarray, max_rate: float = DEFAULT_MAX_RATE) -> int:
    """Smallest ``d`` with ``rate[r] <= max_rate`` for every rank ``r > d`` (1-based ranks).

    Args:
        rate: ``float (R,)`` per-rank false-negative rate ``f(1..R)``.
        max_rate: tolerated per-rank rate, in ``[0, 1]``.

    Returns:
        ``d`` in ``[0, R]``: the number of leading ranks a guard must skip.

    Raises:
        ValueError: ``max_rate`` outside ``[0, 1]``.
    """
    if not 0.0 <= max_rate <= 1.0:
        raise ValueError(f"audit: max_rate must be in [0, 1], got {max_rate}")
    over = np.flatnonzero(np.asarray(rate) > max_rate)
    return int(over[-1]) + 1 if over.size else 0
