"""Numbers for a README or a paper, generated from an experiment's ``report.json``.

Hand-typed result tables drift: a re-run changes a number and the prose keeps the old one. Here
the only source is a report: :func:`extract` keeps one dataset's numbers from a ``report.json``
(a small JSON that can be committed beside the README), :func:`render` turns that into Markdown
tables, and :func:`replace_block` puts them between two marker comments. ``scripts/
readme_results.py`` runs the three; a test checks that the README's block equals
:func:`render` of the committed JSON, so the README can only change through the script.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from treerank.evaluation.summary import headline
from treerank.families import FAMILIES, CrossCpu, family
from treerank.metrics.metrics import headline_metric
from treerank.training.finetune_config import CE_FAMILY
from treerank.training.finetune_config import FAMILIES as FINETUNE_FAMILIES

ENCODER_FAMILIES = tuple(f for f in FINETUNE_FAMILIES if f != CE_FAMILY)
"""The fine-tune families whose system is a tuned encoder (a cross-encoder reranks)."""

BEGIN = "<!-- BEGIN generated results (scripts/readme_results.py; do not edit by hand) -->"
END = "<!-- END generated results -->"
TABLE_METRICS = ("mrr@10", "ndcg@10", "recall@100")
METRIC_LABELS = {"mrr@10": "MRR@10", "ndcg@10": "nDCG@10", "recall@100": "Recall@100"}

# What a fresh clone reproduces on another x86 CPU (issue 21). Determinism holds per machine;
# across CPUs, a family whose training sums floats in the CPU's reduction order says so in its
# family entry (``ModelFamily.cross_cpu``: its tolerance and why), and every number of its
# systems may move within that tolerance ...
# ... and on every other system (the printed 4 decimals, with one unit of rounding slack):
EXACT_TOLERANCE = 2e-4


def extract(report: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """The part of a ``report.json`` that :func:`render` reads, for one dataset.

    Raises:
        KeyError: ``dataset`` is not in the report.
    """
    ds = report["datasets"][dataset]
    diag = ds.get("diagnostics") or {}
    return {
        "experiment": report.get("experiment"),
        "created": report.get("created"),
        "seconds_this_run": report.get("seconds_this_run"),
        "encoder": (report.get("encoder") or {}).get("name"),
        "dataset": dataset,
        "eval_split": ds.get("eval_split"),
        "n_passages": (ds.get("store_stats") or {}).get(ds.get("eval_split"), {}).get("n_passages"),
        "comparison": {
            k: ds["comparison"].get(k)
            for k in ("settings", "metrics", "baseline", "systems", "tests", "seed_spread")
        },
        "overlap": ds.get("overlap"),
        # system -> family, for the checkpoint systems whose family writes a report part,
        # and for each encoder fine-tune's system (its name)
        "families": {
            **{
                system: fam
                for fam, part in (ds.get("family_reports") or {}).items()
                for system in (part or {})
            },
            **{
                name: rec.get("family")
                for name, rec in (ds.get("training") or {}).items()
                if rec.get("encoder_finetune")
            },
        },
        "diagnostics_rules": [
            {"rule": r.get("rule"), "numbers": r.get("numbers"), "holds": r.get("holds")}
            for r in diag.get("rules") or []
        ],
    }


ENCODER_CROSS_CPU = CrossCpu(
    0.01,
    "the fine-tuned encoder's training sums floats in the CPU's reduction order (a bound stated, "
    "not yet measured across CPUs)",
)
"""How an encoder fine-tune's system (``treerank finetune``'s families) reproduces elsewhere."""


def _cross_cpu(family_name: object) -> CrossCpu | None:
    name = str(family_name)
    if name in FAMILIES:
        return family(name).cross_cpu
    return ENCODER_CROSS_CPU if name in ENCODER_FAMILIES else None


def cpu_order_families(doc: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{family: systems}`` of ``doc`` (an :func:`extract` output) whose numbers depend on the
    CPU's reduction order: the systems of a family with a ``cross_cpu`` entry, by the report's
    family record (``families``: a trained run, or the seed average of such runs); a document
    without it (older extracts) matches a system named as such a family."""
    systems = doc["comparison"]["systems"]
    fams = doc.get("families")
    spread = doc["comparison"].get("seed_spread") or {}
    out: dict[str, list[str]] = {}
    for s in systems:
        if fams is None:
            owners = [s]
        else:
            owners = [fams.get(s), *(fams.get(m) for m in spread.get(s, {}).get("systems", ()))]
        fam = next((f for f in owners if _cross_cpu(f) is not None), None)
        if fam is not None:
            out.setdefault(str(fam), []).append(s)
    return out


