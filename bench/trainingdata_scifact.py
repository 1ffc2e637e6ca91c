"""Issue 11 on SciFact: heads trained **without SciFact labels** vs cosine on unseen positives.

Training sources (no SciFact qrels are read for training or model selection):

* ``pseudo``: pseudo-queries cut from the SciFact corpus (title -> passage, inverse-cloze
  sentence -> passage; ``treerank.training.pseudo``, positive ``source``), store
  ``<pseudo>``;
* ``bm25-train-q``: BM25's soft top-k (listwise KL, temperature T) for the 809 SciFact *training
  query texts* (their labels unused) over the corpus;
* ``bm25-pseudo``: BM25's soft top-k for the pseudo-queries;
* ``fused-*``: the label-free fused teacher ``--teacher`` (default z-score fusion of BM25 and
  cosine at equal weight, no tuned weight: tuning it would read SciFact labels) ranks the
  corpus for the training query texts (``fused-train-q``), the ``--ict`` pseudo-queries
  (``fused-ict``) or both (``fused-train-q+ict``); its soft top-k is distilled by listwise KL
  over all passages. Early stopping on **teacher agreement**: nDCG@10 of the student's ranking
  against the teacher's top-10 (binary) for held-out training query texts, label-free.

Each ``pseudo``/``bm25`` run trains a linear head (identity init), in-batch or ``negatives:
all``, early stopping on held-out pseudo-queries (grouped by source passage, so label-free);
``fused-*`` runs stop on teacher agreement. Each then ranks the 5,183 passages for the 300 test
queries. Reported: nDCG@10 on all 300 and on the 104 queries whose
positives no training query cites ("unseen", the report's split), paired randomization test and
bootstrap CI vs cosine (10,000 permutations, seed 0).

Run: ``nice -n 15 python bench/trainingdata_scifact.py --scifact <root with train/ test/>
--pseudo <pseudo store> [--ict <ict pseudo store>] --out <dir> [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treerank.evaluation.overlap import seen_positive_mask
from treerank.evaluation.significance import compare_paired
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.models.linear import LinearHead
from treerank.search.bm25 import BM25Index
from treerank.search.specs import build_system
from treerank.search.systems import DenseSystem
from treerank.store import EmbeddingStore
from treerank.tasks.train import make_validator
from treerank.training.holdout import ValidationConfig, holdout_split, passage_groups
from treerank.training.sources import label_pairs, teacher_pairs, train_on_pairs
from treerank.training.trainer import TrainerConfig

METRICS = ["ndcg@10", "mrr@10", "recall@100"]


def per_query(ids: np.ndarray, store: Any) -> dict[str, np.ndarray]:
    qrels = Qrels(np.asarray(store.candidates), np.asarray(store.labels), store.relevance_threshold)
    return {m: np.asarray(v) for m, v in evaluate_run(ids, qrels, METRICS).per_query.items()}


def summarize(
    pq: dict[str, np.ndarray], base: dict[str, np.ndarray], unseen: np.ndarray, bm25: Any = None
) -> dict:
    """nDCG@10 on all queries and the unseen part, paired tests vs cosine (and vs BM25)."""
    out: dict[str, Any] = {}
    for part, mask in (("all", np.ones_like(unseen)), ("unseen", unseen)):
        a = {m: v[mask] for m, v in pq.items()}
        b = {m: v[mask] for m, v in base.items()}
        t = compare_paired(a, b, ["ndcg@10"], 10_000, 10_000, 0)["ndcg@10"]
        out[part] = {
            "n": int(mask.sum()),
            "ndcg@10": float(np.nanmean(a["ndcg@10"])),
            "cosine": float(np.nanmean(b["ndcg@10"])),
            "delta": t.delta,
            "p": t.p_randomization,
            "ci": [t.ci_low, t.ci_high],
            "wins_losses": [t.wins, t.losses],
        }
        if bm25 is not None:
            c = {m: v[mask] for m, v in bm25.items()}
            u = compare_paired(a, c, ["ndcg@10"], 10_000, 10_000, 0)["ndcg@10"]
            out[part]["vs_bm25"] = {"delta": u.delta, "p": u.p_randomization}
    return out


def agreement_validator(queries: np.ndarray, passages: Any, teacher_top: np.ndarray) -> Any:
    """Label-free held-out score: nDCG@10 of the model's ranking for ``queries`` against the
    teacher's top-``L`` (``teacher_top int64 (n, L)``, ``-1`` padding) taken as binary qrels."""
    from treerank.kernels.topk import exact_search

    qrels = Qrels(teacher_top.astype(np.int32), (teacher_top >= 0).astype(np.uint8), 1)

    def validate(model: Any) -> dict[str, float]:
        ids, _ = exact_search(
            model.encode_queries(queries), passages, k=10, passage_transform=model.encode_passages
        )
        return {
            "ndcg@10": float(np.mean(evaluate_run(ids, qrels, ["ndcg@10"]).per_query["ndcg@10"]))
        }

    return validate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scifact", type=Path, required=True)
    ap.add_argument("--pseudo", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--max-steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ict", type=Path, default=None, help="pseudo store of ICT queries (fused-*)")
    ap.add_argument("--teacher", default="linear-fusion:bm25+cosine:w=0.5,norm=zscore")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    train = EmbeddingStore.open(args.scifact / "train")
    test = EmbeddingStore.open(args.scifact / "test")
    pseudo = EmbeddingStore.open(args.pseudo)
    assert pseudo.n_passages == train.n_passages  # positive "source": the corpus only
    unseen = ~seen_positive_mask(test, train)
    cos_ids = build_system("cosine").retrieve(test, 100).ids
    base = per_query(cos_ids, test)
    bm25_ids = build_system("bm25").retrieve(test, 100).ids
    bm25_pq = per_query(bm25_ids, test)
    results: dict[str, Any] = {"bm25": summarize(bm25_pq, base, unseen)}
    teacher_test = per_query(build_system(args.teacher).retrieve(test, 100).ids, test)
    results[f"teacher {args.teacher}"] = summarize(teacher_test, base, unseen, bm25_pq)

    # label-free validation: held-out pseudo-queries, whole source passages held out
    cand, lab = np.asarray(pseudo.candidates), np.asarray(pseudo.labels)
    thr = int(pseudo.relevance_threshold)
    has = ((cand >= 0) & (lab >= thr)).any(axis=1)
    tr_rows, held = holdout_split(has, 0.1, 0, 1000, passage_groups(cand, lab, thr))
    vcfg = ValidationConfig(fraction=0.1, max_queries=1000, k=100, metrics=["ndcg@10"])
    _validate = make_validator(pseudo, held, vcfg)
    clock = [time.time()]

    def validate(model: Any) -> dict[str, float]:
        out = _validate(model)
        print(
            f"  held-out pseudo nDCG@10 {out['ndcg@10']:.4f} ({time.time() - clock[0]:.0f}s)",
            flush=True,
        )
        return out

    t0 = time.time()
    bm25 = BM25Index(pseudo.passage_texts())
    p_ids, p_sc = bm25.search([pseudo.query_texts()[i] for i in tr_rows], k=50)
    p_ids[p_sc <= 0] = -1  # no shared term: not a teacher pick
    p_ok = (p_ids >= 0).any(axis=1)
    q_ids, q_sc = bm25.search(train.query_texts(), k=50)
    q_ids[q_sc <= 0] = -1
    q_ok = (q_ids >= 0).any(axis=1)
    print(f"BM25 teacher runs: {time.time() - t0:.0f}s", flush=True)
    pseudo_texts = pseudo.query_texts()

    def pseudo_labels() -> Any:
        return label_pairs(cand, lab, pseudo_texts, relevance_threshold=thr, query_rows=tr_rows)

    def bm25_on_pseudo(temperature: float) -> Any:
        return teacher_pairs(
            p_ids[p_ok],
            p_sc[p_ok],
            pseudo_texts,
            query_rows=tr_rows[p_ok],
            mode="soft",
            k=50,
            temperature=temperature,
        )

    def sources(name: str, temperature: float) -> tuple[Any, Any, list]:
        if name == "pseudo":
            return pseudo.queries, pseudo.passages, [pseudo_labels()]
        if name == "bm25-pseudo":
            return pseudo.queries, pseudo.passages, [bm25_on_pseudo(temperature)]
        if name == "pseudo+bm25-pseudo":
            return (
                pseudo.queries,
                pseudo.passages,
                [pseudo_labels(), bm25_on_pseudo(temperature)],
            )
        # BM25 teacher on the training query texts (labels unused), over the same corpus
        return (
            train.queries,
            train.passages,
            [
                teacher_pairs(
                    q_ids[q_ok],
                    q_sc[q_ok],
                    train.query_texts(),
                    query_rows=np.flatnonzero(q_ok),
                    mode="soft",
                    k=50,
                    temperature=temperature,
                )
            ],
        )

    # fused teacher over training query texts (+ ICT pseudo-queries): one query table
    ict = EmbeddingStore.open(args.ict) if args.ict is not None else None
    if ict is not None and ict.n_passages != train.n_passages:
        raise SystemExit(f"{args.ict}: not a pseudo split of the SciFact corpus")
    n_tr = train.n_queries
    fused_q = np.concatenate(
        [np.asarray(train.queries)] + ([np.asarray(ict.queries)] if ict is not None else [])
    ).astype(np.float32)
    fused_texts = train.query_texts() + (ict.query_texts() if ict is not None else [])
    t0 = time.time()
    teacher_sys = build_system(args.teacher)
    tr_run = teacher_sys.retrieve(train, 50)
    f_ids, f_sc = tr_run.ids, tr_run.scores
    if ict is not None:
        ri = build_system(args.teacher).retrieve(ict, 50)
        f_ids, f_sc = np.concatenate([f_ids, ri.ids]), np.concatenate([f_sc, ri.scores])
    f_ids = np.where(np.isfinite(f_sc), f_ids, -1).astype(np.int64)
    print(f"fused teacher runs: {time.time() - t0:.0f}s", flush=True)
    # label-free held-out set: 150 training query *texts*, scored against the teacher's top-10
    f_held = np.sort(np.random.default_rng(0).choice(n_tr, 150, replace=False))
    f_agree = agreement_validator(fused_q[f_held], train.passages, f_ids[f_held, :10])

    def f_validate(model: Any) -> dict[str, float]:
        out = f_agree(model)
        print(
            f"  teacher agreement {out['ndcg@10']:.4f} ({time.time() - clock[0]:.0f}s)", flush=True
        )
        return out

    def fused(which: str, temperature: float) -> tuple[Any, Any, list]:
        rows = np.setdiff1d(np.arange(n_tr), f_held)
        if which == "ict":
            rows = np.arange(n_tr, len(fused_q))
        elif which == "train-q+ict":
            rows = np.concatenate([rows, np.arange(n_tr, len(fused_q))])
        return (
            fused_q,
            train.passages,
            [
                teacher_pairs(
                    f_ids[rows],
                    f_sc[rows],
                    fused_texts,
                    query_rows=rows,
                    mode="soft",
                    k=50,
                    temperature=temperature,
                    name=f"teacher:{args.teacher}",
                )
            ],
        )

    # (name, source, negatives, teacher T, lr, trained towers)
    runs = [
        ("pseudo/all", "pseudo", "all", 1.0, 1e-3, "both"),
        ("bm25-train-q/all/T=2", "bm25-train-q", "all", 2.0, 1e-3, "both"),
        ("pseudo/batch", "pseudo", "batch", 1.0, 1e-3, "both"),
        ("pseudo+bm25-pseudo/all/T=2", "pseudo+bm25-pseudo", "all", 2.0, 1e-3, "both"),
        ("bm25-pseudo/all/T=2", "bm25-pseudo", "all", 2.0, 1e-3, "both"),
        ("fused-train-q/all/T=0.5/query", "fused-train-q", "all", 0.5, 1e-4, "query"),
        ("fused-train-q+ict/all/T=0.5/query", "fused-train-q+ict", "all", 0.5, 1e-4, "query"),
        ("fused-train-q/all/T=0.5/both", "fused-train-q", "all", 0.5, 1e-4, "both"),
        ("fused-train-q/all/T=0.5/query/lr=3e-4", "fused-train-q", "all", 0.5, 3e-4, "query"),
        ("fused-train-q/all/T=1/query", "fused-train-q", "all", 1.0, 1e-4, "query"),
        ("fused-train-q/batch/T=0.5/query", "fused-train-q", "batch", 0.5, 1e-4, "query"),
    ]
    for name, src, neg, temp, lr, towers in runs:
        if args.only and name not in args.only:
            continue
        if src.startswith("fused-") and "ict" in src and ict is None:
            raise SystemExit(f"{name}: needs --ict")
        t0 = time.time()
        clock[0] = t0
        print(f"[{name}]", flush=True)
        qv, pv, srcs = fused(src[6:], temp) if src.startswith("fused-") else sources(src, temp)
        torch.manual_seed(0)
        head = LinearHead(train.dim)
        if towers == "query":  # a query-side adapter: passages keep their stored vectors
            head.passage_tower.requires_grad_(False)
        cfg = TrainerConfig(
            max_steps=args.max_steps,
            epochs=100,
            lr=lr,
            eval_every=50 if src.startswith("fused-") else 100,
            patience=4,
            negatives=neg,
            chunk_size=8192,
            log_every=50,
        )
        fit = train_on_pairs(
            head,
            qv,
            pv,
            srcs,
            cfg,
            batch_size=128,
            validate=f_validate if src.startswith("fused-") else validate,
            progress=False,
        )
        losses = [r["loss"] for r in fit.records if r["kind"] == "train"]
        ids = DenseSystem(head).retrieve(test, 100).ids
        res = summarize(per_query(ids, test), base, unseen, bm25_pq)
        res.update(
            steps=fit.steps,
            best_step=fit.best_step,
            best_heldout=fit.best_metrics,
            seconds=round(time.time() - t0, 1),
            first_loss=losses[0] if losses else None,
            last_loss=losses[-1] if losses else None,
        )
        results[name] = res
        print(name, json.dumps(res), flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
