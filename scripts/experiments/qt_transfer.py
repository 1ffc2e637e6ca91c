"""Zero-shot transfer of a tuned query tower (issue 35): re-encode another collection's queries
with the tower of a ``treerank finetune`` run and evaluate it against frozen cosine on every
passage of that split (the passage vectors are the store's own, as the tower was trained against
the same encoder's vectors), with the usual paired tests. Writes ``OUT/results.json`` and prints
the table.

Usage: qt_transfer.py RUN STORE_SPLIT OUT [--permutations N]

Example (the SciFact test split of the main job's store):
    python scripts/experiments/qt_transfer.py runs/ft-squad-qt runs/sample/stores/scifact/test \
        runs/qt-transfer-scifact
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from treerank.atomic import atomic_write_json
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings
from treerank.pipeline.finetune import (
    TunedStoreSystem,
    cost_clock,
    cost_since,
    paired_summary,
    reembed_split,
)
from treerank.store import EmbeddingStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("store", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--permutations", type=int, default=10_000)
    args = ap.parse_args()
    parent = EmbeddingStore.open(args.store)
    t0 = cost_clock()
    tuned = reembed_split(args.run, parent, args.out / "store", overwrite=True)
    reembed = cost_since(t0)
    t1 = cost_clock()
    settings = EvaluationSettings(n_permutations=args.permutations, baseline="cosine")
    comp = compare_systems(
        parent,
        {"cosine": "cosine", "query-tower": TunedStoreSystem(tuned, "query-tower")},
        settings=settings,
        out_dir=args.out / "eval",
    )
    evaluate = cost_since(t1)
    finetune = json.loads((args.run / "finetune.json").read_text(encoding="utf-8"))
    doc = {
        "issue": 35,
        "what": "zero-shot transfer of a tuned query tower to another collection",
        "run": str(args.run),
        "trained_on": finetune["trained_on"],
        "n_train_queries": finetune["summary"]["rows_trained"],
        "store": str(args.store),
        "n_queries": int(parent.n_queries),
        "n_passages": int(parent.n_passages),
        "systems": {s: dict(r.mean) for s, r in comp.results.items()},
        "paired_vs_cosine": paired_summary(comp.tests["cosine"]["query-tower"]),
        # zero-shot: no query or passage of this collection was trained on
        "seen_unseen": {"n_seen": 0, "n_unseen": int(parent.n_queries)},
        "cost": {"reembed": reembed, "evaluate": evaluate},
    }
    atomic_write_json(args.out / "results.json", doc, indent=1)
    print(json.dumps({"systems": doc["systems"], "paired": doc["paired_vs_cosine"]}, indent=1))


if __name__ == "__main__":
    main()