def cpu_order_systems(doc: Mapping[str, Any]) -> list[str]:
    """Systems of ``doc`` whose numbers depend on the CPU's reduction order, in the report's
    order (:func:`cpu_order_families`)."""
    mine = {s for group in cpu_order_families(doc).values() for s in group}
    return [s for s in doc["comparison"]["systems"] if s in mine]


def _reported_models(doc: Mapping[str, Any], systems: list[str]) -> list[str]:
    """``systems`` without the single seeds of a seed-averaged model (the table shows the
    average): the names the reproduction note gives."""
    spread = doc["comparison"].get("seed_spread") or {}
    members = {m for s in systems for m in spread.get(s, {}).get("systems", ())}
    return [s for s in systems if s not in members]


def tolerance(doc: Mapping[str, Any], system: str) -> float:
    """The absolute tolerance within which a fresh run on another CPU matches ``system``'s
    published metric means: its family's ``cross_cpu.tolerance`` when its numbers depend on
    the CPU's reduction order (:func:`cpu_order_families`), else :data:`EXACT_TOLERANCE`."""
    for fam, group in cpu_order_families(doc).items():
        cross = _cross_cpu(fam)
        if system in group and cross is not None:
            return cross.tolerance
    return EXACT_TOLERANCE


def mismatches(published: Mapping[str, Any], fresh: Mapping[str, Any]) -> list[str]:
    """Where a fresh run's :func:`extract` differs from the published one beyond
    :func:`tolerance`: one line per (system, metric), empty when it reproduces. A system or
    metric missing from the fresh run is a mismatch."""
    out = []
    fresh_sys = fresh["comparison"]["systems"]
    for system, s in published["comparison"]["systems"].items():
        tol = tolerance(published, system)
        for metric, v in s["mean"].items():
            w = fresh_sys.get(system, {}).get("mean", {}).get(metric)
            if v is None and w is None:
                continue
            if v is None or w is None or abs(float(v) - float(w)) > tol:
                out.append(f"{system} {metric}: published {v}, fresh {w} (tolerance {tol:g})")
    return out


def _reproduction_note(doc: Mapping[str, Any]) -> str:
    groups = cpu_order_families(doc)
    if not groups:
        return (
            f"A fresh clone reproduces every number within {EXACT_TOLERANCE:g} (the printed "
            "decimals) on any x86 CPU."
        )
    parts = []
    for fam, group in groups.items():
        cross = _cross_cpu(fam)
        assert cross is not None
        parts.append(
            f"{', '.join(_reported_models(doc, group))}: {cross.why}, so on another CPU its "
            f"numbers match within {cross.tolerance:g} (on the same machine, exactly)"
        )
    return (
        f"A fresh clone reproduces these numbers within {EXACT_TOLERANCE:g} (the printed "
        f"decimals) on any x86 CPU, except {'; and '.join(parts)}."
    )


def _p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "p n/a"
    return "p < 1e-4" if p < 1e-4 else f"p = {p:.2g}"


def _delta(cell: Mapping[str, Any] | None, p_key: str) -> str:
    if not cell or cell.get("delta") is None:
        return ""
    return f"{cell['delta']:+.3f}, {_p(cell.get(p_key))}"


