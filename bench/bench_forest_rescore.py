"""Forest then rescore: the forest's top-N candidates by match count, rescored by exact cosine.

For each depth ``N`` the forest's counting search (:mod:`treerank.search.forest_index`) returns
``N`` candidates per query; their stored vectors are read and scored by the exact inner product
of L2-normalised vectors (cosine, the one normalisation rule of
:func:`treerank.kernels.vectors.l2_normalize`), and the top ``k`` are kept. Printed per ``N``,
with exact cosine search over every passage as the reference measured in the same run:

* fraction of passages scored (``N / n_passages``);
* Recall@100 relative to exact cosine's top 100 (the share of cosine's top 100 the two-stage
  system also returns in its top 100);
* nDCG@10 against the store's judgments, and queries/s (forest search + rescoring; the passage
  classes and query classes are computed once, outside the timing).

The second stage is the generic rescoring of the index work
(:func:`treerank.search.rescore.rescore`: candidate rows gathered in ascending id order, one query
batch at a time).

Run: ``nice python bench/bench_forest_rescore.py --store STORE_DIR --checkpoint FOREST_DIR
[--depths 100 300 1000]`` (a random forest of ``--models x --classes`` without
``--checkpoint``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numba
import numpy as np
import torch

from treerank.evaluation.metrics import evaluate_run
from treerank.evaluation.qrels import Qrels
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.models.forest import Forest, ForestConfig
from treerank.search.forest_index import ForestIndex
from treerank.search.rescore import rescore


def rescore_cosine(
    queries: np.ndarray, passages: np.ndarray, candidates: np.ndarray, k: int
) -> np.ndarray:
    """``int64 (nq, k)`` candidates re-ranked by cosine (ties by id), ``-1`` padding last: the
    generic second stage :func:`treerank.search.rescore.rescore` with both sides L2-normalised."""
    q = l2_normalize(np.asarray(queries, dtype=np.float32))
    ids, _ = rescore(q, passages, candidates, k, passage_transform=l2_normalize)
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", required=True, help="an embedding store split directory")
    ap.add_argument("--checkpoint", default=None, help="a trained forest checkpoint dir")
    ap.add_argument("--prefix", type=int, default=0, help="use the checkpoint's first M pairs")
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--classes", type=int, default=32)
    ap.add_argument("--depths", type=int, nargs="+", default=[100, 200, 500, 1000])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    from treerank.store import EmbeddingStore

    st = EmbeddingStore.open(args.store)
    q = np.asarray(st.queries, dtype=np.float32)
    p = np.asarray(st.passages, dtype=np.float32)
    if args.checkpoint:
        from treerank.models.registry import load_model

        forest = load_model(args.checkpoint, expected_fingerprint=st.encoder_fingerprint)
        if args.prefix:
            forest = forest.subset(args.prefix)
    else:
        forest = Forest.random(ForestConfig(args.models, args.classes, q.shape[1]), seed=0)
    index = ForestIndex.build(*forest.passage_classes(p), n_classes=forest.n_classes)
    qc, qp = forest.query_classes(q)
    qrels = Qrels.from_store(st)
    metrics = ["ndcg@10", "recall@100"]
    t0 = time.perf_counter()
    cos_ids, _ = exact_search(l2_normalize(q), p, k=100, passage_transform=l2_normalize)
    t_cos = time.perf_counter() - t0
    cos = evaluate_run(cos_ids, qrels, metrics).mean
    n = len(p)
    rows = [
        {
            "system": "exact cosine",
            "depth": n,
            "fraction_scored": 1.0,
            "recall100_vs_cosine": 1.0,
            **cos,
            "qps": len(q) / t_cos,
        }
    ]
    forest_only = evaluate_run(index.search(qc, qp, 100).ids, qrels, metrics).mean
    rows.append({"system": "forest alone", "depth": 100, "fraction_scored": 0.0, **forest_only})
    cos_sets = [set(r[r >= 0].tolist()) for r in cos_ids]
    for depth in args.depths:
        t0 = time.perf_counter()
        cand = index.search(qc, qp, depth).ids
        ids = rescore_cosine(q, p, cand, 100)
        sec = time.perf_counter() - t0
        overlap = np.mean(
            [len(cos_sets[i] & set(r[r >= 0].tolist())) / 100 for i, r in enumerate(ids)]
        )
        res = evaluate_run(ids, qrels, metrics).mean
        rows.append(
            {
                "system": f"forest top-{depth} + cosine",
                "depth": depth,
                "fraction_scored": float((cand >= 0).sum(1).mean() / n),
                "recall100_vs_cosine": float(overlap),
                **res,
                "qps": len(q) / sec,
            }
        )
    print(
        f"store {args.store}: {len(q)} queries, {n} passages; forest M={forest.n_models} "
        f"C={forest.n_classes}"
    )
    print(f"{'system':<30}{'scored':>9}{'R@100 vs cos':>14}{'nDCG@10':>9}{'R@100':>8}{'q/s':>9}")
    for r in rows:
        print(
            f"{r['system']:<30}{r['fraction_scored']:>9.3f}"
            f"{r.get('recall100_vs_cosine', float('nan')):>14.3f}{r['ndcg@10']:>9.3f}"
            f"{r['recall@100']:>8.3f}{r.get('qps', float('nan')):>9.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
