"""Assemble docs/results/cross_encoder_zero_shot_<name>.json from a scripts/ce_zero_shot.sh run.

Usage: ce_zero_shot_report.py CE RUN NAME DEPTH OUT.json

Reads CE/results.json (the cross-encoder's training: where and on what it was trained),
RUN/eval/results.json (BM25, cosine, ``rrf:bm25+cosine`` and its cross-encoder rerank, paired
tests against the first stage), RUN/eval/overlap.json when the split has a training sibling
(the seen / unseen parts: queries with / without a positive among that split's training
positives) and the ``/usr/bin/time -v`` file of the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ce_squad_report import _cpu_model, _time_file

from treerank.atomic import atomic_write_json

FIRST = "rrf:bm25+cosine"
PAIRED_KEYS = ("delta", "p_randomization", "ci_low", "ci_high", "wins", "losses")


def main(ce: Path, run: Path, name: str, depth: int, out: Path) -> None:
    train = json.loads((ce / "results.json").read_text(encoding="utf-8"))
    ev = json.loads((run / "eval" / "results.json").read_text(encoding="utf-8"))
    rerank = next(s for s in ev["systems"] if s.startswith("rescore:"))
    overlap_path = run / "eval" / "overlap.json"
    overlap = (
        json.loads(overlap_path.read_text(encoding="utf-8")) if overlap_path.is_file() else None
    )
    t = _time_file(run / "time_rerank.txt")
    nq = int(ev["settings"]["n_queries"])
    tests = ev["tests"][FIRST][rerank]
    doc: dict[str, Any] = {
        "issue": 32,
        "what": f"zero-shot: the SQuAD-trained cross-encoder reranks the top {depth} of {FIRST} "
        f"on {name}, against every passage of the split",
        "command": f"CE={ce} STORE=<split> NAME={name} bash scripts/ce_zero_shot.sh",
        "cpu": _cpu_model(),
        "threads": 1,
        "cross_encoder": {
            "trained_on": train["store"],
            "train_split": train["train_split"],
            "steps": train["training"]["steps"],
            "fingerprint": train["fingerprint"],
        },
        "n_queries": nq,
        "n_passages": int(ev["settings"]["n_passages"]),
        "depth": depth,
        "pairs_scored_at_most": depth * nq,
        "cost_command": t,
        "systems": {s: r["mean"] for s, r in ev["systems"].items()},
        "rerank_spec": rerank,
        "first_stage_recall": ev["systems"][FIRST]["mean"][f"recall@{depth}"],
        "paired_vs_first_stage": {
            m: {
                k: v[k] for k in ("delta", "p_randomization", "ci_low", "ci_high", "wins", "losses")
            }
            for m, v in tests.items()
        },
        "seen_unseen": None
        if overlap is None
        else {
            "n_seen": overlap["n_seen"],
            "n_unseen": overlap["n_unseen"],
            "ndcg@10": {
                part: {s: overlap["parts"][part][s]["ndcg@10"] for s in (FIRST, rerank)}
                for part in ("seen", "unseen")
            },
        },
    }
    atomic_write_json(out, doc, indent=1)
    print(json.dumps({"systems": doc["systems"], "paired": doc["paired_vs_first_stage"]}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]))