def render(doc: Mapping[str, Any], metrics: Sequence[str] = TABLE_METRICS) -> str:
    """The summary headline, then Markdown tables (main comparison, training seeds, seen /
    unseen split) and the diagnostics' decision rules.

    Models trained with several seeds appear once, as ``mean ± std`` over seeds, with the delta
    and p of their seed-averaged per-query metrics; the seeds' own numbers get their own table.
    """
    comp = doc["comparison"]
    base = comp["baseline"]
    systems = comp["systems"]
    spread = comp.get("seed_spread") or {}
    single = {n for g in spread.values() for n in g["systems"]}
    head_metric = headline_metric(comp["metrics"])
    tests = (comp.get("tests") or {}).get(base, {})
    st = comp.get("settings") or {}
    any_sys = next(iter(systems.values()))
    lines = [
        *headline(doc["dataset"], comp, head_metric, base, doc.get("overlap")),
        "",
        f"{doc['dataset']} {doc['eval_split']}: {st.get('n_queries')} queries "
        f"({any_sys.get('n_evaluated')} with a relevant passage) ranked against all "
        f"{st.get('n_passages'):,} passages, encoder `{doc.get('encoder')}`; p from a paired "
        f"randomization test against {base} ({st.get('n_permutations'):,} permutations, seed "
        f"{st.get('seed')})."
        + (
            " A model trained with several seeds shows mean ± std over seeds; its delta and p "
            "use per-query metrics averaged over its seeds."
            if spread
            else ""
        ),
        "",
        "| system | "
        + " | ".join(METRIC_LABELS.get(m, m) for m in metrics)
        + f" | {METRIC_LABELS.get(head_metric, head_metric)} vs {base} |",
        "|---|" + "---:|" * len(metrics) + "---|",
    ]
    for name, s in systems.items():
        if name in single:
            continue
        cells = []
        for m in metrics:
            v = s["mean"].get(m)
            text = "—" if v is None else f"{v:.4f}"
            sd = spread.get(name, {}).get("std", {}).get(m)
            if sd is not None:
                text += f" ± {sd:.4f}"
            cells.append(text)
        label = f"{name} ({len(spread[name]['seeds'])} seeds)" if name in spread else name
        delta = _delta(tests.get(name, {}).get(head_metric), "p_randomization")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {delta} |")
    if spread:
        lines += [
            "",
            f"| {METRIC_LABELS.get(head_metric, head_metric)} per training seed | seeds | "
            "per seed | mean | std |",
            "|---|---|---|---:|---:|",
        ]
        for name, g in spread.items():
            per = ", ".join(f"{v:.4f}" for v in g["per_seed"][head_metric])
            sd = g["std"].get(head_metric)
            lines.append(
                f"| {name} | {', '.join(map(str, g['seeds']))} | {per} | "
                f"{g['mean'][head_metric]:.4f} | {'—' if sd is None else f'{sd:.4f}'} |"
            )
    ov = doc.get("overlap")
    if ov and ov.get("n_unseen"):
        label = METRIC_LABELS.get(head_metric, head_metric)
        lines += [
            "",
            f"| {label} | {ov['n_seen']} queries with a training positive | "
            f"{ov['n_unseen']} queries without |",
            "|---|---:|---:|",
        ]
        for name in ov["parts"]["seen"]:
            if name in single:
                continue
            cells = []
            for part in ("seen", "unseen"):
                c = ov["parts"][part][name][head_metric]
                text = "—" if c.get("mean") is None else f"{c['mean']:.4f}"
                if c.get("delta") is not None:
                    text += f" ({_delta(c, 'p')})"
                cells.append(text)
            lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    rules = doc.get("diagnostics_rules") or []
    if rules:
        lines += ["", "DRT diagnostics, the seed's decision rules with the numbers they read:", ""]
        for r in rules:
            verdict = "holds" if r.get("holds") else "does not hold"
            lines.append(f"- {r.get('rule')}: {r.get('numbers')} ({verdict})")
    secs = doc.get("seconds_this_run")
    lines += [
        "",
        _reproduction_note(doc),
        "",
        f"From `{doc.get('experiment')}`'s report of {doc.get('created')}"
        + (f" (that run: {secs / 60:.1f} min)." if isinstance(secs, int | float) else "."),
    ]
    return "\n".join(lines) + "\n"


def read_block(text: str) -> str:
    """The text between :data:`BEGIN` and :data:`END` (exclusive, without the newline after
    ``BEGIN``).

    Raises:
        ValueError: the markers are missing or out of order.
    """
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no generated block: expected {BEGIN!r} ... {END!r}")
    return text[i + len(BEGIN) + 1 : j]


def replace_block(text: str, block: str) -> str:
    """``text`` with the generated block replaced by ``block``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    read_block(text)
    i, j = text.find(BEGIN), text.find(END)
    return text[: i + len(BEGIN)] + "\n" + block + text[j:]
