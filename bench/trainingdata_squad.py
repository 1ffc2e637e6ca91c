"""Issue 11 on SQuAD: heads trained on SQuAD train, evaluated on SQuAD dev (unseen articles).

SQuAD dev shares no article with train, so every dev positive is a passage no training query
cites. Training queries: ``--n-train`` questions drawn (seed 0) from SQuAD train, after taking
out (a) the queries tuned fusion tunes its weight on (``tuning_rows``: ``queries=heldout``) and
(b) ``--n-val`` held-out queries for early stopping, held out by whole passage groups
(``validation.group_by_passage``), so the held-out metric measures unseen passages too.

Sources (``treerank.training.sources``), each run a linear head (identity init, two towers;
``/query``: only the query tower trains, a query-side adapter):

* ``labels``: the labelled paragraph of each question (InfoNCE);
* ``teacher:<spec>``: the teacher system's soft top-``k`` (listwise KL at temperature ``T``)
  for the same questions; ``labels+teacher``: both, the mixture weighted by size;

with in-batch negatives (``batch``) or the exact softmax over all 20,958 paragraphs (``all``).
Each head is then evaluated on all 10,570 dev questions: nDCG@10 alone (paired randomization
test and bootstrap CI vs cosine and vs BM25, 10,000 permutations, seed 0), and fused with BM25
by ``tuned-fusion`` (z-score linear fusion, weight tuned on the tuning queries of SQuAD train,
which no head trained on) vs BM25 alone.

Run: ``nice -n 10 python bench/trainingdata_squad.py --squad /work/stores/squad --out <dir>
[--n-train 20000] [--only NAME ...]``; results go to ``<dir>/results.json`` (written after each
run, so a partial run keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treerank.evaluation.significance import compare_paired
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.models.linear import LinearHead
from treerank.search.fusion_tuning import TunedFusionSystem, tuning_rows
from treerank.search.specs import build_system
from treerank.search.systems import DenseSystem
from treerank.store import EmbeddingStore
from treerank.store.view import QuerySubset
from treerank.tasks.train import make_validator
from treerank.training.holdout import ValidationConfig, holdout_split, passage_groups
from treerank.training.sources import label_pairs, teacher_pairs, train_on_pairs
from treerank.training.trainer import TrainerConfig

METRIC = "ndcg@10"


def per_query(ids: np.ndarray, store: Any) -> np.ndarray:
    """``float (nq,)`` nDCG@10 of a run (passage ids ``(nq, k)``) against the store's qrels."""
    return np.asarray(evaluate_run(ids, Qrels.from_store(store), [METRIC]).per_query[METRIC])


