"""The transfer table of ``treerank run``: each model x training source on every dataset.

With ``transfer: true`` every model trained on a dataset's train split (its training source:
that dataset's labels, or the ``data.sources`` of its config) is evaluated on every dataset of
the experiment; the evaluation stage names it ``<model>`` on its own dataset and
``<model>@<training dataset>`` elsewhere. This module reads the finished comparisons and writes,
per metric, one table: rows = (model, training dataset), columns = evaluation datasets, each
cell the mean with its paired delta and p against cosine and BM25 (the comparison's paired
randomization tests), and, on the model's own dataset, the unseen-positive part where the
seen/unseen split applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from treerank.pipeline.identity import RunId, SystemId

__all__ = ["transfer_rows", "transfer_tables"]


def transfer_rows(outcomes: Mapping[str, Any]) -> list[RunId]:
    """Every trained run (its model, seed and training dataset), in experiment order."""
    return [r for o in outcomes.values() for r in o.runs]


def _cell(o: Any, system: str, metric: str, baselines: Sequence[str]) -> str:
    comp = o.comparison or {}
    sys_ = comp.get("systems", {}).get(system)
    if sys_ is None:
        return "—"
    mean = sys_.get("mean", {}).get(metric)
    parts = [f"{mean:.4f}" if mean is not None else "n/a"]
    for b in baselines:
        t = comp.get("tests", {}).get(b, {}).get(system, {}).get(metric)
        if t:
            p = t.get("p_randomization")
            star = "*" if p is not None and p < 0.05 else ""
            parts.append(f"{t.get('delta', float('nan')):+.3f}{star} vs {b}")
    return " ".join(parts[:1]) + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else "")


def _unseen(o: Any, system: str, metric: str, baseline: str) -> str:
    doc = (o.overlap or {}).get("parts", {}).get("unseen", {})
    cell = doc.get(system, {}).get(metric)
    if not cell or cell.get("mean") is None:
        return ""
    d, p = cell.get("delta"), cell.get("p")
    extra = f", {d:+.3f} vs {baseline}, p = {p:.2g}" if d is not None and p is not None else ""
    return f"; unseen {cell['mean']:.4f}{extra}"


def transfer_tables(
    outcomes: Mapping[str, Any], metrics: Sequence[str], baselines: Sequence[str]
) -> str:
    """Markdown: one table per metric (see the module docstring); ``*`` marks p < 0.05."""
    rows = transfer_rows(outcomes)
    if not rows:
        return ""
    names = list(outcomes)
    out: list[str] = []
    for metric in metrics:
        out += [
            f"#### {metric}",
            "",
            "| model | trained on | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names),
        ]
        for run in rows:
            cells = []
            for name in names:
                o = outcomes[name]
                system = SystemId.of_run(run, name).name
                cell = _cell(o, system, metric, baselines)
                if name == run.trained_on and baselines:
                    cell += _unseen(o, system, metric, baselines[0])
                cells.append(cell)
            out.append(f"| {run.name} | {run.trained_on} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
