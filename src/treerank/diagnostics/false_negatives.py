"""The false-negative audit of negative miners on a labelled store split (``treerank audit``).

Each miner is a system spec (``bm25``, ``cosine``, ``ckpt:<dir>``, a fusion): it ranks every
passage of the split for the audited queries through the same search code as evaluation (exact
top-k for dense systems), and :func:`treerank.training.audit.false_negative_curve` turns its raw
ranking into the curve ``f(r)`` and the guard depth it implies. Outputs: ``results.json`` (every
curve in full), ``table.md`` and ``curve.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_savefig, atomic_write_json, atomic_write_text
from treerank.search.specs import BuildContext, build_system
from treerank.store.view import QuerySubset
from treerank.storelike import StoreLike
from treerank.training.audit import DEFAULT_MAX_RATE, AuditCurve, false_negative_curve

__all__ = ["AuditResult", "audit_miners", "write_audit"]

ASSUMPTION = (
    "labelled positives stand in for unlabelled ones: f(r) is the share of queries whose "
    "rank-r passage is a labelled positive, i.e. the false-negative rate a miner blind to the "
    "labels would have at rank r"
)


@dataclass
class AuditResult:
    """Curves of several miners on one split."""

    store: str
    query_rows: np.ndarray
    curves: list[AuditCurve]

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "n_queries": int(self.query_rows.size),
            "assumption": ASSUMPTION,
            "miners": [c.to_dict() for c in self.curves],
        }

    def table(self) -> str:
        """Markdown table: per-rank and cumulative rates at a few ranks, and the guard depth."""
        marks = [r for r in (1, 3, 10, 30, 100) if self.curves and r <= self.curves[0].depth]
        head = (
            "| miner | queries | "
            + " | ".join(f"f({r})" for r in marks)
            + " | "
            + " | ".join(f"F({r})" for r in marks)
            + " | guard depth | pool rate after guard |"
        )
        sep = "|---|---:|" + "---:|" * (2 * len(marks)) + "---:|---:|"
        lines = [head, sep]
        for c in self.curves:
            f, cf = c.rate, c.cumulative_rate
            lines.append(
                f"| {c.miner} | {c.n_queries} | "
                + " | ".join(f"{f[r - 1]:.3f}" for r in marks)
                + " | "
                + " | ".join(f"{cf[r - 1]:.3f}" for r in marks)
                + f" | {c.guard_depth} | {c.residual_rate(c.guard_depth):.4f} |"
            )
        return "\n".join(lines) + "\n"


def audit_miners(
    store: StoreLike,
    miners: Sequence[str],
    *,
    depth: int = 100,
    query_rows: np.ndarray | None = None,
    max_queries: int | None = None,
    max_rate: float = DEFAULT_MAX_RATE,
    seed: int = 0,
) -> AuditResult:
    """Rank the split with every miner and audit its top-``depth``.

    Args:
        store: a labelled ``EmbeddingStore`` split.
        miners: system specs (``treerank.search.systems.build_system``).
        depth: ranks audited per query.
        query_rows: query ids to audit (None: every query with a labelled positive).
        max_queries: audit a seeded random sample of at most this many of them.
        max_rate: the per-rank tolerance that sets the guard depth.
        seed: seed of the sample.

    Returns:
        :class:`AuditResult`, one curve per miner (in the order given).

    Raises:
        ValueError: no miner, no labelled query, or a bad system spec.
    """
    if not miners:
        raise ValueError("audit: name at least one miner (e.g. bm25, cosine, ckpt:<dir>)")
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    if query_rows is None:
        query_rows = np.flatnonzero(((cand >= 0) & (lab >= thr)).any(axis=1))
    rows = np.asarray(query_rows, dtype=np.int64)
    if max_queries is not None and rows.size > max_queries:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(rows, size=int(max_queries), replace=False))
    if rows.size == 0:
        raise ValueError(f"{getattr(store, 'path', 'store')}: no query with a labelled positive")
    view = QuerySubset(store, rows)
    cache: dict[str, Any] = {}
    curves = []
    for spec in miners:
        run = build_system(spec, BuildContext(cache=cache)).retrieve(view, k=depth)
        curve = false_negative_curve(
            run.ids,
            cand,
            lab,
            relevance_threshold=thr,
            query_rows=rows,
            miner=spec,
            max_rate=max_rate,
        )
        curve.meta.update({"depth": int(run.k)})
        curves.append(curve)
    return AuditResult(str(getattr(store, "path", "")), rows, curves)


def write_audit(result: AuditResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``table.md`` and ``curve.png`` (f(r) and F(r) per miner)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "results": atomic_write_json(out / "results.json", result.to_dict(), indent=1),
        "table": atomic_write_text(
            out / "table.md",
            f"False-negative audit of {result.store} ({result.query_rows.size} queries)\n\n"
            + result.table()
            + f"\nAssumption: {ASSUMPTION}.\n",
        ),
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for c in result.curves:
        r = np.arange(1, c.depth + 1)
        (line,) = axes[0].plot(r, c.rate, label=f"{c.miner} (guard {c.guard_depth})")
        axes[1].plot(r, c.cumulative_rate, color=line.get_color(), label=c.miner)
        if c.guard_depth:
            axes[0].axvline(c.guard_depth + 0.5, color=line.get_color(), ls=":", lw=1)
    if result.curves:
        axes[0].axhline(result.curves[0].max_rate, color="grey", ls="--", lw=1)
    for ax, what in zip(
        axes, ("f(r): rank-r passage is a positive", "F(r): share of top-r"), strict=True
    ):
        ax.set_xscale("log")
        ax.set_xlabel("miner rank r")
        ax.set_title(what, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    try:
        paths["plot"] = atomic_savefig(fig, out / "curve.png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return paths
