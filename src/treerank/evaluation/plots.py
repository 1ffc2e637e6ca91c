"""PNG plots of a comparison (matplotlib, Agg backend): differences to the baseline with paired
confidence intervals, and Recall@k curves. Every title names the dataset and split."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from treerank.atomic import atomic_savefig

PairedTests = Mapping[str, Mapping[str, Mapping[str, float]]]
"""system -> metric -> a paired test's ``delta``, ``ci_low`` and ``ci_high`` (of
:class:`~treerank.evaluation.significance.PairedTest`; other keys are not read)."""


def dataset_label(store_path: str | Path | None, split: str | None = None) -> str:
    """``"scifact/test"`` from a store split directory ``.../scifact/test`` (for plot titles)."""
    if not store_path:
        return split or "store"
    p = Path(store_path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def delta_rows(
    tests: PairedTests, metrics: Sequence[str]
) -> list[tuple[str, str, float, float, float]]:
    """``(system, metric, delta, ci_low, ci_high)`` per system and metric, in input order.

    Args:
        tests: system -> metric -> a paired test as a dict (``delta``, ``ci_low``, ``ci_high``:
            the mean per-query difference against the baseline and its paired bootstrap 95% CI).
        metrics: metrics to keep.
    """
    return [
        (s, m, float(t[m]["delta"]), float(t[m]["ci_low"]), float(t[m]["ci_high"]))
        for s, t in tests.items()
        for m in metrics
        if m in t
    ]


def plot_deltas(
    tests: PairedTests,
    metrics: Sequence[str],
    baseline: str,
    path: str | Path,
    dataset: str,
    failed: Sequence[str] = (),
) -> Path:
    """One panel per metric: each system's mean per-query difference to ``baseline`` with its
    paired bootstrap 95% CI (a bar crossing 0 is no evidence of a difference).

    With no system to compare (only the baseline was scored, or every other system failed) the
    figure is one panel saying so, never empty panels.

    Args:
        tests: system -> metric -> paired test dict (see :func:`delta_rows`); the baseline
            itself is absent.
        metrics: metrics to draw, one panel each.
        baseline: name of the baseline system (axis label).
        path: output PNG.
        dataset: what was evaluated, e.g. ``"scifact/test"`` (in the title).
        failed: systems that failed (named in the figure when nothing else is left to draw).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(tests)
    if not systems or not metrics:
        fig, ax = plt.subplots(figsize=(6, 1.8))
        ax.axis("off")
        why = (
            f"the other system(s) failed: {', '.join(failed)}"
            if failed
            else "only the baseline was scored"
        )
        ax.text(
            0.5,
            0.5,
            f"{dataset}: nothing to compare with {baseline}\n({why})",
            ha="center",
            va="center",
            wrap=True,
        )
        try:
            return atomic_savefig(fig, path, bbox_inches="tight")
        finally:
            plt.close(fig)
    n = max(len(metrics), 1)
    fig, axes = plt.subplots(
        1, n, figsize=(3.6 * n + 1.5, 0.45 * max(len(systems), 1) + 1.6), squeeze=False
    )
    y = np.arange(len(systems))
    for ax, m in zip(axes[0], metrics, strict=False):
        rows = {s: r for s, r in ((r[0], r) for r in delta_rows(tests, [m]))}
        d = np.array([rows[s][2] if s in rows else np.nan for s in systems])
        lo = np.array([rows[s][3] if s in rows else np.nan for s in systems])
        hi = np.array([rows[s][4] if s in rows else np.nan for s in systems])
        colors = [
            "C2" if low > 0 else "C3" if high < 0 else "C7"
            for low, high in zip(lo, hi, strict=True)
        ]
        ax.barh(y, d, color=colors, alpha=0.8)
        ax.errorbar(d, y, xerr=[d - lo, hi - d], fmt="none", ecolor="black", capsize=3, lw=1)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(y, systems if ax is axes[0][0] else [""] * len(systems))
        ax.set_ylim(max(len(systems), 1) - 0.5, -0.5)  # first system on top, same rows per panel
        ax.set_xlabel(f"Δ {m} vs {baseline}")
        ax.set_title(m)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"{dataset}: difference to {baseline} per system "
        "(mean per-query Δ, paired bootstrap 95% CI; green/red: CI excludes 0)",
        fontsize=9,
    )
    fig.tight_layout()
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)


def recall_curve_ks(curve: Mapping[int, float], n_passages: int | None) -> list[int]:
    """The cutoffs of ``curve`` worth drawing: all up to ``n_passages``, then the first one at
    or above it (Recall@k no longer changes once k covers the corpus)."""
    ks = sorted(curve)
    if n_passages is None:
        return ks
    keep = [k for k in ks if k < n_passages]
    keep += [k for k in ks if k >= n_passages][:1]
    return keep


def plot_recall_curve(
    curves: dict[str, dict[int, float]],
    path: str | Path,
    dataset: str = "",
    n_passages: int | None = None,
) -> Path:
    """Mean Recall@k against k (log x axis), one line per system.

    Args:
        curves: system -> {k: mean Recall@k}.
        path: output PNG.
        dataset: what was evaluated, e.g. ``"scifact/test"`` (in the title).
        n_passages: the corpus size: cutoffs above it (every passage already retrieved) are
            not drawn, except the first one at or above it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s, c in curves.items():
        ks = recall_curve_ks(c, n_passages)
        ax.plot(ks, [c[k] for k in ks], marker="o", ms=3, label=s)
    ax.set_xscale("log")
    ax.set_xlabel("k (passages retrieved)")
    ax.set_ylabel("mean Recall@k")
    ax.set_ylim(0, 1.01)
    ax.set_title(f"{dataset}: mean Recall@k per system" if dataset else "mean Recall@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)
