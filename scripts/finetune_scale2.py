"""The DRT seed's Scale-2 comparison from two `treerank finetune` runs of equal budget.

Usage (docs/finetune.md, "Scale 2"):

    python scripts/finetune_scale2.py --store stores/scifact \
        --bi runs/ft-scifact-bi-s2 --drt runs/ft-scifact-drt-e2e \
        --out docs/results/finetune_scifact_drt_e2e.json

Reads both runs' re-embedded evaluation stores (RUN/stores/<split>) and the drt-e2e heads
(RUN/drt_head), and writes the drt-e2e run's results.json with a "scale2" block added.
With --max-passages N (a machine too busy to re-embed the whole corpus twice) it needs only
each run's trained model (RUN/model, RUN/finetune.json): the evaluation corpus is cut to every
passage judged for an evaluation query plus the first others in id order up to N
(treerank.readers.subset.subset_split), the frozen vectors of that corpus are copied from the
frozen store, and each tuned encoder re-embeds only it (stores under --work); the numbers are
then on that corpus, not the full one, for all systems alike. The block holds:

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


def _run_record(run: Path, cut: bool) -> dict[str, Any]:
    """The run's results.json, or (--max-passages, no evaluation of its own) the fields of it
    this script reads, from finetune.json."""
    from treerank.pipeline.finetune import RESULTS_JSON
    from treerank.training.finetune import FINETUNE_JSON

    if not cut:
        return dict(json.loads((run / RESULTS_JSON).read_text(encoding="utf-8")))
    info = json.loads((run / FINETUNE_JSON).read_text(encoding="utf-8"))
    summary = {k: v for k, v in info["summary"].items() if k != "log"}
    return {
        "family": info["config"]["family"],
        "config": info["config"],
        "fingerprint": info["fingerprint"],
        "base_fingerprint": info["base_fingerprint"],
        "checkpoint": info["checkpoint"],
        "training": summary,
        "cost": {"train": summary["cost"]},
        "loss_log": info["summary"].get("log", []),
    }


def _tuned_cut(run: Path, frozen_cut: Any, out: Path) -> Any:
    """``run``'s tuned encoder over the cut corpus (kept when ``out`` already holds exactly
    that: the same tuned weights over the same data)."""
    from treerank.pipeline.finetune import reembed_split
    from treerank.store.embedding_store import EmbeddingStore
    from treerank.training.finetune import FINETUNE_JSON

    want = json.loads((run / FINETUNE_JSON).read_text(encoding="utf-8"))["fingerprint"]
    if (out / "meta.json").is_file():
        have = EmbeddingStore.open(out)
        if have.encoder_fingerprint == want and have.meta.get("data_sha256") == frozen_cut.meta.get(
            "data_sha256"
        ):
            return have
    return reembed_split(run, frozen_cut, out, overwrite=True)


def _cut_store(frozen: Any, max_passages: int, out: Path) -> Any:
    """The frozen store's split cut to ``max_passages`` passages (subset_split), its vectors
    copied from ``frozen`` row for row (nothing encoded; kept when ``out`` already holds the
    same cut)."""
    from treerank.encoders import SentenceEncoder
    from treerank.encoders.sentence import BatchResult
    from treerank.pipeline.finetune import split_of_store
    from treerank.readers.subset import subset_split
    from treerank.store.embed import embed_split, split_digest
    from treerank.store.embedding_store import EmbeddingStore

    split = subset_split(split_of_store(frozen), None, max_passages)
    if (out / "meta.json").is_file():
        have = EmbeddingStore.open(out)
        if have.meta.get("data_sha256") == split_digest(split) and (
            have.encoder_fingerprint == frozen.encoder_fingerprint
        ):
            return have
    p_row = {pid: i for i, pid in enumerate(frozen.passage_ids())}
    q_row = {qid: i for i, qid in enumerate(frozen.query_ids())}
    passages, queries = np.asarray(frozen.passages), np.asarray(frozen.queries)
    p_rows = np.array([p_row[p] for p in split.passage_ids])
    q_rows = np.array([q_row[q] for q in split.query_ids])

    def copy(kind: str, b_i: int, idx: np.ndarray) -> BatchResult:
        src, rows = (queries, q_rows) if kind == "query" else (passages, p_rows)
        return BatchResult(np.array(src[rows[idx]], dtype=np.float32), 0, 0)

    meta = frozen.meta.get("encoder", {}) or {}
    enc = SentenceEncoder(
        max_seq_length=meta.get("max_seq_length"), progress=False
    )  # the frozen encoder, for the store's metadata only
    if enc.fingerprint != frozen.encoder_fingerprint:
        raise ValueError(f"{frozen.path} was not embedded with the default encoder")
    embed_split(split, enc, out, overwrite=True, reuse=False, progress=False, batch_source=copy)
    return EmbeddingStore.open(out)


def render(drt_doc: dict[str, Any], bi_doc: dict[str, Any]) -> str:
    """The page's Markdown of one comparison: the drt-e2e run's results.json with its
    ``scale2`` block and the biencoder arm's results.json (nDCG@10 tables, CKA, drift, cost)."""
    s = drt_doc["scale2"]
    bi, drt, dcos = "finetune-biencoder", "finetune-drt-e2e", "finetune-drt-e2e-cosine"
    m = "ndcg@10"
    parts = s["seen_unseen_vs_biencoder"]

    def ci(t: dict[str, Any]) -> str:
        return f"{t['delta']:+.4f} ({t['ci_low']:+.4f} .. {t['ci_high']:+.4f})"

    lines = [
        "| nDCG@10 | queries | frozen cosine | biencoder | drt-e2e (heads) "
        "| drt-e2e encoder, cosine | drt-e2e - biencoder (95% CI) | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sy, t = s["systems"], s["paired_vs_biencoder"][drt][m]
    n_all = parts["n_seen"] + parts["n_unseen"]
    lines.append(
        f"| all | {n_all} | {sy['cosine'][m]:.4f} | {sy[bi][m]:.4f} | {sy[drt][m]:.4f} "
        f"| {sy[dcos][m]:.4f} | {ci(t)} | {t['p']:.4f} |"
    )
    for part in ("seen", "unseen"):
        row = parts["parts"][part]
        t = row[drt][m]
        lines.append(
            f"| {part} | {parts[f'n_{part}']} | {row['cosine'][m]['mean']:.4f} "
            f"| {row[bi][m]['mean']:.4f} | {row[drt][m]['mean']:.4f} "
            f"| {row[dcos][m]['mean']:.4f} | {ci(t)} | {t['p']:.4f} |"
        )
    lines += [
        "",
        "Each arm against frozen cosine (paired, same corpus):",
        "",
        "| arm | all: delta (95% CI), p | seen mean | unseen mean | unseen delta (95% CI), p |",
        "|---|---|---|---|---|",
    ]
    for arm, doc in (("biencoder", bi_doc), ("drt-e2e", drt_doc)):
        name = f"finetune-{arm}"
        t = doc["paired_vs_cosine"][m]
        seen, unseen = (doc["seen_unseen"]["parts"][p] for p in ("seen", "unseen"))
        u = unseen[name][m]
        lines.append(
            f"| `{arm}` | {ci(t)}, p {t['p']:.4f} | {seen[name][m]['mean']:.4f} (cosine "
            f"{seen['cosine'][m]['mean']:.4f}) | {u['mean']:.4f} (cosine "
            f"{unseen['cosine'][m]['mean']:.4f}) | {ci(u)}, p {u['p']:.4f} |"
        )
    lines += [
        "",
        f"CKA table (linear CKA on the same items, {s['corpus']}; slots: the drt-e2e heads "
        "applied to both vector sets):",
        "",
        "| comparison | passages | queries |",
        "|---|---|---|",
    ]
    cp, cq = s["cka"]["passages"], s["cka"]["queries"]
    for key, what in (
        ("raw_bi_vs_drt", "raw vectors, biencoder vs drt-e2e encoder"),
        ("raw_frozen_vs_bi", "raw vectors, frozen vs biencoder"),
        ("raw_frozen_vs_drt", "raw vectors, frozen vs drt-e2e encoder"),
    ):
        lines.append(f"| {what} | {cp[key]:.4f} | {cq[key]:.4f} |")
    for key, what in (("slots_bi_vs_drt", "biencoder"), ("slots_frozen_vs_drt", "frozen")):
        lines.append(
            f"| concatenated slots, {what} vs drt-e2e vectors | {cp[key]['concatenated']:.4f} "
            f"| {cq[key]['concatenated']:.4f} |"
        )
        lines.append(
            f"| each slot, {what} vs drt-e2e vectors | "
            + " / ".join(f"{x:.4f}" for x in cp[key]["slots"])
            + " | "
            + " / ".join(f"{x:.4f}" for x in cq[key]["slots"])
            + " |"
        )
    lines.append("")
    for arm, doc in (("biencoder", bi_doc), ("drt-e2e", drt_doc)):
        dr = doc["drift"][doc["eval_split"]]
        c = doc["cost"]["train"]
        lines.append(
            f"- `{arm}` drift vs frozen: CKA queries {dr['cka_queries']:.4f}, passages "
            f"{dr['cka_passages']:.4f}, neighbour overlap@10 {dr['overlap_at_k']:.4f}; training "
            f"{c['cpu_seconds']:.0f} CPU-s ({c['wall_seconds']:.0f} s wall), {c['tokens']:,} "
            f"tokens, peak RSS {c['peak_rss_mib'] / 1024:.1f} GB, final train loss "
            f"{doc['training']['train_loss']:.4f}."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="the frozen store root")
    ap.add_argument("--bi", type=Path, required=True, help="the biencoder run folder")
    ap.add_argument("--drt", type=Path, required=True, help="the drt-e2e run folder")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="test")
    ap.add_argument("--permutations", type=int, default=None)
    ap.add_argument("--max-passages", type=int, default=None, help="cut the corpus (see above)")
    ap.add_argument("--work", type=Path, default=None, help="stores of --max-passages")
    args = ap.parse_args(argv)
    if args.max_passages is not None and args.work is None:
        print("error: --max-passages needs --work (where the cut stores go)")
        return 2

    from treerank.atomic import atomic_write_json
    from treerank.diagnostics.drift import scale2_cka_table
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.models.registry import load_model
    from treerank.pipeline.finetune import RESULTS_JSON, TunedStoreSystem, paired_summary
    from treerank.store.embedding_store import EmbeddingStore
    from treerank.training.finetune import DRT_HEAD_DIR, FINETUNE_JSON

    runs = {"bi": args.bi, "drt": args.drt}
    cut = args.max_passages is not None
    for arm, run in runs.items():
        needs = (
            (run / FINETUNE_JSON, run / "model")
            if cut
            else (run / RESULTS_JSON, run / "stores" / args.eval_split / "meta.json")
        )
        for need in needs:
            if not need.exists():
                print(f"error: --{arm} {run}: {need} missing (a finished finetune run?)")
                return 2
    bi_res, drt_res = (_run_record(run, cut) for run in (args.bi, args.drt))
    if bi_res["family"] != "biencoder" or drt_res["family"] != "drt-e2e":
        print(f"error: --bi is a {bi_res['family']} run, --drt a {drt_res['family']} run")
        return 2
    frozen = EmbeddingStore.open(args.store / args.eval_split)
    train = EmbeddingStore.open(args.store / args.train_split)
    if cut:
        frozen = _cut_store(frozen, args.max_passages, args.work / "frozen")
        bi, drt = (_tuned_cut(run, frozen, args.work / arm) for arm, run in runs.items())
    else:
        bi = EmbeddingStore.open(args.bi / "stores" / args.eval_split)
        drt = EmbeddingStore.open(args.drt / "stores" / args.eval_split)
    head_dir = args.drt / DRT_HEAD_DIR
    settings = EvaluationSettings()
    if args.permutations is not None:
        settings = settings.with_(n_permutations=args.permutations)
    bi_name, drt_name = "finetune-biencoder", "finetune-drt-e2e"
    systems = {
        "cosine": "cosine",
        bi_name: TunedStoreSystem(bi, bi_name),
        drt_name: TunedStoreSystem(drt, drt_name, f"ckpt:{head_dir}"),
        f"{drt_name}-cosine": TunedStoreSystem(drt, f"{drt_name}-cosine"),
    }
    # against frozen cosine (each arm's own record), then against the biencoder arm (the
    # Scale-2 delta), on the same runs
    vs_cos = compare_systems(
        frozen, systems, settings=settings.with_(baseline="cosine"), train_store=train
    )
    vs_bi = compare_systems(
        frozen,
        systems,
        settings=settings.with_(baseline=bi_name),
        train_store=train,
        runs=vs_cos.runs,
    )
    head = load_model(head_dir, expected_fingerprint=drt.encoder_fingerprint)
    means = {s: {m: float(v) for m, v in r.mean.items()} for s, r in vs_cos.results.items()}
    if cut:  # the arms' evaluation on the cut corpus stands in for their own results.json
        from treerank.diagnostics.drift import drt_slot_drift, store_drift

        for res, name, tuned in ((bi_res, bi_name, bi), (drt_res, drt_name, drt)):
            drift = store_drift(frozen, tuned, k=10)
            if tuned is drt:
                drift["drt_slots"] = {
                    "passages": drt_slot_drift(head, frozen.passages, drt.passages),
                    "queries": drt_slot_drift(head, frozen.queries, drt.queries, side="query"),
                }
            res.update(
                {
                    "store": str(args.store),
                    "eval_split": args.eval_split,
                    "n_eval_queries": int(frozen.n_queries),
                    "n_passages": int(frozen.n_passages),
                    "corpus": f"cut: every judged passage + the first others up to "
                    f"{args.max_passages} (scripts/finetune_scale2.py --max-passages)",
                    "systems": {s: means[s] for s in ("cosine", name)},
                    "paired_vs_cosine": paired_summary(vs_cos.tests["cosine"][name]),
                    "seen_unseen": vs_cos.overlap,
                    "drift": {args.eval_split: drift},
                }
            )
    same_budget = {k: (bi_res["config"][k], drt_res["config"][k]) for k in ("seed", "data")}
    scale2 = {
        "baseline": bi_name,
        "corpus": (
            f"cut: every judged passage + the first others up to {args.max_passages}"
            if cut
            else "the whole corpus"
        ),
        "n_passages": int(frozen.n_passages),
        "bi_run": str(args.bi),
        "drt_run": str(args.drt),
        "same_seed_and_data": all(a == b for a, b in same_budget.values()),
        "encoder_lr": [bi_res["config"]["trainer"]["lr"], drt_res["config"]["trainer"]["lr"]],
        "steps": [bi_res["training"]["steps"], drt_res["training"]["steps"]],
        "systems": means,
        "paired_vs_biencoder": {
            s: paired_summary(tests) for s, tests in vs_bi.tests.get(bi_name, {}).items()
        },
        "seen_unseen_vs_biencoder": vs_bi.overlap,
        "cka": scale2_cka_table(head, frozen, bi, drt),
        "cost_train_cpu_seconds": [
            bi_res["cost"]["train"]["cpu_seconds"],
            drt_res["cost"]["train"]["cpu_seconds"],
        ],
    }
    atomic_write_json(args.out, {**drt_res, "scale2": scale2})
    if cut:
        atomic_write_json(args.out.with_name(args.out.stem + "_biencoder_arm.json"), bi_res)
    print(json.dumps({k: scale2[k] for k in ("systems", "paired_vs_biencoder")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
