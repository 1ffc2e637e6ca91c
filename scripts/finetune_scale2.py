"""The DRT seed's Scale-2 comparison from two `treerank finetune` runs of equal budget.

Usage (docs/finetune.md, "Scale 2"):

    python scripts/finetune_scale2.py --store stores/scifact \
        --bi runs/ft-scifact-bi-s2 --drt runs/ft-scifact-drt-e2e \
        --out docs/results/finetune_scifact_drt_e2e.json

Reads both runs' re-embedded evaluation stores (RUN/stores/<split>) and the drt-e2e heads
(RUN/drt_head), and writes the drt-e2e run's results.json with a "scale2" block added:

* paired tests (randomization p, bootstrap 95% CI) of drt-e2e against the biencoder arm on all
  queries and on the seen / unseen parts (baseline: the biencoder arm), with frozen cosine and
  cosine over the drt-e2e encoder's own vectors beside them;
* the CKA table (treerank.diagnostics.drift): raw vectors of the two tuned encoders (and each
  against the frozen store), the drt-e2e heads' concatenated slots and each slot over the two
  encoders' vectors, for passages and queries.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _cka_table(head: Any, frozen: Any, bi: Any, drt: Any) -> dict[str, Any]:
    from treerank.diagnostics.cka import linear_cka
    from treerank.diagnostics.drift import drt_slot_drift

    out: dict[str, Any] = {}
    for side, get in (("passages", lambda s: s.passages), ("queries", lambda s: s.queries)):
        f, b, d = (np.asarray(get(s), dtype=np.float32) for s in (frozen, bi, drt))
        one = "passage" if side == "passages" else "query"
        out[side] = {
            "raw_bi_vs_drt": float(linear_cka(b, d)),
            "raw_frozen_vs_bi": float(linear_cka(f, b)),
            "raw_frozen_vs_drt": float(linear_cka(f, d)),
            # the drt-e2e heads over the biencoder arm's and over their own encoder's vectors
            "slots_bi_vs_drt": drt_slot_drift(head, b, d, side=one),
            # the same heads over the frozen and over their own encoder's vectors
            "slots_frozen_vs_drt": drt_slot_drift(head, f, d, side=one),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="the frozen store root")
    ap.add_argument("--bi", type=Path, required=True, help="the biencoder run folder")
    ap.add_argument("--drt", type=Path, required=True, help="the drt-e2e run folder")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="test")
    ap.add_argument("--permutations", type=int, default=None)
    args = ap.parse_args(argv)

    from treerank.atomic import atomic_write_json
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.models.registry import load_model
    from treerank.pipeline.finetune import RESULTS_JSON, TunedStoreSystem, paired_summary
    from treerank.store.embedding_store import EmbeddingStore
    from treerank.training.finetune import DRT_HEAD_DIR

    runs = {"bi": args.bi, "drt": args.drt}
    for arm, run in runs.items():
        for need in (run / RESULTS_JSON, run / "stores" / args.eval_split / "meta.json"):
            if not need.is_file():
                print(f"error: --{arm} {run}: {need} missing (a finished finetune run?)")
                return 2
    bi_res = json.loads((args.bi / RESULTS_JSON).read_text(encoding="utf-8"))
    drt_res = json.loads((args.drt / RESULTS_JSON).read_text(encoding="utf-8"))
    if bi_res["family"] != "biencoder" or drt_res["family"] != "drt-e2e":
        print(f"error: --bi is a {bi_res['family']} run, --drt a {drt_res['family']} run")
        return 2
    frozen = EmbeddingStore.open(args.store / args.eval_split)
    train = EmbeddingStore.open(args.store / args.train_split)
    bi = EmbeddingStore.open(args.bi / "stores" / args.eval_split)
    drt = EmbeddingStore.open(args.drt / "stores" / args.eval_split)
    head_dir = args.drt / DRT_HEAD_DIR
    settings = EvaluationSettings()
    if args.permutations is not None:
        settings = settings.with_(n_permutations=args.permutations)
    comp = compare_systems(
        frozen,
        {
            "cosine": "cosine",
            "biencoder": TunedStoreSystem(bi, "biencoder"),
            "drt-e2e": TunedStoreSystem(drt, "drt-e2e", f"ckpt:{head_dir}"),
            "drt-e2e-cosine": TunedStoreSystem(drt, "drt-e2e-cosine"),
        },
        baseline="biencoder",
        settings=settings,
        train_store=train,
    )
    head = load_model(head_dir, expected_fingerprint=drt.encoder_fingerprint)
    same_budget = {k: (bi_res["config"][k], drt_res["config"][k]) for k in ("seed", "data")}
    scale2 = {
        "baseline": "biencoder",
        "bi_run": str(args.bi),
        "drt_run": str(args.drt),
        "same_seed_and_data": all(a == b for a, b in same_budget.values()),
        "encoder_lr": [bi_res["config"]["trainer"]["lr"], drt_res["config"]["trainer"]["lr"]],
        "steps": [bi_res["training"]["steps"], drt_res["training"]["steps"]],
        "systems": {s: {m: float(v) for m, v in r.mean.items()} for s, r in comp.results.items()},
        "paired_vs_biencoder": {
            s: paired_summary(tests) for s, tests in comp.tests.get("biencoder", {}).items()
        },
        "seen_unseen": comp.overlap,
        "cka": _cka_table(head, frozen, bi, drt),
        "cost_train_cpu_seconds": [
            bi_res["cost"]["train"]["cpu_seconds"],
            drt_res["cost"]["train"]["cpu_seconds"],
        ],
    }
    atomic_write_json(args.out, {**drt_res, "scale2": scale2})
    print(json.dumps({k: scale2[k] for k in ("systems", "paired_vs_biencoder")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
