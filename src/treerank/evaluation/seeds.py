"""Training-seed variance: one model trained with several seeds, reported honestly.

A different training seed can move a trained head as much as many reported deltas (on SciFact
the linear head's nDCG@10 moved from 0.7802 to 0.7982 between two seeds), and the paired tests
of :mod:`treerank.evaluation.significance` only cover the sampling of queries. For a model
trained with seeds ``s_1..s_n`` (evaluated as systems ``name@seed<s>``) this module

* keeps every seed's mean metric, their mean and sample standard deviation (``ddof=1``) over
  seeds, and
* adds the model itself as a system whose per-query metric is the **average over seeds of the
  per-query metric** (not a score ensemble: each seed's own ranking is scored, then the
  per-query values are averaged), so that the paired test against the baseline compares one
  number per query that no longer depends on a lucky seed (the spread over seeds is reported
  beside it; see Bouthillier et al., 2021, "Accounting for Variance in Machine Learning
  Benchmarks", on reporting training-seed variance).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np

from treerank.metrics.metrics import EvalResult

SEED_SEPARATOR = "@seed"


def seed_system_name(model: str, seed: int) -> str:
    """``"linear@seed1"``: the system name of one seed's run of ``model``."""
    return f"{model}{SEED_SEPARATOR}{seed}"


def seed_average(results: Sequence[EvalResult]) -> EvalResult:
    """The per-query average over seeds of every metric the seeds share.

    Args:
        results: one :class:`EvalResult` per seed, on the same queries and judgments (so the
            same queries are left out in each).

    Returns:
        An :class:`EvalResult` whose ``per_query[m]`` is ``float64 (n_queries,)``, the mean of
        the seeds' values (NaN where a query is left out) and whose ``mean`` is their mean
        over evaluated queries (= the mean of the seeds' means).

    Raises:
        ValueError: no result, or results that leave out different queries.
    """
    if not results:
        raise ValueError("seed_average needs at least one result")
    first = results[0]
    for r in results[1:]:
        if not np.array_equal(r.evaluated, first.evaluated):
            raise ValueError("seed runs leave out different queries; they were not evaluated alike")
    metrics = [m for m in first.per_query if all(m in r.per_query for r in results)]
    per_query = {m: np.mean(np.stack([r.per_query[m] for r in results]), axis=0) for m in metrics}
    ev = first.evaluated
    mean = {m: float(v[ev].mean()) if ev.any() else float("nan") for m, v in per_query.items()}
    return EvalResult(
        per_query=per_query,
        mean=mean,
        n_evaluated=first.n_evaluated,
        n_left_out=first.n_left_out,
        evaluated=ev,
        relevance_threshold=first.relevance_threshold,
        gain=first.gain,
        extra={"seed_average_of": len(results)},
    )


class SeedSpread(TypedDict):
    """What :func:`seed_spread` returns (see there)."""

    seeds: list[int]
    systems: list[str]
    per_seed: dict[str, list[float]]
    mean: dict[str, float]
    std: dict[str, float | None]


def seed_spread(
    results: Mapping[str, EvalResult], seeds: Mapping[str, int], metrics: Sequence[str]
) -> SeedSpread:
    """Per-seed means, their mean and sample standard deviation over seeds.

    Args:
        results: system name -> result, one per seed.
        seeds: the same system names -> the training seed.
        metrics: metrics to report.

    Returns:
        ``{"seeds": [s...], "systems": [name...], "per_seed": {metric: [mean per seed]},
        "mean": {metric: float}, "std": {metric: float | None}}`` (``std`` with ``ddof=1``;
        ``None`` for a single seed).
    """
    names = list(seeds)
    per_seed = {m: [float(results[n].mean[m]) for n in names] for m in metrics}
    return {
        "seeds": [int(seeds[n]) for n in names],
        "systems": names,
        "per_seed": per_seed,
        "mean": {m: float(np.mean(v)) for m, v in per_seed.items()},
        "std": {m: float(np.std(v, ddof=1)) if len(v) > 1 else None for m, v in per_seed.items()},
    }
