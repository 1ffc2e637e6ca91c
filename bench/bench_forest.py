"""Forest search throughput against dense exact search, on the same queries and passages, one run.

Reference measured in the same run: exact inner-product search (``treerank.kernels.topk``, FAISS
backend, the cosine baseline) over the same query batch and passages at the same depth ``k``.
Printed per setting:

* queries/s of the forest's compiled counting search (classes given), of query classification +
  search, and of dense exact search, with their ratios;
* posting entries scanned per query (``sum_m |list_m(class_m(q))|``) against the ``n x d``
  floats a dense scan reads;
* bytes of the inverted lists against the float32 passage matrix.

Inputs (pick one):

* ``--store DIR``: an embedding store split (e.g. a SciFact test split or the DL19 pool); the
  forest is a ``--checkpoint`` or a random forest of ``--models x --classes`` whose passage and
  query classes come from classifying the real vectors.
* ``--synthetic N`` (default 1,000,000 when no store is given): ``N`` clustered unit vectors of
  ``--dim`` dims (see :func:`synthetic_vectors`). Classifying 1M passages at C = 1,024 would cost
  25 TFLOP on a CPU and says nothing about search speed, so the synthetic setting draws every
  (passage, model) and (query, model) class uniformly at random: balanced lists, which is what
  the uniformity losses train towards and what search cost depends on.

Run: ``nice python bench/bench_forest.py --store STORE_DIR [--checkpoint DIR]`` or
``nice python bench/bench_forest.py --synthetic 1000000 --models 64 --classes 1024``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import torch

from treerank.forest.index import ForestIndex
from treerank.forest.model import Forest, ForestConfig
from treerank.kernels.topk import exact_search


def best_of(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def synthetic_vectors(n: int, dim: int, seed: int, n_clusters: int = 1000) -> np.ndarray:
    """``float32 (n, dim)`` unit vectors around ``n_clusters`` random centres (noise 0.5 per
    unit-variance dimension): clustered like real embeddings, without any model."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    step = 65536
    for s in range(0, n, step):
        e = min(n, s + step)
        x = centres[rng.integers(0, n_clusters, size=e - s)]
        x += 0.5 * rng.standard_normal((e - s, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[s:e] = x
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", default=None, help="an embedding store split directory")
    ap.add_argument("--synthetic", type=int, default=1_000_000, help="passages when no --store")
    ap.add_argument("--dim", type=int, default=384, help="synthetic dimension")
    ap.add_argument("--queries", type=int, default=1000, help="query batch (first N queries)")
    ap.add_argument("--checkpoint", default=None, help="a trained forest checkpoint dir")
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--classes", type=int, default=1024)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch, FAISS and numba threads")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    try:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        pass

    m, c = args.models, args.classes
    qc: np.ndarray
    qp: np.ndarray
    t_classify = float("nan")
    if args.store is not None:
        from treerank.store import EmbeddingStore

        st = EmbeddingStore.open(args.store)
        q = np.asarray(st.queries[: args.queries], dtype=np.float32)
        p = np.asarray(st.passages, dtype=np.float32)
        label = str(args.store)
        if args.checkpoint:
            from treerank.models.registry import load_model

            forest = load_model(args.checkpoint, expected_fingerprint=st.encoder_fingerprint)
            m, c = forest.n_models, forest.n_classes
            kind = "checkpoint"
        else:
            forest = Forest.random(ForestConfig(m, c, q.shape[1]), seed=0)
            kind = "random forest"
        index = ForestIndex.build(*forest.passage_classes(p), n_classes=c)
        qc, qp = forest.query_classes(q)
        t_classify = best_of(lambda: forest.query_classes(q), args.repeat)
    else:
        n = args.synthetic
        p = synthetic_vectors(n, args.dim, seed=0)
        q = synthetic_vectors(args.queries, args.dim, seed=1)
        label = f"synthetic {n} x {args.dim}"
        kind = "uniformly drawn classes"
        rng = np.random.default_rng(2)
        pc = rng.integers(0, c, size=(n, m), dtype=np.int32)
        pp = rng.random((n, m), dtype=np.float32)
        index = ForestIndex.build(pc, pp, n_classes=c)
        del pc, pp
        qc = rng.integers(0, c, size=(len(q), m), dtype=np.int32)
        qp = rng.random((len(q), m), dtype=np.float32)
    nq = len(q)
    print(f"store: {label}; {nq} queries, {len(p)} passages, d={q.shape[1]}")
    print(f"forest: M={m} C={c} ({kind}); k={args.k}; threads={args.threads}")

    index.search(qc[:2], qp[:2], args.k)  # compile (or load the cached kernel) outside timing
    t_dense = best_of(lambda: exact_search(q, p, k=args.k), args.repeat)
    t_search = best_of(lambda: index.search(qc, qp, args.k), args.repeat)
    hits = index.search(qc, qp, args.k)
    dense_qps, search_qps = nq / t_dense, nq / t_search
    rows = [("dense exact search (FAISS, cosine)", dense_qps)]
    if not np.isnan(t_classify):
        rows.append(("forest: classify queries + search", nq / (t_classify + t_search)))
    rows.append(("forest: counting search (classes given)", search_qps))
    print(f"\n{'system':<42}{'queries/s':>12}{'x dense':>10}")
    for name, qps in rows:
        print(f"{name:<42}{qps:>12.0f}{qps / dense_qps:>10.2f}")
    scanned = float(hits.scanned.mean())
    touched_frac = scanned / max(1, len(p) * m)
    print(
        f"\nposting entries scanned per query: {scanned:.0f} (M x n / C = {m * len(p) / c:.0f}); "
        f"dense scans {len(p)} x {q.shape[1]} = {len(p) * q.shape[1]} floats"
    )
    dense_bytes = p.nbytes
    scratch = index.search_nbytes(1) - index.nbytes
    print(
        f"memory: forest index {index.nbytes / 2**20:.1f} MiB (+ {scratch} B scratch per "
        f"thread) vs float32 passages {dense_bytes / 2**20:.1f} MiB"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "store": label,
                    "n_queries": nq,
                    "n_passages": len(p),
                    "n_models": m,
                    "n_classes": c,
                    "k": args.k,
                    "threads": args.threads,
                    "dense_qps": dense_qps,
                    "forest_search_qps": search_qps,
                    "speedup": search_qps / dense_qps,
                    "postings_scanned_per_query": scanned,
                    "posting_fraction": touched_frac,
                    "index_bytes": index.nbytes,
                    "passage_bytes": dense_bytes,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
