"""The experiment report: ``report.md`` (readable, with plots) and ``report.json`` (same numbers).

Every number in the report is copied from the stage that produced it (the evaluation stage's
``results.json``, the training summaries, the diagnostics JSON), never recomputed, so the report
and each stage's own command agree exactly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from treerank.atomic import atomic_write_text
from treerank.families import FAMILIES, family
from treerank.faults import crash_point
from treerank.metrics.metrics import headline_metric

if TYPE_CHECKING:
    from treerank.pipeline.config import ExperimentConfig
    from treerank.pipeline.outcome import DatasetOutcome
    from treerank.pipeline.stages import StageRecord


def _rel(path: Path | str | None, root: Path) -> str:
    if path is None:
        return ""
    p = Path(path)
    # lexically first: a sweep setting's stage directories are links into the shared cache
    for a, b in ((p.absolute(), root.absolute()), (p.resolve(), root.resolve())):
        try:
            return a.relative_to(b).as_posix()
        except ValueError:
            pass
    return str(p)


def _fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _seed_columns(spread: dict[str, Any]) -> list[int]:
    return sorted({int(x) for g in spread.values() for x in g["seeds"]})


_TRAINING_FIELDS = (
    "training_queries",
    "positive_pairs",
    "heldout_queries",
    "split_groups",
    "steps",
    "best_step",
    "kept_initialisation",
    "best_metric",
    "best_value",
    "stopped_early",
    "seconds",
)
"""The training-summary keys every family's row shows (then its family's ``report_fields``)."""

FINETUNE_REPORT_FIELDS = ("train_loss", "cpu_seconds", "peak_rss_mib", "tokens", "precision")
"""What an encoder fine-tune's row adds (its cost: the fine-tune stage's summary, which
``treerank.pipeline.experiment`` copies into a record marked ``encoder_finetune``)."""


def _training_rows(name: str, summary: dict[str, Any]) -> list[str]:
    s = summary.get("summary", {})
    name_ = str(summary.get("family"))
    if name_ in FAMILIES:
        fields = _TRAINING_FIELDS + family(name_).report_fields
    else:  # an encoder fine-tune's row (its record says so), or an unknown family's
        extra = FINETUNE_REPORT_FIELDS if summary.get("encoder_finetune") else ()
        fields = _TRAINING_FIELDS + extra
    keep = [(k, s[k]) for k in fields if k in s and not isinstance(s[k], dict | list)]
    cells = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in keep)
    return [f"| `{name}` | {cells or '—'} |"]


def summary_lines(
    name: str, o: DatasetOutcome, metric: str, baseline: str, min_queries: int = 30
) -> list[str]:
    """The headline for one dataset (:func:`treerank.evaluation.summary.headline`): the best
    system on ``metric``, its margin over ``baseline`` and, on datasets with a train split, the
    same on the queries whose relevant passages were never training positives."""
    from treerank.evaluation.summary import headline

    return headline(name, o.comparison, metric, baseline, o.overlap, min_queries)


def _seeds_used(cfg: ExperimentConfig, o: DatasetOutcome) -> dict[str, Any]:
    """The seeds behind one dataset's numbers: each trained run's training seed (from its
    resolved config), the paired tests' seed, and the diagnostics' probe seed (when it ran)."""
    return {
        "training": dict(o.seeds),
        "evaluation_tests": cfg.evaluate.seed,
        "diagnostics_probes": cfg.diagnose.probe_seed if o.diagnostics is not None else None,
    }


def _seeds_line(seeds: dict[str, Any]) -> str:
    parts = [f"`{r}` {s}" for r, s in seeds["training"].items()]
    text = "Seeds used: " + (f"training {', '.join(parts)}; " if parts else "")
    text += f"paired tests seed {seeds['evaluation_tests']}"
    if seeds.get("diagnostics_probes") is not None:
        text += f"; diagnostics probe split seed {seeds['diagnostics_probes']}"
    return text + "."


def write_report(
    cfg: ExperimentConfig,
    quick: bool,
    outcomes: dict[str, DatasetOutcome],
    records: list[StageRecord],
    encoder: dict[str, Any],
    seconds: float,
) -> tuple[Path, Path]:
    """Write ``<output_dir>/report.md`` and ``report.json`` atomically; returns both paths."""
    root = cfg.output_dir
    now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    stages = [
        {
            "stage": r.name,
            "seconds": round(r.seconds, 2),
            "reused": r.reused,
            "skipped": r.skipped,
            "path": _rel(r.path, root),
        }
        for r in records
    ]
    doc: dict[str, Any] = {
        "experiment": cfg.name,
        "config_file": str(cfg.source),
        "quick": quick,
        "created": now,
        "encoder": encoder,
        "seconds_this_run": round(seconds, 2),
        "stages": stages,
        "config": cfg.raw,
        "datasets": {},
    }
    md: list[str] = [
        f"# treerank report: {cfg.name}{' (quick profile)' if quick else ''}",
        "",
        f"- created: {now}; this run took {_fmt_seconds(seconds)} "
        f"({sum(r.reused for r in records)} of {len(records)} stages reused"
        + (
            f", {sum(r.skipped is not None for r in records)} skipped: see Stages)"
            if any(r.skipped is not None for r in records)
            else ")"
        ),
        f"- config: `{cfg.source}`",
        f"- encoder: `{encoder.get('name')}` (dim {encoder.get('dim')}), weights fingerprint "
        f"`{str(encoder.get('fingerprint'))[:16]}`, query prompt: "
        f"{repr(encoder.get('query_prompt')) if encoder.get('query_prompt') else 'none'}",
        "- evaluation: every query of the evaluation split ranked against **all passages of that "
        "split**; MRR@10 leaves out queries without a relevant passage (counted below); "
        "p = paired randomization test against the baseline (* p < 0.05).",
        "",
    ]
    metric = headline_metric(cfg.evaluate.metrics)
    md += ["## Summary", ""]
    for name, o in outcomes.items():
        md += summary_lines(name, o, metric, cfg.evaluate.baselines[0])
    md.append("")
    if cfg.transfer:
        from treerank.pipeline.transfer import transfer_tables

        md += [
            "## Transfer: each model x training source on every dataset",
            "",
            "Cell: mean (paired delta vs each baseline, * p < 0.05, randomization test); on the "
            "model's own dataset also its unseen-positive part.",
            "",
            transfer_tables(outcomes, cfg.evaluate.metrics, cfg.evaluate.baselines),
        ]
    for name, o in outcomes.items():
        doc["datasets"][name] = _dataset_doc(cfg, o, root)
        md += _dataset_lines(cfg, name, o, metric, root)
    md += ["## Stages", "", "| stage | time | status |", "|---|---:|---|"]
    for r in records:
        time_cell = "—" if r.skipped is not None else _fmt_seconds(r.seconds)
        md.append(f"| `{r.name}` | {time_cell} | {r.status} |")
    md += [
        "",
        "Times of reused stages are those of the run that produced them.",
        "",
        "## Configuration",
        "",
        "```yaml",
        yaml.safe_dump(cfg.raw, sort_keys=False).strip(),
        "```",
        "",
    ]
    md_path, json_path = root / "report.md", root / "report.json"
    atomic_write_text(json_path, json.dumps(doc, indent=2, sort_keys=False, default=str))
    crash_point("report", "mid-write")  # report.json new, report.md not yet
    atomic_write_text(md_path, "\n".join(md) + "\n")
    return md_path, json_path


def _dataset_doc(cfg: ExperimentConfig, o: DatasetOutcome, root: Path) -> dict[str, Any]:
    """One dataset's entry of ``report.json`` (every number as its stage wrote it)."""
    return {
        "eval_split": o.eval_split,
        "store": _rel(o.store, root),
        "store_stats": o.store_stats,
        "comparison": o.comparison,
        "overlap": o.overlap,
        "lexical_gap": o.lexical_gap,
        "family_reports": {f: r.get("stats") for f, r in o.family_reports.items()},
        "training": o.training,
        "diagnostics": o.diagnostics,
        "seeds": _seeds_used(cfg, o),
    }


