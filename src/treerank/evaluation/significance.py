"""Paired significance of two systems on the same queries (seeded, reproducible).

- wins / losses / ties per metric (per-query differences, ties within ``1e-12``);
- McNemar's test on hit@k (success@10 by default): exact two-sided binomial on the discordant
  pairs when there are fewer than 25 of them, else the chi-square statistic with continuity
  correction (Edwards 1948); both from scipy;
- paired randomization (sign-flip) test on the mean difference, two-sided,
  ``p = (1 + #{|mean(d * s)| >= |mean(d)|}) / (1 + n_permutations)`` (Smucker, Allan &
  Carterette, CIKM 2007, "A comparison of statistical significance tests for IR evaluation");
- paired bootstrap 95% confidence interval of the mean difference (percentile method; Efron &
  Tibshirani 1993).

Differences are ``system - baseline``; queries with a NaN value in either system are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from treerank.metrics.metrics import PerQuery

_TIE = 1e-12
_BLOCK = 4_000_000  # elements of a (draws, queries) block: bounds memory whatever the sizes


@dataclass
class PairedTest:
    """Comparison of one metric between a system and a baseline."""

    metric: str
    n: int
    mean_system: float
    mean_baseline: float
    delta: float
    wins: int
    losses: int
    ties: int
    p_randomization: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class McNemarResult:
    """McNemar on a binary per-query outcome (hit@k): discordant counts ``b`` (system only) and
    ``c`` (baseline only), the statistic and two-sided p; ``exact`` says which test was used."""

    b: int
    c: int
    statistic: float
    p_value: float
    exact: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self, system: str, baseline: str, outcome: str = "hit@10") -> str:
        """One line saying what ``b`` and ``c`` count, e.g. ``"hit@10: 132 queries only bm25
        hits, 228 only cosine hits (McNemar p=1.2e-07, chi-squared, continuity-corrected)"``
        (queries that both or neither hit do not enter the test)."""
        test = "exact binomial" if self.exact else "chi-squared, continuity-corrected"
        return (
            f"{outcome}: {self.b} queries only {system} hits, {self.c} only {baseline} hits "
            f"(McNemar p={self.p_value:.4g}, {test})"
        )


N_PERMUTATIONS = 10_000
"""Default randomization-test permutations and bootstrap resamples, everywhere (evaluation,
overlap breakdown, diagnostics, ``treerank evaluate --permutations``)."""


def _paired(a: PerQuery, b: PerQuery) -> PerQuery:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            f"paired values must be equal-length 1-D arrays, got {a.shape} and {b.shape}"
        )
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep] - b[keep]


def wins_losses_ties(system: PerQuery, baseline: PerQuery) -> tuple[int, int, int]:
    """Queries where ``system`` beats / loses to / ties ``baseline`` (NaN pairs dropped)."""
    d = _paired(system, baseline)
    return int((d > _TIE).sum()), int((d < -_TIE).sum()), int((np.abs(d) <= _TIE).sum())


def randomization_test(
    system: PerQuery, baseline: PerQuery, n_permutations: int = N_PERMUTATIONS, seed: int = 0
) -> float:
    """Two-sided paired sign-flip randomization test of the mean difference.

    Args:
        system, baseline: ``float64 (n_queries,)`` per-query values (NaN dropped pairwise).
        n_permutations: random sign assignments drawn.
        seed: ``numpy.random.default_rng`` seed.

    Returns:
        The p-value in ``(0, 1]``; 1.0 when there are no pairs or all differences are 0.
    """
    d = _paired(system, baseline)
    if d.size == 0 or not np.any(np.abs(d) > _TIE):
        return 1.0
    rng = np.random.default_rng(seed)
    obs = abs(d.mean())
    count = 0
    block = max(1, _BLOCK // d.size)
    for s in range(0, n_permutations, block):
        m = min(block, n_permutations - s)
        signs = rng.integers(0, 2, size=(m, d.size), dtype=np.int8) * 2 - 1
        count += int((np.abs(signs @ d / d.size) >= obs - 1e-15).sum())
    return (count + 1) / (n_permutations + 1)


def bootstrap_ci(
    system: PerQuery,
    baseline: PerQuery,
    n_resamples: int = N_PERMUTATIONS,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Paired bootstrap percentile confidence interval of the mean difference.

    Returns:
        ``(low, high)``; ``(nan, nan)`` when there are no pairs.
    """
    d = _paired(system, baseline)
    if d.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    block = max(1, _BLOCK // d.size)
    for s in range(0, n_resamples, block):
        m = min(block, n_resamples - s)
        means[s : s + m] = d[rng.integers(0, d.size, size=(m, d.size))].mean(axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def mcnemar(system_hit: PerQuery, baseline_hit: PerQuery, exact_below: int = 25) -> McNemarResult:
    """McNemar's test on paired binary outcomes (e.g. success@10 per query).

    Args:
        system_hit, baseline_hit: ``(n_queries,)`` 0/1 (NaN pairs dropped).
        exact_below: use the exact binomial test when ``b + c`` is below this.
    """
    fa, fb = np.asarray(system_hit, np.float64), np.asarray(baseline_hit, np.float64)
    keep = ~(np.isnan(fa) | np.isnan(fb))
    a, b_ = fa[keep] > 0.5, fb[keep] > 0.5
    b, c = int((a & ~b_).sum()), int((~a & b_).sum())
    if b + c == 0:
        return McNemarResult(b, c, 0.0, 1.0, True)
    if b + c < exact_below:
        p = stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
        return McNemarResult(b, c, float(min(b, c)), float(p), True)
    chi2 = (abs(b - c) - 1.0) ** 2 / (b + c)
    return McNemarResult(b, c, float(chi2), float(stats.chi2.sf(chi2, 1)), False)


def compare_paired(
    system: dict[str, PerQuery],
    baseline: dict[str, PerQuery],
    metrics: Sequence[str] | None = None,
    n_permutations: int = N_PERMUTATIONS,
    n_resamples: int = N_PERMUTATIONS,
    seed: int = 0,
) -> dict[str, PairedTest]:
    """Paired tests of every metric present in both per-query dicts.

    Args:
        system, baseline: metric -> ``float64 (n_queries,)`` (``EvalResult.per_query``).
        metrics: subset to test (default: all shared metrics).
        n_permutations, n_resamples, seed: see :func:`randomization_test`, :func:`bootstrap_ci`.

    Returns:
        metric -> :class:`PairedTest`.
    """
    names = [m for m in (metrics or system) if m in system and m in baseline]
    out = {}
    for m in names:
        d = _paired(system[m], baseline[m])
        keep = ~(np.isnan(system[m]) | np.isnan(baseline[m]))
        w, lo_, t = wins_losses_ties(system[m], baseline[m])
        ci = bootstrap_ci(system[m], baseline[m], n_resamples, seed)
        out[m] = PairedTest(
            metric=m,
            n=int(d.size),
            mean_system=float(np.mean(system[m][keep])) if d.size else float("nan"),
            mean_baseline=float(np.mean(baseline[m][keep])) if d.size else float("nan"),
            delta=float(d.mean()) if d.size else float("nan"),
            wins=w,
            losses=lo_,
            ties=t,
            p_randomization=randomization_test(system[m], baseline[m], n_permutations, seed),
            ci_low=ci[0],
            ci_high=ci[1],
        )
    return out
