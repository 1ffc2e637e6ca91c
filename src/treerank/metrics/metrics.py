"""Ranking metrics as vectorised kernels over a ``(n_queries, k)`` matrix of retrieved grades.

Definitions (all per query, then averaged over the *evaluated* queries):

- ``mrr@k``: reciprocal rank of the best-ranked relevant passage (grade ``>=`` threshold), 0 if
  none is in the top ``k`` (the TreeRank seed's MRR@10; MS MARCO's official MRR@10).
- ``ndcg@k``: ``DCG@k / IDCG@k`` with ``DCG = sum_r gain(grade_r) / log2(r + 1)`` (Jarvelin &
  Kekalainen 2002). ``gain="linear"`` (default) uses the grade itself, as ``trec_eval``'s
  ``ndcg_cut``, pytrec_eval and ir-measures' ``nDCG@k`` do (all grades > 0 count, whatever the
  threshold); ``gain="exp"`` uses ``2**grade - 1`` (Burges et al. 2005). IDCG ranks all the
  query's judged passages by grade. On binary labels both gains agree.
- ``recall@k``: relevant passages in the top ``k`` / relevant passages of the query.
- ``success@k`` (alias ``hit@k``): 1 if any relevant passage is in the top ``k``.
- ``precision@k``: relevant passages in the top ``k`` / ``k``.

**Left-out queries.** A query with no relevant passage (no grade ``>=`` threshold) is left out of
every metric's mean (the seed's rule; ``trec_eval`` would count it as 0) and reported in
``n_left_out``; its per-query values are NaN. Using one query set for all metrics keeps paired
comparisons between systems and metrics on the same queries.

Parity: per-query values equal ir-measures / pytrec_eval (``RR(rel=t)@10``, ``nDCG@10``,
``R(rel=t)@100``) to 1e-6 on the evaluated queries when the run's rows are in score order without
ties (``trec_eval`` re-sorts runs by score and breaks ties by descending doc id).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeGuard, get_args

import numpy as np
import numpy.typing as npt

from treerank.metrics.qrels import Qrels

DEFAULT_METRICS = ("mrr@10", "ndcg@10", "recall@100", "recall@1000")
HEADLINE_METRIC = "ndcg@10"


def headline_metric(metrics: Sequence[str]) -> str:
    """The one metric a summary leads with: ``ndcg@10`` when it is evaluated, else the first.

    The one place this rule lives (reports, ``treerank evaluate`` / ``run`` summaries, sweeps).

    Raises:
        ValueError: no metric at all.
    """
    if not metrics:
        raise ValueError("no metric to lead a summary with")
    return HEADLINE_METRIC if HEADLINE_METRIC in metrics else str(metrics[0])


_BLOCK = 8192  # queries graded at once
Grades = npt.NDArray[np.int16 | np.int32 | np.int64]
"""``int16`` / ``int32`` / ``int64 (nq, k)`` grades of retrieved passages in rank order (or
judged grades sorted descending, or ``(nq,)`` counts)."""
PerQuery = npt.NDArray[np.float64]
"""``float64 (nq,)`` one metric value per query."""
Gain = Literal["linear", "exp"]
"""nDCG gain: ``"linear"`` (the grade; trec_eval) or ``"exp"`` (``2**grade - 1``)."""
GAINS: tuple[Gain, ...] = get_args(Gain)


def is_gain(value: str) -> TypeGuard[Gain]:
    """Whether ``value`` is one of :data:`GAINS`."""
    return value in GAINS


class HasIds(Protocol):
    """A run (``treerank.search.run.Run``) as the metrics read it: its ``int64 (nq, k)`` ids."""

    @property
    def ids(self) -> npt.NDArray[np.int64]: ...


def rr_at(grades: Grades, cutoff: int, threshold: int) -> PerQuery:
    """Reciprocal rank of the first relevant passage within ``cutoff``.

    Args:
        grades: ``int64 (nq, k)`` grade of each retrieved passage, rank order.
        cutoff: depth (10 for MRR@10).
        threshold: grade ``>=`` this is relevant.

    Returns:
        ``float64 (nq,)``; 0 where no relevant passage is in the top ``cutoff``.
    """
    rel = grades[:, :cutoff] >= threshold
    first = rel.argmax(axis=1)
    return np.where(rel.any(axis=1), 1.0 / (first + 1.0), 0.0)


def _gain(grades: Grades, gain: Gain) -> PerQuery:
    g = np.maximum(grades, 0).astype(np.float64)
    return g if gain == "linear" else np.exp2(g) - 1.0


def ndcg_at(grades: Grades, ideal: Grades, cutoff: int, gain: str = "linear") -> PerQuery:
    """nDCG@``cutoff`` with log2 discount.

    Args:
        grades: ``int64 (nq, k)`` grade of each retrieved passage, rank order.
        ideal: ``int64 (nq, >= cutoff)`` each query's judged grades sorted descending.
        cutoff: depth.
        gain: ``"linear"`` (grade; trec_eval) or ``"exp"`` (``2**grade - 1``).

    Returns:
        ``float64 (nq,)``; 0 where IDCG is 0.
    """
    if not is_gain(gain):
        raise ValueError(f"unknown nDCG gain {gain!r}; known: {', '.join(GAINS)}")
    g = grades[:, :cutoff]
    disc = 1.0 / np.log2(np.arange(2, cutoff + 2, dtype=np.float64))
    dcg = (_gain(g, gain) * disc[: g.shape[1]]).sum(axis=1)
    idcg = (_gain(ideal[:, :cutoff], gain) * disc[: min(cutoff, ideal.shape[1])]).sum(axis=1)
    return np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0)


def recall_at(grades: Grades, n_relevant: Grades, cutoff: int, threshold: int) -> PerQuery:
    """Fraction of the query's relevant passages retrieved in the top ``cutoff``.

    Returns:
        ``float64 (nq,)``; 0 where ``n_relevant`` is 0.
    """
    hits = (grades[:, :cutoff] >= threshold).sum(axis=1).astype(np.float64)
    return np.divide(hits, n_relevant, out=np.zeros_like(hits), where=n_relevant > 0)


def success_at(grades: Grades, cutoff: int, threshold: int) -> PerQuery:
    """``float64 (nq,)`` 1.0 where a relevant passage is in the top ``cutoff``, else 0.0."""
    return np.asarray((grades[:, :cutoff] >= threshold).any(axis=1), dtype=np.float64)


def precision_at(grades: Grades, cutoff: int, threshold: int) -> PerQuery:
    """``float64 (nq,)`` relevant passages in the top ``cutoff`` divided by ``cutoff``."""
    return np.asarray((grades[:, :cutoff] >= threshold).sum(axis=1) / float(cutoff), np.float64)


@dataclass
class _Inputs:
    grades: Grades
    ideal: Grades
    n_relevant: Grades
    threshold: int
    gain: Gain


_METRICS: dict[str, Callable[[_Inputs, int], PerQuery]] = {
    "mrr": lambda x, c: rr_at(x.grades, c, x.threshold),
    "ndcg": lambda x, c: ndcg_at(x.grades, x.ideal, c, x.gain),
    "recall": lambda x, c: recall_at(x.grades, x.n_relevant, c, x.threshold),
    "success": lambda x, c: success_at(x.grades, c, x.threshold),
    "hit": lambda x, c: success_at(x.grades, c, x.threshold),
    "precision": lambda x, c: precision_at(x.grades, c, x.threshold),
}
METRIC_NAMES = tuple(_METRICS)
_NAME = re.compile(r"^([a-z]+)@(\d+)$")


def parse_metric(name: str) -> tuple[str, int]:
    """``"ndcg@10"`` -> ``("ndcg", 10)``.

    Raises:
        ValueError: not ``<metric>@<k>`` with a known metric and ``k >= 1``.
    """
    m = _NAME.match(name.strip().lower())
    if not m or m.group(1) not in _METRICS or int(m.group(2)) < 1:
        raise ValueError(
            f"bad metric {name!r}: expected <metric>@<k> with metric in {', '.join(METRIC_NAMES)}"
        )
    return m.group(1), int(m.group(2))


@dataclass
class EvalResult:
    """Per-query and mean metric values of one run.

    Attributes:
        per_query: metric name -> ``float64 (n_queries,)``, NaN on left-out queries.
        mean: metric name -> mean over the evaluated queries (NaN if none).
        n_evaluated: queries with at least one relevant passage.
        n_left_out: queries without one (left out of every mean).
        evaluated: ``bool (n_queries,)`` which queries were evaluated.
        relevance_threshold: the threshold used; ``gain``: the nDCG gain.
    """

    per_query: dict[str, PerQuery]
    mean: dict[str, float]
    n_evaluated: int
    n_left_out: int
    evaluated: npt.NDArray[np.bool_]
    relevance_threshold: int = 1
    gain: Gain = "linear"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(self.per_query)


def evaluate_run(
    ids: npt.NDArray[np.int64] | HasIds,
    qrels: Qrels,
    metrics: Sequence[str] = DEFAULT_METRICS,
    gain: str = "linear",
) -> EvalResult:
    """Score a run against judgments.

    Args:
        ids: ``int64 (n_queries, k)`` retrieved passage ids per query in rank order (``-1``
            padding), or a :class:`~treerank.search.run.Run` (its ``ids``). Row ``i`` is the
            query of qrels row ``i``. A passage must not repeat within a row. When the qrels
            are by document ids (``qrels.expansion``) the ranking is expanded first, so the
            metrics are those of the ranking written to the run file.
        qrels: the judgments (relevance threshold included).
        metrics: names like ``"mrr@10"``, ``"ndcg@10"``, ``"recall@100"``, ``"success@10"``.
        gain: nDCG gain, ``"linear"`` (trec_eval, default) or ``"exp"``.

    Returns:
        An :class:`EvalResult`.

    Raises:
        ValueError: a bad metric name or gain, a row-count mismatch, or a repeated passage in a
            row.
    """
    ids = np.asarray(getattr(ids, "ids", ids), dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"run ids must be a 2-D (n_queries, k) array, got shape {ids.shape}")
    if not is_gain(gain):
        raise ValueError(f"unknown nDCG gain {gain!r}; known: {', '.join(GAINS)}")
    parsed = [(f"{m}@{c}", m, c) for m, c in map(parse_metric, metrics)]
    if ids.shape[0] != qrels.n_queries:
        raise ValueError(f"run has {ids.shape[0]} rows; qrels have {qrels.n_queries} queries")
    ids, _ = qrels.expand(ids)  # document ids where de-duplication merged several
    grades = np.empty(ids.shape, np.int16)
    for start in range(0, ids.shape[0], _BLOCK):  # bounded temporaries on long runs
        block = ids[start : start + _BLOCK]
        if block.shape[1] > 1:
            s = np.sort(block, axis=1)
            if ((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).any():
                raise ValueError("run repeats a passage within a query's ranking")
        grades[start : start + _BLOCK] = qrels.grades_of(block, row_offset=start)
    max_cut = max((c for _, _, c in parsed), default=1)
    n_rel = qrels.n_relevant()
    x = _Inputs(grades, qrels.ideal_grades(max_cut), n_rel, qrels.relevance_threshold, gain)
    evaluated = n_rel > 0
    per_query: dict[str, PerQuery] = {}
    mean: dict[str, float] = {}
    n_eval = int(evaluated.sum())
    for name, metric, cutoff in parsed:
        v = _METRICS[metric](x, cutoff).astype(np.float64)
        v[~evaluated] = np.nan
        per_query[name] = v
        mean[name] = float(v[evaluated].mean()) if n_eval else float("nan")
    return EvalResult(
        per_query=per_query,
        mean=mean,
        n_evaluated=n_eval,
        n_left_out=int((~evaluated).sum()),
        evaluated=evaluated,
        relevance_threshold=qrels.relevance_threshold,
        gain=gain,
    )