def _section(title: str, intro: str, body: str) -> list[str]:
    """A ``###`` section: its title, one intro paragraph and a markdown body."""
    return [f"### {title}", "", intro, "", body.strip(), ""]


def _dataset_lines(
    cfg: ExperimentConfig, name: str, o: DatasetOutcome, metric: str, root: Path
) -> list[str]:
    """One dataset's section of ``report.md``: its split, warnings, comparison table, seeds,
    seed variance, seen / unseen and lexical-gap tables, plots, family parts, training and
    diagnostics."""
    comp = o.comparison
    any_sys: dict[str, Any] = next(iter(comp.get("systems", {}).values()), {})
    md = [f"## {name} — {o.eval_split} split", ""]
    st = o.store_stats.get(o.eval_split, {})
    if st:
        md += [
            f"{st.get('n_queries')} queries against {st.get('n_passages')} passages "
            f"(K = {st.get('k')} candidate slots per query: the source's candidate lists, or "
            "its judged passages where it has none); "
            f"{any_sys.get('n_evaluated', '?')} queries evaluated, "
            f"{any_sys.get('n_left_out', '?')} left out (no relevant passage).",
            "",
        ]
    warned = [(sp, w) for sp, sst in o.store_stats.items() for w in sst.get("warnings") or []]
    md += [f"- warning ({sp} split): {w}" for sp, w in warned] + ([""] if warned else [])
    md += [o.comparison_markdown.strip(), "", _seeds_line(_seeds_used(cfg, o)), ""]
    if o.train_store is None:
        md += [
            "Seen / unseen split: skipped (this dataset has no train split, so no query "
            "can have a training positive).",
            "",
        ]
    md += _seed_variance_lines(comp.get("seed_spread") or {}, comp.get("metrics", []), metric)
    if o.overlap_markdown:
        trained = comp.get("trained")
        intro = (
            "Queries split by whether one of their relevant passages was also relevant to a "
            "training query (matched by source passage id)."
        )
        if trained is None or trained:
            intro += (
                " A trained model's gain on the first group can be memorised citations; the "
                "second group shows what generalises."
            )
        md += _section("Seen vs unseen positives", intro, o.overlap_markdown)
    if o.lexical_gap_markdown:
        intro = (
            "Where each system wins: queries bucketed by how much of their terms' idf mass "
            "their relevant passages contain (1 = all of it, BM25's home ground; near 0 = "
            "vocabulary mismatch, only a dense model can bridge it)."
        )
        md += _section("Lexical gap", intro, o.lexical_gap_markdown)
    if o.eval_dir is not None:
        for png, title in (
            ("deltas.png", "Difference to the baseline per system"),
            ("recall_at_k.png", "Recall@k"),
            ("lexical_gap.png", "Lexical gap"),
            ("fusion_tuning.png", "Fusion weight tuning"),
        ):
            p = o.eval_dir / "plots" / png
            if p.exists():
                md.append(f"![{title} — {name}]({_rel(p, root)})")
        md += [
            "",
            f"Files: per-query values `{_rel(o.eval_dir / 'per_query.jsonl', root)}`, "
            f"TREC runs `{_rel(o.eval_dir / 'runs', root)}/`, "
            f"numbers `{_rel(o.eval_dir / 'results.json', root)}`.",
            "",
        ]
    for part in o.family_reports.values():
        if part.get("markdown"):
            md += [str(part["markdown"]).strip(), ""]
    if o.training:
        md += ["### Training", "", "| model | summary |", "|---|---|"]
        for m, s in o.training.items():
            md += _training_rows(m, s)
        md.append("")
        for m, ck in o.checkpoints.items():
            md += [
                f"![{m}: {fig.stem}]({_rel(fig, root)})" for fig in sorted(Path(ck).glob("*.png"))
            ]
        md.append("")
    if o.diagnostics is not None and o.diagnose_dir is not None:
        md += _diagnostics_lines(o.diagnostics, o.diagnose_dir / "report.md", root)
    return md


