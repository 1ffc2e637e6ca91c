"""The false-negative audit of negative miners on a labelled store split (``treerank audit``).

Each miner is a system spec (``bm25``, ``cosine``, ``ckpt:<dir>``, a fusion): it ranks every
passage of the split for the audited queries through the same search code as evaluation (exact
top-k for dense systems), and :func:`treerank.training.audit.false_negative_curve` turns its raw
ranking into the curve ``f(r)`` and the guard depth it implies. Outputs: ``results.json`` (every
curve in full), ``table.md`` and ``curve.png``.

With a ``scorer`` (a cross-encoder, ``ce:<dir>``) the audit also **denoises** (RocketQA): each
miner's first ``denoise_depth`` negatives per query (its ranking with the query's labelled
passages removed, as the miners hand them to training) and the query's labelled positives are
scored, and :func:`treerank.training.cross_encoder.denoise_negatives` flags the negatives the
cross-encoder scores as positives (``score >= threshold``, or within ``relative_margin`` of the
best positive's score). The report gives how many are flagged, the share, and the
highest-scored examples with their texts; a labelled passage is never a negative, so never
flagged (``labelled_flagged`` is 0 by construction and checked).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from treerank.atomic import atomic_savefig, atomic_write_json, atomic_write_text
from treerank.families import CHECKPOINTS
from treerank.search.negatives import drop_labelled
from treerank.search.specs import BuildContext, build_system
from treerank.store.view import QuerySubset
from treerank.storelike import StoreLike
from treerank.training.audit import DEFAULT_MAX_RATE, AuditCurve, false_negative_curve
from treerank.training.cross_encoder import DenoiseResult

__all__ = [
    "DEFAULT_RELATIVE_MARGIN",
    "AuditResult",
    "audit_miners",
    "denoise_audit",
    "score_and_denoise",
    "write_audit",
]

DEFAULT_RELATIVE_MARGIN = 0.05  # sentence-transformers' mine_hard_negatives default

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
    denoise: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "store": self.store,
            "n_queries": int(self.query_rows.size),
            "assumption": ASSUMPTION,
            "miners": [c.to_dict() for c in self.curves],
        }
        if self.denoise:
            doc["denoise"] = self.denoise
        return doc

    def denoise_table(self) -> str:
        """Markdown: per miner, the negatives the cross-encoder flags, then examples."""
        if not self.denoise:
            return ""
        lines = [
            "| miner | scorer | negatives scored | flagged | share | queries with a flag |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for d in self.denoise:
            lines.append(
                f"| {d['miner']} | {d['scorer']} | {d['negatives']} | {d['flagged']} | "
                f"{d['share']:.4f} | {d['queries_with_flag']} |"
            )
        for d in self.denoise:
            rule = d["rule"]
            lines.append(f"\nFlagged by {d['scorer']} among {d['miner']}'s negatives ({rule}):\n")
            for e in d["examples"]:
                lines.append(
                    f"- {e['query_id']} {e['query']!r}: {e['passage_id']} (score "
                    f"{e['score']:.3f}, best positive {e['positive_score']:.3f}) {e['passage']!r}"
                )
        return "\n".join(lines) + "\n"

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
    scorer: Any = None,
    denoise_depth: int = 10,
    threshold: float | None = None,
    relative_margin: float | None = DEFAULT_RELATIVE_MARGIN,
    n_examples: int = 10,
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
        scorer: None, a spec ``ce:<dir>`` (loaded before any ranking) or anything with
            ``score_pairs(queries, passages) -> float32 (n,)``: also denoise every miner's
            negatives (:func:`denoise_audit`).
        denoise_depth, threshold, relative_margin, n_examples: see :func:`denoise_audit`.

    Returns:
        :class:`AuditResult`, one curve per miner (in the order given), and with ``scorer``
        one denoising record per miner.

    Raises:
        ValueError: no miner, no labelled query, a bad system or scorer spec, or bad
            denoising settings.
        FileNotFoundError: the scorer's folder holds no cross-encoder.
    """
    if not miners:
        raise ValueError("audit: name at least one miner (e.g. bm25, cosine, ckpt:<dir>)")
    spec = scorer if isinstance(scorer, str) else getattr(scorer, "name", "scorer")
    if scorer is not None:
        _check_denoise(denoise_depth, threshold, relative_margin)
        scorer = _load_scorer(scorer)
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    if query_rows is None:
        query_rows = np.flatnonzero(((cand >= 0) & (lab >= thr)).any(axis=1))
    rows = np.asarray(query_rows, dtype=np.int64)
    if max_queries is not None and rows.size > max_queries:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(rows, size=int(max_queries), replace=False))
    if rows.size == 0:
        raise ValueError(f"{store.path}: no query with a labelled positive")
    view = QuerySubset(store, rows)
    cache: dict[str, Any] = {}
    curves = []
    denoised: list[dict[str, Any]] = []
    for miner in miners:
        ctx = BuildContext(cache=cache, checkpoints=CHECKPOINTS)
        run = build_system(miner, ctx).retrieve(view, k=depth)
        curve = false_negative_curve(
            run.ids,
            cand,
            lab,
            relevance_threshold=thr,
            query_rows=rows,
            miner=miner,
            max_rate=max_rate,
        )
        curve.meta.update({"depth": int(run.k)})
        curves.append(curve)
        if scorer is not None:
            record = denoise_audit(
                store,
                rows,
                run.ids,
                scorer,
                depth=denoise_depth,
                threshold=threshold,
                relative_margin=relative_margin,
                n_examples=n_examples,
            )
            denoised.append({"miner": miner, "scorer": str(spec), **record})
    return AuditResult(str(store.path), rows, curves, denoised)


