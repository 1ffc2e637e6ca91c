"""Assemble docs/results/cross_encoder_squad_cpu.json from a scripts/ce_squad_cpu.sh run.

Usage: ce_squad_report.py RUN N OUT.json

Reads RUN/ce/results.json (the training, its cost), RUN/eval/results.json (BM25 and the
reranked BM25 on the seeded N-question dev sample, paired tests) and the two /usr/bin/time -v
files (CPU seconds user + system, peak RSS, wall clock of each command).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from treerank.atomic import atomic_write_json


def _time_file(path: Path) -> dict[str, Any]:
    """CPU seconds (user + system), peak RSS MiB and wall clock of a ``/usr/bin/time -v`` file."""
    got: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.strip().rpartition(": ")
        got[key] = value
    cpu = float(got["User time (seconds)"]) + float(got["System time (seconds)"])
    return {
        "cpu_seconds": round(cpu, 2),
        "peak_rss_mib": round(int(got["Maximum resident set size (kbytes)"]) / 1024.0, 1),
        "wall_clock": got["Elapsed (wall clock) time (h:mm:ss or m:ss)"],
        "exit_status": int(got.get("Exit status", "0")),
    }


def _cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main(run: Path, n: int, out: Path) -> None:
    train = json.loads((run / "ce" / "results.json").read_text(encoding="utf-8"))
    ev = json.loads((run / "eval" / "results.json").read_text(encoding="utf-8"))
    rerank = next(s for s in ev["systems"] if s.startswith("rescore:"))
    t_train, t_rerank = _time_file(run / "time_train.txt"), _time_file(run / "time_rerank.txt")
    pairs = 20 * int(ev["settings"]["n_queries"])
    tests = ev["tests"]["bm25"][rerank]
    doc = {
        "issue": 32,
        "what": "a cross-encoder trained on SQuAD train questions reranks BM25's top 20 on a "
        f"seeded {n}-question SQuAD dev sample, against every passage of the split",
        "commands": [
            "SQUAD=<store root> bash scripts/ce_squad_cpu.sh",
            "treerank finetune configs/finetune/squad_cross_encoder.yaml --store STORE -o RUN/ce",
            "treerank evaluate --store STORE/dev --system bm25 --system "
            "'rescore:bm25:depth=20,scorer=ce:RUN/ce/model,precision=auto' --baseline bm25 --k 20 "
            f"--sample-queries {n} --sample-seed 0",
        ],
        "cpu": _cpu_model(),
        "threads": 1,
        "note": "CPU seconds are the process's own (user + system); the machine was shared "
        "by other jobs, so wall clock says little",
        "training": {
            "config": train["config"],
            "n_train_queries": train["n_train_queries"],
            **{k: train["training"][k] for k in ("loss", "steps", "groups", "pairs")},
            "train_loss": train["training"]["train_loss"],
            "cost_trainer": train["cost"]["train"],
            "cost_command": t_train,
        },
        "rerank": {
            "sample": ev["settings"].get("sample"),
            "n_passages": ev["settings"]["n_passages"],
            "pairs_scored": pairs,
            "cost_command": t_rerank,
            "pairs_per_cpu_second_upper_bound": round(pairs / t_rerank["cpu_seconds"], 2),
        },
        "systems": {s: r["mean"] for s, r in ev["systems"].items()},
        "first_stage_recall@20": ev["systems"]["bm25"]["mean"]["recall@20"],
        "paired_vs_bm25": {
            m: {
                k: t[k] for k in ("delta", "p_randomization", "ci_low", "ci_high", "wins", "losses")
            }
            for m, t in tests.items()
        },
        "references_all_of_dev": {"bm25 ndcg@10": 0.822, "tuned fusion ndcg@10": 0.861},
    }
    atomic_write_json(out, doc, indent=1)
    print(json.dumps({"systems": doc["systems"], "paired": doc["paired_vs_bm25"]}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
