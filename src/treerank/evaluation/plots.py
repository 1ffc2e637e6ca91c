"""PNG plots of a comparison (matplotlib, Agg backend): metric bars and Recall@k curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from treerank.atomic import atomic_savefig


def ci95(values: np.ndarray) -> float:
    """Half-width of the normal-approximation 95% CI of the mean (NaN ignored; 0 if n < 2)."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    if v.size < 2:
        return 0.0
    return float(1.96 * v.std(ddof=1) / np.sqrt(v.size))


def plot_metric_bars(
    per_query: dict[str, dict[str, np.ndarray]],
    metrics: Sequence[str],
    path: str | Path,
    title: str = "",
) -> Path:
    """Grouped bars: one group per metric, one bar per system, 95% CI error bars.

    Args:
        per_query: system -> metric -> ``float64 (n_queries,)`` (NaN = left out).
        metrics: metrics to draw.
        path: output PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(per_query)
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(metrics) * max(1, len(systems) / 2)), 4))
    x = np.arange(len(metrics))
    for i, s in enumerate(systems):
        means = [float(np.nanmean(per_query[s][m])) for m in metrics]
        errs = [ci95(per_query[s][m]) for m in metrics]
        ax.bar(
            x + (i - (len(systems) - 1) / 2) * width, means, width, yerr=errs, capsize=3, label=s
        )
    ax.set_xticks(x, list(metrics))
    ax.set_ylim(0, 1)
    ax.set_ylabel("mean over evaluated queries (95% CI)")
    ax.set_title(title or "metrics per system")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)


def plot_recall_curve(
    curves: dict[str, dict[int, float]], path: str | Path, title: str = ""
) -> Path:
    """Mean Recall@k against k (log x axis), one line per system.

    Args:
        curves: system -> {k: mean Recall@k}.
        path: output PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s, c in curves.items():
        ks = sorted(c)
        ax.plot(ks, [c[k] for k in ks], marker="o", ms=3, label=s)
    ax.set_xscale("log")
    ax.set_xlabel("k (passages retrieved)")
    ax.set_ylabel("mean Recall@k")
    ax.set_ylim(0, 1.01)
    ax.set_title(title or "Recall@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)