def _check_denoise(depth: int, threshold: float | None, relative_margin: float | None) -> None:
    if depth < 1:
        raise ValueError(f"audit: the denoising depth must be >= 1, got {depth}")
    if threshold is None and relative_margin is None:
        raise ValueError("audit: denoising needs a threshold, a relative margin, or both")
    if relative_margin is not None and relative_margin < 0:
        raise ValueError(f"audit: the relative margin must be >= 0, got {relative_margin}")


def _load_scorer(scorer: Any) -> Any:
    if not isinstance(scorer, str):
        return scorer
    from treerank.models.cross_encoder import CrossEncoderScorer

    if not scorer.startswith("ce:") or not scorer[3:].strip():
        raise ValueError(f"audit: scorer {scorer!r}: expected ce:<cross-encoder dir>")
    return CrossEncoderScorer(scorer[3:].strip())


def score_and_denoise(
    store: StoreLike,
    rows: np.ndarray,
    ranked: np.ndarray,
    scorer: Any,
    *,
    depth: int = 10,
    threshold: float | None = None,
    relative_margin: float | None = DEFAULT_RELATIVE_MARGIN,
    n_examples: int = 10,
    progress: bool = False,
) -> tuple[np.ndarray, DenoiseResult, int]:
    """Score a ranking's first ``depth`` negatives per query and each query's labelled
    positives with a cross-encoder, then flag (RocketQA) with
    :func:`treerank.training.cross_encoder.denoise_negatives`.

    Args:
        store: the labelled split (texts, ``candidates`` / ``labels``).
        rows: ``int (nq,)`` store query ids of ``ranked``'s rows.
        ranked: ``int (nq, R)`` passage ids in rank order, ``-1`` padding; the query's labelled
            passages are removed first (a mined list without them is unchanged).
        scorer: ``score_pairs(queries, passages) -> float32 (n,)``.
        depth, threshold, relative_margin, n_examples: as in :func:`denoise_audit`.
        progress: a progress bar over the pairs (scored in chunks of 1,024).

    Returns:
        ``(negatives, result, n_pairs)``: ``int64 (nq, depth)`` the scored negatives (``-1``
        padding), the ``DenoiseResult`` (its ``negatives`` with the flagged ones blanked) and
        the number of pairs scored.

    Raises:
        ValueError: ``ranked``'s rows differ from ``rows``.
    """
    from treerank.training.cross_encoder import denoise_negatives
    from treerank.training.sampler import relevant_lists

    rows = np.asarray(rows, dtype=np.int64)
    ranked = np.asarray(ranked, dtype=np.int64)
    if ranked.ndim != 2 or ranked.shape[0] != rows.size:
        raise ValueError(f"denoise: ranked {ranked.shape} for {rows.size} query rows")
    cand = np.asarray(store.candidates)[rows]
    lab = np.asarray(store.labels)[rows]
    mined = drop_labelled(ranked, cand, lab).astype(np.int64)
    negs = np.full((rows.size, depth), -1, dtype=np.int64)
    for i, row in enumerate(mined):
        kept = row[row >= 0][:depth]
        negs[i, : kept.size] = kept
    relevant, _ = relevant_lists(cand, lab, int(store.relevance_threshold))
    qt, pt = store.query_texts(), store.passage_texts()
    ni, nj = np.nonzero(negs >= 0)
    pi, pj = np.nonzero(relevant >= 0)
    queries = [qt[int(rows[i])] for i in ni] + [qt[int(rows[i])] for i in pi]
    passages = [pt[int(negs[i, j])] for i, j in zip(ni, nj, strict=True)] + [
        pt[int(relevant[i, j])] for i, j in zip(pi, pj, strict=True)
    ]
    chunk = 1024
    parts = []
    with tqdm(total=len(queries), unit="pairs", desc="denoise", disable=not progress) as bar:
        for a in range(0, len(queries), chunk):
            parts.append(
                np.asarray(scorer.score_pairs(queries[a : a + chunk], passages[a : a + chunk]))
            )
            bar.update(len(parts[-1]))
    scores = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
    neg_scores = np.full(negs.shape, np.nan)
    neg_scores[ni, nj] = scores[: ni.size]
    pos_scores = np.full(rows.size, -np.inf)
    np.maximum.at(pos_scores, pi, scores[ni.size :])
    pos_scores[~np.isfinite(pos_scores)] = np.nan
    res = denoise_negatives(
        negs,
        neg_scores,
        pos_scores,
        cand,
        lab,
        threshold=threshold,
        relative_margin=relative_margin,
        n_examples=n_examples,
    )
    return negs, res, len(queries)


