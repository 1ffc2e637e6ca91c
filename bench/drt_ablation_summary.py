"""Summarise a DRT ablation sweep (``treerank sweep configs/sweeps/drt_ablation_*.yaml``).

Reads the sweep's ``sweep.json`` (each setting against the reference setting) and every setting's
evaluation (``settings/<slug>/eval/<dataset>/results.json``: the model against the untrained
``cosine`` baseline on all queries and, where the store root has a train split, on the queries
whose relevant passages were never training positives) and training stage (best step, steps run,
held-out metric), and writes one markdown table plus a copy of the sweep's own files:

    python bench/drt_ablation_summary.py runs/drt-ablation-scifact-store-sweep \\
        bench/results/drt_ablation/scifact --title "SciFact test, early stopping"

Every number is read from files the sweep wrote; nothing is recomputed.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any


def _p(p: float | None) -> str:
    if p is None:
        return "n/a"
    return "<1e-4" if p < 1e-4 else f"{p:.3g}"


def _cell(delta: float | None, p: float | None) -> str:
    if delta is None:
        return "-"
    star = "*" if p is not None and p < 0.05 else ""
    return f"{delta:+.4f} ({_p(p)}{star})"


def summarise(sweep_dir: Path, system: str = "drt", metric: str = "ndcg@10") -> dict[str, Any]:
    """Rows of the summary: one per setting, read from the sweep's files."""
    doc = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    keys = doc["keys"]
    rows = []
    for s in doc["settings"]:
        slug = s["slug"]
        sweep_row = next(r for r in doc["rows"] if r["setting"] == slug and r["system"] == system)
        ds = sweep_row["dataset"]
        res = json.loads(
            (sweep_dir / "settings" / slug / "eval" / ds / "results.json").read_text("utf-8")
        )
        base = res["baseline"]
        test = res["tests"][base][system][metric]
        train_dir = (sweep_dir / "settings" / slug / "models" / ds / system).resolve()
        train = json.loads((train_dir / "stage.json").read_text("utf-8"))["summary"]["summary"]
        row: dict[str, Any] = {
            "values": s["values"],
            "dataset": ds,
            "mean": sweep_row[metric]["mean"],
            "vs_reference": (sweep_row[metric]["delta"], sweep_row[metric]["p"]),
            "reference": sweep_row["reference"],
            "baseline": base,
            "baseline_mean": res["systems"][base]["mean"][metric],
            "vs_baseline": (test["delta"], test["p_randomization"]),
            "best_step": train.get("best_step"),
            "steps": train.get("steps"),
            "heldout": (train.get("best_metrics") or {}).get(metric),
            "n": test["n"],
        }
        ov = res.get("overlap")
        if ov and ov.get("n_unseen"):
            cell = ov["parts"]["unseen"][system][metric]
            row["unseen"] = {
                "n": ov["n_unseen"],
                "mean": cell["mean"],
                "baseline_mean": ov["parts"]["unseen"][base][metric]["mean"],
                "vs_baseline": (cell.get("delta"), cell.get("p")),
            }
        rows.append(row)
    return {"keys": keys, "metric": metric, "system": system, "rows": rows}


def markdown(summary: dict[str, Any], title: str) -> str:
    keys, metric, system = summary["keys"], summary["metric"], summary["system"]
    rows = summary["rows"]
    base = rows[0]["baseline"]
    unseen = all("unseen" in r for r in rows)
    head = [k.split(".")[-1] for k in keys] + [
        "best step / steps",
        f"held-out {metric}",
        f"{system} {metric}",
        "Δ vs reference (p)",
        f"Δ vs {base} (p)",
    ]
    if unseen:
        head += [f"unseen: {system}", f"unseen: Δ vs {base} (p)"]
    r0 = rows[0]
    lines = [
        f"## {title}",
        "",
        f"{r0['n']} evaluated queries; `{base}` (untrained) scores {metric} "
        f"{r0['baseline_mean']:.4f}"
        + (
            f", and {r0['unseen']['baseline_mean']:.4f} on the {r0['unseen']['n']} queries whose "
            "relevant passages were never training positives (unseen)"
            if unseen
            else ""
        )
        + ". Δ: paired mean difference; p: paired randomization test (10,000 draws); "
        "* p < 0.05. Reference = the DRT seed's default (lambda_dec 0.1, slot dropout 0.15, "
        "k 6). Best step 0 = early stopping kept the untrained initialisation.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in rows:
        held = "-" if r["heldout"] is None else f"{r['heldout']:.4f}"
        cells = [str(r["values"][k]) for k in keys] + [
            f"{r['best_step']} / {r['steps']}",
            held,
            f"{r['mean']:.4f}",
            "ref" if r["reference"] else _cell(*r["vs_reference"]),
            _cell(*r["vs_baseline"]),
        ]
        if unseen:
            u = r["unseen"]
            cells += [f"{u['mean']:.4f}", _cell(*u["vs_baseline"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--title", default="DRT ablation")
    ap.add_argument("--command", default="", help="the sweep command, recorded in summary.md")
    args = ap.parse_args()
    summary = summarise(args.sweep_dir)
    out = args.out_dir
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for name in ("sweep.md", "sweep.json"):
        shutil.copyfile(args.sweep_dir / name, out / name)
    for png in sorted((args.sweep_dir / "plots").glob("*.png")):
        shutil.copyfile(png, out / "plots" / png.name)
    md = markdown(summary, args.title)
    if args.command:
        md += f"\nCommand: `{args.command}`\n"
    (out / "summary.md").write_text(md, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
