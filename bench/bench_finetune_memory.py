"""Memory and speed of the encoder fine-tune's controls (issue 35 item 3): peak RSS and CPU
seconds per optimiser step of the bi-encoder and ``drt-e2e`` at batch 32 (query 32 + passage
256 tokens, real SciFact claims and abstracts), plain, with gradient checkpointing and with
GradCache.

Reference measured in the same run: the plain ``biencoder`` step (fp32, MNRL). Every variant
runs as its own process (``ru_maxrss`` is a process's peak), one after another, so the ratios
compare whole processes on the same machine. Peak RSS includes the loaded model, the store's
texts and the trainer (what a user's run holds); ``cpu_s_per_step`` is the process's CPU
seconds between the end of the first logged step and the end of the last, over the steps in
between (loading and the first, warming-up step excluded).

Run: ``python bench/bench_finetune_memory.py --store runs/sample/stores/scifact/train
[--steps 4] [--out bench/results/finetune_memory.json]`` (about 10 CPU-min on 2 EPYC cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "biencoder": ("biencoder", {}),
    "biencoder + checkpointing": ("biencoder", {"gradient_checkpointing": True}),
    "biencoder + GradCache (mini-batch 8)": (
        "biencoder",
        {"loss": "cached-mnrl", "mini_batch_size": 8},
    ),
    "drt-e2e": ("drt-e2e", {}),
    "drt-e2e + GradCache (mini-batch 8)": (
        "drt-e2e",
        {"loss": "cached-mnrl", "mini_batch_size": 8},
    ),
}
REFERENCE = "biencoder"


def one(store: Path, name: str, steps: int) -> dict[str, Any]:
    """Run variant ``name`` for ``steps`` steps in this process; its cost."""
    from treerank.store import EmbeddingStore
    from treerank.training.finetune import finetune
    from treerank.training.finetune_config import parse_finetune_config

    family, trainer = VARIANTS[name]
    cfg = parse_finetune_config(
        {
            "family": family,
            "seed": 0,
            "model": {"max_query_length": 32, "max_passage_length": 256},
            "data": {"batch_size": 32},
            "trainer": {
                "max_steps": steps,
                "save_steps": 0,
                "threads": 1,
                "logging_steps": 1,
                **trainer,
            },
            "validation": {"fraction": 0},
        }
    )
    marks: list[float] = []  # this process's CPU seconds at the end of every step
    with tempfile.TemporaryDirectory() as tmp:
        out = finetune(
            EmbeddingStore.open(store),
            cfg,
            Path(tmp) / "run",
            log=lambda _line: marks.append(time.process_time()),
        )
    cost = out.summary["cost"]
    if len(marks) < 2:
        raise SystemExit(f"{name}: need >= 2 logged steps to time one, got {len(marks)}")
    return {
        "steps": out.summary["steps"],
        # steps 2..N (the first one warms up; loading is before it)
        "cpu_s_per_step": (marks[-1] - marks[0]) / (len(marks) - 1),
        "peak_rss_mib": cost["peak_rss_mib"],
        "tokens_per_step": cost["tokens"] / max(1, out.summary["steps"]),
    }


def run(store: Path, steps: int) -> dict[str, Any]:
    """Every variant in its own process; ratios against :data:`REFERENCE`."""
    from bench_encoding import lscpu

    rows: dict[str, Any] = {}
    for name in VARIANTS:
        cmd = [sys.executable, __file__, "--store", str(store), "--steps", str(steps)]
        res = subprocess.run([*cmd, "--one", name], capture_output=True, text=True, check=True)
        rows[name] = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"{name}: {rows[name]}", file=sys.stderr)
    ref = rows[REFERENCE]
    for row in rows.values():
        row["time_ratio"] = row["cpu_s_per_step"] / ref["cpu_s_per_step"]
        row["rss_ratio"] = row["peak_rss_mib"] / ref["peak_rss_mib"]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python bench/bench_finetune_memory.py --store STORE --steps "
        f"{steps}",
        "store": str(store),
        "cpu": lscpu(),
        "load_average": os.getloadavg(),
        "setup": {"batch_size": 32, "max_query_length": 32, "max_passage_length": 256,
                  "threads": 1, "precision": "fp32", "reference": REFERENCE},
        "rows": rows,
    }  # fmt: skip


def render(doc: dict[str, Any]) -> str:
    """The Markdown table of ``doc`` (ratios against the plain bi-encoder step)."""
    cpu = doc["cpu"].get("Model name", "?")
    load = doc.get("load_average")
    at = f" (1-min load average {load[0]:.1f} at the end)" if load else ""
    lines = [
        f"Batch {doc['setup']['batch_size']} (query {doc['setup']['max_query_length']} + "
        f"passage {doc['setup']['max_passage_length']} tokens), fp32, one thread, {cpu}; "
        f"`{doc['command']}`, {doc['date']}{at}.",
        "",
        "| variant | CPU-s per step | x plain bi-encoder | peak RSS MiB | x plain bi-encoder |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in doc["rows"].items():
        lines.append(
            f"| {name} | {r['cpu_s_per_step']:.1f} | {r['time_ratio']:.2f} | "
            f"{r['peak_rss_mib']:.0f} | {r['rss_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--one", choices=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=Path("bench/results/finetune_memory.json"))
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.one:
        print(json.dumps(one(a.store, a.one, a.steps)))
        return
    doc = run(a.store, a.steps)
    from treerank.atomic import atomic_write_json, atomic_write_text

    atomic_write_json(a.out, doc, indent=1)
    atomic_write_text(a.out.with_suffix(".md"), render(doc) + "\n")
    print(render(doc))


if __name__ == "__main__":
    main()
