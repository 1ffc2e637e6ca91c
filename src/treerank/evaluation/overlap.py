"""Train/test positive overlap: how much of a trained model's gain is memorised passages.

On SciFact (and any collection whose test queries cite passages that training queries also cite)
a head can "beat cosine" by learning *which passages get cited*, not by retrieving better. This
module splits the evaluation queries into those with at least one relevant passage that was also
a relevant passage of some training query ("seen") and the rest ("unseen"), and reports every
system's metrics and paired tests on each part, so that the gain that generalises is visible.

Passages are matched across splits by their **source id** (``store.passage_ids()``, the id in
the original collection), which identifies the same document in both splits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from treerank.evaluation.significance import N_PERMUTATIONS, compare_paired
from treerank.metrics.metrics import PerQuery
from treerank.metrics.qrels import Grades, PassageIds
from treerank.storelike import StoreLike


class OverlapCell(TypedDict, total=False):
    """One system's value of one metric on one part: ``mean`` (None: no finite value), and
    against the baseline (absent for it) ``delta``, ``p``, ``ci_low``, ``ci_high``."""

    mean: float | None
    delta: float
    p: float
    ci_low: float
    ci_high: float


class OverlapDoc(TypedDict):
    """What :func:`overlap_breakdown` returns: the part sizes and part -> system -> metric ->
    :class:`OverlapCell`."""

    n_seen: int
    n_unseen: int
    parts: dict[str, dict[str, dict[str, OverlapCell]]]


def relevant_source_ids(
    candidates: PassageIds, labels: Grades, passage_ids: Sequence[str], threshold: int
) -> list[set[str]]:
    """Per query, the source ids of its relevant passages.

    Args:
        candidates: ``int32 (nq, K)`` passage ids, ``-1`` padding.
        labels: ``uint8 (nq, K)`` grades.
        passage_ids: source id of each passage id.
        threshold: a grade ``>=`` this is relevant.
    """
    rel = (candidates >= 0) & (labels >= threshold)
    return [{passage_ids[int(p)] for p in row[r]} for row, r in zip(candidates, rel, strict=True)]


def find_train_store(eval_dir: str | Path, train_split: str = "train") -> Path | None:
    """The sibling ``<root>/train`` of a store split ``<root>/<split>`` (a finished store with a
    ``meta.json``), or ``None`` when there is none or ``eval_dir`` is that split itself."""
    here = Path(eval_dir)
    cand = here.parent / train_split
    if cand.resolve() == here.resolve() or not (cand / "meta.json").is_file():
        return None
    return cand


def seen_positive_mask(eval_store: StoreLike, train_store: StoreLike) -> npt.NDArray[np.bool_]:
    """``bool (n_eval_queries,)``: True where a relevant passage of the evaluation query is also
    relevant to at least one training query (matched by source passage id)."""
    train_pos = set().union(
        *relevant_source_ids(
            np.asarray(train_store.candidates),
            np.asarray(train_store.labels),
            train_store.passage_ids(),
            int(train_store.relevance_threshold),
        )
    )
    per_q = relevant_source_ids(
        np.asarray(eval_store.candidates),
        np.asarray(eval_store.labels),
        eval_store.passage_ids(),
        int(eval_store.relevance_threshold),
    )
    return np.array([bool(s & train_pos) for s in per_q], dtype=bool)


def overlap_breakdown(
    per_query: Mapping[str, Mapping[str, PerQuery]],
    seen: npt.NDArray[np.bool_],
    baseline: str,
    metrics: Sequence[str],
    *,
    n_permutations: int = N_PERMUTATIONS,
    seed: int = 0,
) -> OverlapDoc:
    """Every system's mean metrics and paired tests against ``baseline`` on the seen / unseen parts.

    Args:
        per_query: system -> metric -> ``float64 (nq,)`` per-query values (NaN = left out).
        seen: ``bool (nq,)`` from :func:`seen_positive_mask`.
        baseline: a key of ``per_query``.
        metrics: metrics to report.

    Returns:
        ``{"n_seen", "n_unseen", "parts": {part: {system: {metric: {"mean", "delta", "p",
        "ci_low", "ci_high"}}}}}`` (``delta``/``p``/CI against the baseline, absent for it).

    Raises:
        KeyError: ``baseline`` not in ``per_query``.
    """
    if baseline not in per_query:
        raise KeyError(f"baseline {baseline!r} not among systems {sorted(per_query)}")
    out: OverlapDoc = {"n_seen": int(seen.sum()), "n_unseen": int((~seen).sum()), "parts": {}}
    for part, mask in (("seen", seen), ("unseen", ~seen)):
        rows: dict[str, dict[str, OverlapCell]] = {}
        base = {m: np.asarray(per_query[baseline][m])[mask] for m in metrics}
        for system, pq in per_query.items():
            vals = {m: np.asarray(pq[m])[mask] for m in metrics}
            cell: dict[str, OverlapCell] = {
                m: {"mean": float(np.nanmean(v)) if np.isfinite(v).any() else None}
                for m, v in vals.items()
            }
            if system != baseline and mask.any():
                for m, t in compare_paired(
                    vals, base, metrics, n_permutations, n_permutations, seed
                ).items():
                    c = cell[m]
                    c["delta"], c["p"] = t.delta, t.p_randomization
                    c["ci_low"], c["ci_high"] = t.ci_low, t.ci_high
            rows[system] = cell
        out["parts"][part] = rows
    return out


def overlap_markdown(doc: OverlapDoc, metric: str, baseline: str) -> str:
    """A Markdown table of one metric on the seen / unseen parts (delta and p vs ``baseline``)."""
    parts = doc["parts"]
    head = (
        f"| system | {metric}, {doc['n_seen']} queries with a training positive | "
        f"{metric}, {doc['n_unseen']} queries without |\n|---|---:|---:|\n"
    )
    lines = []
    for system in parts["seen"]:
        cells = []
        for part in ("seen", "unseen"):
            c = parts[part][system][metric]
            if c.get("mean") is None:
                cells.append("—")
            elif "delta" in c:
                cells.append(f"{c['mean']:.4f} ({c['delta']:+.4f}, p={c['p']:.3g})")
            else:
                cells.append(f"{c['mean']:.4f}")
        lines.append(f"| {system} | {cells[0]} | {cells[1]} |")
    return (
        head
        + "\n".join(lines)
        + f"\n\n(delta and p: paired randomization test against `{baseline}`)\n"
    )