def denoise_audit(
    store: StoreLike,
    rows: np.ndarray,
    ranked: np.ndarray,
    scorer: Any,
    *,
    depth: int = 10,
    threshold: float | None = None,
    relative_margin: float | None = DEFAULT_RELATIVE_MARGIN,
    n_examples: int = 10,
) -> dict[str, Any]:
    """How many of a miner's negatives a cross-encoder flags as positives (RocketQA).

    Args:
        store: the labelled split.
        rows: ``int (nq,)`` store query ids of ``ranked``'s rows.
        ranked: ``int (nq, R)`` the miner's raw ranking (labelled passages included).
        scorer: ``score_pairs(queries, passages) -> float32 (n,)`` (a cross-encoder: raw
            logits).
        depth: negatives per query scored: the first ``depth`` of the ranking once the query's
            labelled passages are removed.
        threshold: flag a negative scored ``>=`` this (None: off).
        relative_margin: flag a negative scored ``>= p - relative_margin * |p|``, ``p`` the
            query's best labelled positive's score (None: off).
        n_examples: examples kept, highest-scored first.

    Returns:
        ``{"scorer_pairs", "negatives", "flagged", "share", "queries_with_flag",
        "labelled_flagged", "rule", "examples": [{query_id, query, passage_id, passage, score,
        positive_score}]}``: counts over the scored negatives; ``labelled_flagged`` (always 0)
        counts flagged passages labelled for their query.

    Raises:
        ValueError: ``ranked``'s rows differ from ``rows``, or bad settings.
    """
    from treerank.training.sampler import relevant_lists

    _check_denoise(depth, threshold, relative_margin)
    rows = np.asarray(rows, dtype=np.int64)
    negs, res, n_pairs = score_and_denoise(
        store,
        rows,
        ranked,
        scorer,
        depth=depth,
        threshold=threshold,
        relative_margin=relative_margin,
        n_examples=n_examples,
    )
    cand = np.asarray(store.candidates)[rows]
    lab = np.asarray(store.labels)[rows]
    _, labelled = relevant_lists(cand, lab, int(store.relevance_threshold))
    qt, pt = store.query_texts(), store.passage_texts()
    flagged_ids = np.where(res.flagged, negs, -1)
    is_lab = ((flagged_ids[:, :, None] == labelled[:, None, :]) & (labelled[:, None, :] >= 0)).any(
        axis=2
    )
    qids, pids = store.query_ids(), store.passage_ids()
    rule = " or ".join(
        ([f"score >= {threshold}"] if threshold is not None else [])
        + (
            [f"score >= best positive - {relative_margin} x |best positive|"]
            if relative_margin is not None
            else []
        )
    )
    return {
        "scorer_pairs": n_pairs,
        "depth": int(depth),
        "threshold": threshold,
        "relative_margin": relative_margin,
        "rule": rule,
        **{k: v for k, v in res.counts.items() if k != "action"},
        "labelled_flagged": int(is_lab.sum()),
        "examples": [
            {
                "query_id": str(qids[int(rows[e["query"]])]),
                "query": qt[int(rows[e["query"]])],
                "passage_id": str(pids[e["passage"]]),
                "passage": pt[e["passage"]][:300],
                "score": round(e["score"], 4),
                "positive_score": round(e["positive_score"], 4),
            }
            for e in res.examples
        ],
    }


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
            + f"\nAssumption: {ASSUMPTION}.\n"
            + (f"\nDenoising\n\n{result.denoise_table()}" if result.denoise else ""),
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
