"""Significance: hand counts, McNemar against scipy, randomization / bootstrap behaviour."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from treerank.evaluation.significance import (
    bootstrap_ci,
    compare_paired,
    mcnemar,
    randomization_test,
    wins_losses_ties,
)


def test_wins_losses_ties_drop_nan_pairs() -> None:
    a = np.array([1.0, 0.5, 0.2, np.nan, 0.0])
    b = np.array([0.5, 0.5, 0.3, 1.0, 0.0])
    assert wins_losses_ties(a, b) == (1, 1, 2)


def test_mcnemar_exact_and_chi2() -> None:
    sys_hit = np.array([1] * 6 + [0] * 1 + [1] * 10)
    base_hit = np.array([0] * 6 + [1] * 1 + [1] * 10)
    r = mcnemar(sys_hit, base_hit)
    assert (r.b, r.c, r.exact) == (6, 1, True)
    assert r.p_value == pytest.approx(stats.binomtest(6, 7, 0.5).pvalue)
    assert r.p_value == pytest.approx(2 * (1 + 7) / 128)  # 2 * P(X <= 1), X ~ Bin(7, 1/2)
    big_s = np.array([1] * 40 + [0] * 20)
    big_b = np.array([0] * 40 + [1] * 20)
    r2 = mcnemar(big_s, big_b)
    assert not r2.exact and r2.statistic == pytest.approx((20 - 1) ** 2 / 60)
    assert r2.p_value == pytest.approx(stats.chi2.sf((20 - 1) ** 2 / 60, 1))
    assert mcnemar(np.ones(5), np.ones(5)).p_value == 1.0
    assert r.describe("bm25", "cosine") == (
        "hit@10: 6 queries only bm25 hits, 1 only cosine hits (McNemar p=0.125, exact binomial)"
    )
    assert r2.describe("a", "b", "success@10") == (
        f"success@10: 40 queries only a hits, 20 only b hits "
        f"(McNemar p={r2.p_value:.4g}, chi-squared, continuity-corrected)"
    )


def test_randomization_test_is_seeded_and_sensible() -> None:
    rng = np.random.default_rng(0)
    base = rng.random(200)
    better = base + 0.1
    assert randomization_test(better, base, 2000, seed=1) == pytest.approx(1 / 2001)
    noise = base + rng.normal(0, 0.1, 200)
    p1 = randomization_test(noise, base, 2000, seed=7)
    assert p1 == randomization_test(noise, base, 2000, seed=7)
    assert p1 > 0.05
    # the exact sign-flip p-value of a tiny sample: d = (1, 1, 1): only all-same signs reach |3|
    exact = randomization_test(np.ones(3), np.zeros(3), 20_000, seed=0)
    assert exact == pytest.approx(2 / 8, abs=0.01)
    assert randomization_test(base, base) == 1.0


def test_bootstrap_ci_contains_mean_and_shrinks() -> None:
    rng = np.random.default_rng(1)
    d = rng.normal(0.05, 0.2, 400)
    lo, hi = bootstrap_ci(d, np.zeros(400), 4000, seed=0)
    assert lo < d.mean() < hi
    se = d.std(ddof=1) / np.sqrt(400)
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert bootstrap_ci(d, np.zeros(400), 4000, seed=0) == (lo, hi)


def test_compare_paired_fields() -> None:
    a = {"mrr@10": np.array([1.0, 0.5, np.nan]), "ndcg@10": np.array([0.3, 0.2, np.nan])}
    b = {"mrr@10": np.array([0.5, 0.5, np.nan]), "ndcg@10": np.array([0.3, 0.4, np.nan])}
    t = compare_paired(a, b, n_permutations=500, n_resamples=500)
    assert t["mrr@10"].n == 2 and t["mrr@10"].delta == pytest.approx(0.25)
    assert (t["ndcg@10"].wins, t["ndcg@10"].losses, t["ndcg@10"].ties) == (0, 1, 1)
    assert t["mrr@10"].mean_system == pytest.approx(0.75)