def versus(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Paired comparison of two per-query nDCG@10 arrays (a - b)."""
    t = compare_paired({METRIC: a}, {METRIC: b}, [METRIC], 10_000, 10_000, 0)[METRIC]
    return {
        "delta": round(t.delta, 4),
        "p": t.p_randomization,
        "ci": [round(t.ci_low, 4), round(t.ci_high, 4)],
        "wins_losses": [t.wins, t.losses],
    }


def cached_run(path: Path, make: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, scores)`` of a run, computed once and kept in ``path`` (``.npz``)."""
    if path.is_file():
        z = np.load(path)
        return z["ids"], z["scores"]
    run = make()
    np.savez(path, ids=run.ids, scores=run.scores)
    return run.ids, run.scores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--squad", type=Path, required=True, help="store root with train/ and dev/")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-train", type=int, default=20_000)
    ap.add_argument("--n-val", type=int, default=1000)
    ap.add_argument(
        "--n-dev", type=int, default=0, help="evaluate on this many dev queries (0: all)"
    )
    ap.add_argument("--teacher", default="linear-fusion:bm25+cosine:w=0.5,norm=zscore")
    ap.add_argument("--max-steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    train = EmbeddingStore.open(args.squad / "train")
    dev_full = EmbeddingStore.open(args.squad / "dev")
    if train.n_passages != dev_full.n_passages:
        raise SystemExit(f"{args.squad}: train and dev hold different corpora")
    dev: Any = dev_full
    if args.n_dev:
        rows = np.sort(np.random.default_rng(0).choice(dev_full.n_queries, args.n_dev, False))
        dev = QuerySubset(dev_full, rows)
    tag = f"dev{args.n_dev or 'all'}"

    # training / early-stopping / fusion-tuning queries: disjoint
    tune, has_rel = tuning_rows(train, "heldout", 2000, 0)
    cand, lab = np.asarray(train.candidates), np.asarray(train.labels)
    thr = int(train.relevance_threshold)
    pool = has_rel.copy()
    pool[tune] = False
    vcfg = ValidationConfig(fraction=0.05, max_queries=args.n_val, k=100, metrics=[METRIC])
    _, held = holdout_split(pool, 0.05, 0, args.n_val, passage_groups(cand, lab, thr))
    pool[held] = False
    rows = np.sort(np.random.default_rng(0).choice(np.flatnonzero(pool), args.n_train, False))
    print(f"train {rows.size}, held-out {held.size}, tuning {tune.size}", flush=True)
    validate_fn = make_validator(train, held, vcfg)
    clock = [time.time()]

    def validate(model: Any) -> dict[str, float]:
        out = validate_fn(model)
        print(f"  held-out nDCG@10 {out[METRIC]:.4f} ({time.time() - clock[0]:.0f}s)", flush=True)
        return out

    t0 = time.time()
    base = {
        s: per_query(
            cached_run(args.out / f"{s}-{tag}.npz", lambda s=s: build_system(s).retrieve(dev, 100))[
                0
            ],
            dev,
        )
        for s in ("cosine", "bm25")
    }
    print(f"dev baselines {time.time() - t0:.0f}s", flush=True)
    results: dict[str, Any] = {
        "setup": {
            "n_train": int(rows.size),
            "n_heldout": int(held.size),
            "n_tuning": int(tune.size),
            "n_dev": int(dev.n_queries),
            "teacher": args.teacher,
            "max_steps": args.max_steps,
            "batch_size": args.batch_size,
        },
        **{s: {METRIC: float(v.mean())} for s, v in base.items()},
    }
    texts = train.query_texts()

    def teacher(spec: str) -> tuple[np.ndarray, np.ndarray]:
        t = time.time()
        safe = spec.replace(":", "_").replace("+", "_").replace(",", "_").replace("=", "")
        ids, sc = cached_run(
            args.out / f"teacher-{safe}-{rows.size}.npz",
            lambda: build_system(spec).retrieve(QuerySubset(train, rows), 50),
        )
        print(f"teacher {spec}: {time.time() - t:.0f}s", flush=True)
        return ids.astype(np.int64), sc.astype(np.float32)

    labelled = np.where(lab[rows] >= thr, cand[rows], -1).astype(np.int64)

    def soft(spec: str, temperature: float) -> Any:
        ids, sc = teacher(spec)
        ids = np.where(np.isfinite(sc), ids, -1)
        return teacher_pairs(
            ids,
            sc,
            texts,
            query_rows=rows,
            mode="soft",
            k=50,
            temperature=temperature,
            labelled=labelled,
            name=f"teacher:{spec}",
        )

    def sources(name: str, temperature: float) -> list:
        lp = label_pairs(cand, lab, texts, relevance_threshold=thr, query_rows=rows)
        if name == "labels":
            return [lp]
        if name == "teacher":
            return [soft(args.teacher, temperature)]
        if name == "labels+teacher":
            return [lp, soft(args.teacher, temperature)]
        if name == "bm25":
            return [soft("bm25", temperature)]
        raise ValueError(name)

    # (name, source, negatives, teacher T, lr, trained towers)
    runs = [
        ("labels/batch", "labels", "batch", 1.0, 1e-4, "both"),
        ("labels/all", "labels", "all", 1.0, 1e-4, "both"),
        ("teacher/batch/T=0.5/query", "teacher", "batch", 0.5, 1e-4, "query"),
        ("teacher/all/T=0.5/query", "teacher", "all", 0.5, 1e-4, "query"),
        ("teacher/all/T=0.5/both", "teacher", "all", 0.5, 1e-4, "both"),
        ("labels+teacher/all/T=0.5/query", "labels+teacher", "all", 0.5, 1e-4, "query"),
        ("bm25/batch/T=2/query", "bm25", "batch", 2.0, 1e-4, "query"),
    ]
    bm25_sys = build_system("bm25")
    for name, src, neg, temp, lr, towers in runs:
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        clock[0] = t0
        print(f"[{name}]", flush=True)
        torch.manual_seed(0)
        head = LinearHead(train.dim, trainable=towers)
        cfg = TrainerConfig(
            max_steps=args.max_steps,
            epochs=100,
            lr=lr,
            eval_every=100,
            patience=3,
            negatives=neg,
            chunk_size=8192,
            log_every=50,
        )
        fit = train_on_pairs(
            head,
            train.queries,
            train.passages,
            sources(src, temp),
            cfg,
            batch_size=args.batch_size,
            validate=validate,
            progress=False,
        )
        t_train = time.time() - t0
        head_sys = DenseSystem(head, name=name)
        pq = per_query(head_sys.retrieve(dev, 100).ids, dev)
        fused_sys = TunedFusionSystem(head_sys, bm25_sys, name=f"tuned-fusion:{name}+bm25")
        fq = per_query(fused_sys.retrieve(dev, 100).ids, dev)
        res = {
            METRIC: float(pq.mean()),
            "vs_cosine": versus(pq, base["cosine"]),
            "vs_bm25": versus(pq, base["bm25"]),
            "fused_bm25": {
                METRIC: float(fq.mean()),
                "weight": fused_sys.tuning.get("weight") if fused_sys.tuning else None,
                "vs_bm25": versus(fq, base["bm25"]),
            },
            "steps": fit.steps,
            "best_step": fit.best_step,
            "best_heldout": fit.best_metrics,
            "train_seconds": round(t_train, 1),
            "seconds": round(time.time() - t0, 1),
        }
        results[name] = res
        print(name, json.dumps(res), flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
