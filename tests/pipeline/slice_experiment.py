"""The small real experiment of the re-run and crash tests, and how their reports are compared.

Datasets: ``sci`` (the shared 60-query / 400-passage SciFact store, train + test, via
``store:``) trains ``linear`` with seeds 0 and 1 (a few steps; BM25 negatives are mined) and
diagnoses its first seed; ``tiny`` (a tiny BEIR folder, embedded by the run) is evaluation-only
and evaluates the runs zero-shot (``transfer: true``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.pipeline.tiny_beir import write_tiny_beir


def write_experiment(
    path: Path,
    store_root: Path,
    tiny: Path,
    lr: float = 0.001,
    diagnose: bool = True,
    **top: Any,
) -> Path:
    """Write the experiment YAML to ``path`` (``top`` overrides top-level sections;
    ``diagnose=False``: no diagnostics stage, for tests that do not need one)."""
    if not (tiny / "corpus.jsonl").exists():
        write_tiny_beir(tiny)
    raw: dict[str, Any] = {
        "name": "slice",
        "datasets": [
            {"name": "sci", "store": str(store_root), "train_split": "train",
             "eval_split": "test"},
            {"name": "tiny", "path": str(tiny), "format": "beir", "eval_split": "test"},
        ],
        "systems": ["bm25", "cosine"],
        "evaluate": {"k": 100, "baselines": ["cosine", "bm25"],
                     "metrics": ["mrr@10", "ndcg@10", "recall@100"], "seed": 0},
        "transfer": True,
        "diagnose": {"model": "linear" if diagnose else None, "baseline": "cosine"},
        "models": {
            "linear": {
                "family": "linear",
                "seeds": [0, 1],
                "data": {"batch_size": 16, "n_hard": 1, "mine_depth": 20},
                "trainer": {"epochs": 1, "max_steps": 3, "lr": lr, "log_every": 1},
                "validation": {"fraction": 0.0},  # the last step is the model (no early stop)
            }
        },
    }  # fmt: skip
    raw.update(top)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# wall-clock fields, and how a store was built (``resumed``: an embedding continued after a
# crash writes the same bytes; its statistics say it was resumed)
_VOLATILE = re.compile(r"seconds|created|finished_at|_at$|elapsed|time|^resumed$")


def _scrub(doc: Any, out: str) -> Any:
    if isinstance(doc, dict):
        return {k: _scrub(v, out) for k, v in doc.items() if not _VOLATILE.search(str(k))}
    if isinstance(doc, list):
        return [_scrub(v, out) for v in doc]
    if isinstance(doc, str):
        return doc.replace(out, "<OUT>")
    return doc


def report_numbers(out_dir: Path) -> dict[str, Any]:
    """``report.json``'s per-dataset part (every number of the report) with the output
    directory replaced by ``<OUT>`` and wall-clock fields dropped."""
    doc = json.loads((out_dir / "report.json").read_text())
    return _scrub(doc["datasets"], str(out_dir.resolve()))


def report_lines(out_dir: Path) -> list[str]:
    """``report.md`` without what differs between runs by construction: the creation time, the
    config file's path and its copy (a sweep setting's is its own ``experiment.yaml``), the
    stage table (times, reused / ran), training wall times, and the output directory."""
    text = (out_dir / "report.md").read_text().replace(str(out_dir.resolve()), "<OUT>")
    keep, in_stages = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            in_stages = line in ("## Stages", "## Configuration")
        if in_stages or line.startswith(("- created:", "- config:")):
            continue
        keep.append(re.sub(r"seconds=[0-9.e+-]+", "seconds=<t>", line))
    return keep


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Key paths where two JSON documents differ (for readable assertion messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += differences(a.get(k), b.get(k), f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{where}[{i}]")
        ]
    return [] if a == b else [f"{where}: {str(a)[:120]} != {str(b)[:120]}"]
