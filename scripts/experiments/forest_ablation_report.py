"""Main effects of a two-level forest ablation sweep (full or half-fraction design).

Reads a finished ``treerank sweep`` directory (``settings/<slug>/experiment.yaml`` and
``settings/<slug>/eval/<dataset>/per_query.jsonl``) and writes, for one system and dataset:

* one row per setting (mean metric per setting), and
* each swept key's **main effect**: per query, the mean over the settings at the key's second
  value minus the mean over the settings at its first value (Box, Hunter & Hunter,
  *Statistics for Experimenters*, 2nd ed., ch. 5-6), with its paired 95% bootstrap CI and
  randomization p (:mod:`treerank.evaluation.significance`, 10,000 draws, seed 0). In a
  half fraction of k keys (defining relation ``I = AB..K``) each main effect is aliased with a
  (k-1)-factor interaction: free of two-factor interactions from k = 4 on.

Works on any two-level sweep (``--system``, ``--dataset``); the metrics are those the sweep's
experiment evaluated among ndcg@10, mrr@10, recall@100.

Usage::

    python scripts/experiments/forest_ablation_report.py \\
        --sweep runs/forest-ablation-squad-sweep \\
        --config configs/sweeps/forest_ablation_squad.yaml --dataset squad --system forest \\
        --out docs/results/forest_ablation_squad
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from treerank.atomic import atomic_write_text
from treerank.evaluation.significance import compare_paired
from treerank.pipeline.sweep import read_per_query, settings_of, split_sweep_section

METRICS = ("ndcg@10", "mrr@10", "recall@100")  # reported when the sweep evaluated them


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sweep", type=Path, required=True, help="the sweep's output directory")
    ap.add_argument("--config", type=Path, required=True, help="the sweep YAML it ran")
    ap.add_argument("--dataset", default="squad", help="dataset name (default: squad)")
    ap.add_argument("--system", default="forest", help="system name (default: forest)")
    ap.add_argument("--out", type=Path, required=True, help="writes <out>.md and <out>.json")
    args = ap.parse_args()

    raw = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    _, sec = split_sweep_section(raw, args.config)
    grid = {k: list(v) for k, v in sec["grid"].items()}
    settings = settings_of(grid, str(sec.get("design") or "full"))
    if any(len(v) != 2 for v in grid.values()):
        raise SystemExit(f"{args.config}: main effects need two values per key")
    evaluated = (raw.get("evaluate") or {}).get("metrics") or list(METRICS)
    metrics = [m for m in METRICS if m in evaluated]
    per: dict[str, dict[str, np.ndarray]] = {}
    base = None
    for s in settings:
        d = args.sweep / "settings" / s.slug / "eval" / args.dataset
        if not (d / "per_query.jsonl").is_file():
            raise SystemExit(f"{d}: no per_query.jsonl (is --dataset {args.dataset!r} right?)")
        pq = read_per_query(d, metrics)
        if args.system not in pq:
            raise SystemExit(f"{d}: no system {args.system!r}; there: {', '.join(pq)}")
        per[s.slug] = pq[args.system]
        base = pq.get("cosine")
    rows = [
        {**s.values, **{m: float(np.nanmean(per[s.slug][m])) for m in metrics}} for s in settings
    ]
    effects: list[dict[str, Any]] = []
    for key, values in grid.items():
        lo = [s.slug for s in settings if s.values[key] == values[0]]
        hi = [s.slug for s in settings if s.values[key] == values[1]]
        hi_mean = {m: np.mean([per[x][m] for x in hi], axis=0) for m in metrics}
        lo_mean = {m: np.mean([per[x][m] for x in lo], axis=0) for m in metrics}
        for m, t in compare_paired(hi_mean, lo_mean, metrics).items():
            effects.append(
                {
                    "key": key,
                    "from": values[0],
                    "to": values[1],
                    "metric": m,
                    "effect": t.delta,
                    "ci_low": t.ci_low,
                    "ci_high": t.ci_high,
                    "p": t.p_randomization,
                }
            )
    short = {k: k.split(".")[-1] for k in grid}
    lines = [
        f"{args.dataset}: `{args.system}` in every setting of `{args.config}` "
        f"({sec.get('design') or 'full'} design, {len(settings)} settings).",
        "",
        "| " + " | ".join(short.values()) + " | " + " | ".join(metrics) + " |",
        "|" + "---|" * (len(grid) + len(metrics)),
    ]
    for r in sorted(rows, key=lambda r: -r["ndcg@10"]):
        lines.append(
            "| "
            + " | ".join(str(r[k]) for k in grid)
            + " | "
            + " | ".join(f"{r[m]:.4f}" for m in metrics)
            + " |"
        )
    if base is not None:
        lines += [
            "",
            "cosine (same queries): "
            + ", ".join(f"{m} {float(np.nanmean(base[m])):.4f}" for m in metrics),
        ]
    lines += [
        "",
        "Main effects (per query: mean over the settings at the second value minus the mean over "
        "those at the first; paired 95% bootstrap CI, randomization p):",
        "",
        "| key | change | metric | effect | 95% CI | p |",
        "|---|---|---|---:|---|---:|",
    ]
    for e in effects:
        lines.append(
            f"| {short[e['key']]} | {e['from']} -> {e['to']} | {e['metric']} | "
            f"{e['effect']:+.4f} | [{e['ci_low']:+.4f}, {e['ci_high']:+.4f}] | {e['p']:.4f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    atomic_write_text(
        args.out.with_suffix(".json"),
        json.dumps({"settings": rows, "main_effects": effects}, indent=1) + "\n",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
