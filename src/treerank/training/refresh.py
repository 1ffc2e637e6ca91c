"""Model-refreshed hard negatives (ANCE-style), guarded by the measured false-negative audit.

ANCE (Xiong et al., 2021, "Approximate Nearest Neighbor Negative Contrastive Learning for Dense
Text Retrieval") re-mines each training query's hard negatives with the model being trained, so
the negatives stay hard as the model improves. Every ``refresh_every`` steps
:class:`NegativeRefresher`:

1. ranks every passage of the split for the training queries with the current model (a
   ``mine(model)`` callback: the pipeline passes the exact top-k search, so this layer needs no
   search code), labelled passages included;
2. audits that raw ranking on the labelled queries
   (:func:`~treerank.training.audit.false_negative_curve`): ``f(r)``, the share of rank-``r``
   passages that are labelled positives, and the guard depth it implies at ``max_rate``;
3. drops labelled passages and the first ``guard_depth`` ranks (where unlabelled positives
   crowd, by the audit's assumption) and hands the sampler the new pool.

The guard therefore follows the model: as the model ranks positives higher, the audit moves the
guard, instead of a fixed "skip the first 3 BM25 ranks".

**Refresh on a measured change** (``rate_change``): re-mining every query of a large split every
``refresh_every`` steps is the expensive part, and pointless while the model ranks much as it did
at the last refresh. With ``rate_change`` set, each call first audits the model's ranking of the
audit queries only (``audit_mine``, a few thousand queries at most) and re-mines the whole pool
only when the measured false-negative rate at rank 1, ``f(1)``, moved by more than
``rate_change`` since the pool was mined, or the guard depth the audit implies changed; the first
call always mines. ``refresh_every`` then sets how often the cheap check runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from treerank.training.audit import DEFAULT_MAX_RATE, false_negative_curve
from treerank.training.sampler import ContrastiveSampler, guard_mined_negatives, hard_negative_pool

__all__ = ["NegativeRefresher"]

Miner = Callable[[Any], np.ndarray]
"""``mine(model) -> int64 (n_queries, R)``: the model's top-``R`` passage ids of every query of
the split (row = query id), best first, labelled passages included."""


class NegativeRefresher:
    """Re-mine a :class:`ContrastiveSampler`'s hard-negative pool with the current model.

    Args:
        sampler: the sampler whose ``hard_pool`` is replaced.
        candidates, labels: ``int32 / uint8 (nq, K)`` the split's labels.
        mine: the :data:`Miner` callback.
        relevance_threshold: grade ``>=`` this is a positive.
        max_rate: the audit's per-rank tolerance (the guard depth is chosen from it).
        pool_depth: keep the first this-many valid negatives per query.
        audit_rows: labelled queries the audit is measured on (None: all labelled ones).
        rate_change: re-mine only when ``f(1)`` of the audit moved by more than this (absolute)
            since the last mining, or its guard depth changed (None: re-mine on every call).
        audit_mine: ``audit_mine(model) -> int64 (len(audit_rows), R)``: the model's ranking of
            the audit queries only, used by the ``rate_change`` check (None: rows of
            ``mine(model)``, which saves nothing).

    Raises:
        ValueError: ``rate_change < 0``.
    """

    def __init__(
        self,
        sampler: ContrastiveSampler,
        candidates: np.ndarray,
        labels: np.ndarray,
        mine: Miner,
        *,
        relevance_threshold: int = 1,
        max_rate: float = DEFAULT_MAX_RATE,
        pool_depth: int | None = 30,
        audit_rows: np.ndarray | None = None,
        rate_change: float | None = None,
        audit_mine: Miner | None = None,
    ) -> None:
        if rate_change is not None and rate_change < 0:
            raise ValueError(f"refresh: rate_change must be >= 0, got {rate_change}")
        self.sampler = sampler
        self.candidates = np.asarray(candidates)
        self.labels = np.asarray(labels)
        self.mine = mine
        self.threshold = int(relevance_threshold)
        self.max_rate = float(max_rate)
        self.pool_depth = pool_depth
        self.audit_rows = audit_rows
        self.rate_change = rate_change
        self.audit_mine = audit_mine
        self.history: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self._mined: tuple[float, int] | None = None  # (f(1), guard depth) of the last mining

    def _rows(self) -> np.ndarray:
        if self.audit_rows is None:
            return np.arange(self.candidates.shape[0])
        return np.asarray(self.audit_rows, dtype=np.int64)

    def _audit(self, ranked_rows: np.ndarray, rows: np.ndarray, step: int) -> Any:
        return false_negative_curve(
            ranked_rows,
            self.candidates,
            self.labels,
            relevance_threshold=self.threshold,
            query_rows=rows,
            miner=f"model@{step}",
            max_rate=self.max_rate,
        )

    def __call__(self, model: Any, step: int) -> dict[str, Any]:
        """Mine, audit, guard and install the new pool (with ``rate_change``: only when the
        audit's measurement changed); returns what the log records (``refreshed``: whether
        the pool was re-mined)."""
        rows = self._rows()
        if self.rate_change is not None and self._mined is not None:
            if self.audit_mine is not None:
                check = self._audit(np.asarray(self.audit_mine(model), np.int64), rows, step)
            else:
                check = self._audit(np.asarray(self.mine(model), np.int64)[rows], rows, step)
            rate1, guard = float(check.rate[0]), int(check.guard_depth)
            moved = abs(rate1 - self._mined[0]) > self.rate_change or guard != self._mined[1]
            self.checks.append({"step": int(step), "fn_rate_at_1": rate1, "guard_depth": guard})
            if not moved:
                return {
                    "step": int(step),
                    "refreshed": False,
                    "guard_depth": guard,
                    "fn_rate_at_1": rate1,
                    "fn_rate_at_1_mined": self._mined[0],
                }
        ranked = np.asarray(self.mine(model), dtype=np.int64)  # (nq, R)
        if ranked.shape[0] != self.candidates.shape[0]:
            raise ValueError(
                f"refresh: the miner returned {ranked.shape[0]} rows for "
                f"{self.candidates.shape[0]} queries"
            )
        curve = self._audit(ranked[rows], rows, step)
        guarded = guard_mined_negatives(ranked, skip_top=curve.guard_depth)
        pool = hard_negative_pool(self.candidates, self.labels, guarded, "mined", self.pool_depth)
        self.sampler.hard_pool = pool if pool.shape[1] else None
        self._mined = (float(curve.rate[0]), int(curve.guard_depth))
        info = {
            "step": int(step),
            "refreshed": True,
            "guard_depth": curve.guard_depth,
            "fn_rate_at_1": float(curve.rate[0]),
            "fn_rate_in_pool": curve.residual_rate(curve.guard_depth),
            "mean_pool_size": float((pool >= 0).sum(axis=1).mean()) if pool.size else 0.0,
        }
        self.history.append(info)
        return info