def _seed_variance_lines(spread: dict[str, Any], metrics: list[str], metric: str) -> list[str]:
    """The training-seed variance table (per model and metric: each seed, mean, std)."""
    if not spread:
        return []
    seeds = _seed_columns(spread)
    md = [
        "### Training-seed variance",
        "",
        "Each model below was trained once per seed and every seed was evaluated. The "
        f"row `<model>` in the table above is the seed average: per query, its {metric} "
        "is the mean over seeds of that seed's own ranking's value (not a score "
        "ensemble); its delta and p test that seed-averaged value against the baseline.",
        "",
        "| model | metric | " + " | ".join(f"seed {x}" for x in seeds) + " | mean | std |",
        "|---|---|" + "---:|" * (len(seeds) + 2),
    ]
    for model, g in spread.items():
        for m in metrics:
            by_seed = dict(zip(g["seeds"], g["per_seed"][m], strict=True))
            cells = [f"{by_seed[x]:.4f}" if x in by_seed else "—" for x in seeds]
            sd = g["std"].get(m)
            md.append(
                f"| `{model}` | {m} | "
                + " | ".join(cells)
                + f" | {g['mean'][m]:.4f} | {'—' if sd is None else f'{sd:.4f}'} |"
            )
    return md + [""]


def _diagnostics_lines(diagnostics: dict[str, Any], rep: Path, root: Path) -> list[str]:
    """The diagnostics section: each decision rule, its numbers and verdict, and a link to the
    full diagnostics report ``rep`` when it exists."""
    md = [
        "### Diagnostics",
        "",
        "The DRT seed's decision rules, next to the numbers they read:",
        "",
    ]
    for r in diagnostics.get("rules") or []:
        md.append(f"- *{r.get('rule', '')}*: {r.get('numbers', '')}")
        md.append(
            f"  - **{'holds' if r.get('holds') else 'does not hold'}**: {r.get('conclusion', '')}"
        )
    if rep.exists():
        link = _rel(rep, root)
        md.append(f"\nFull diagnostics (tables, plots): [{link}]({link})")
    return md + [""]
