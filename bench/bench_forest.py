"""Forest search throughput and memory against dense exact search, on the same store, same run.

Reference measured in the same run: exact inner-product search (``treerank.kernels.topk``, the
cosine baseline) over the same queries and passages at the same depth ``k``. Printed:

* queries/s of forest search (query classification + inverted-list match counting + top-k),
  with and without the query classification, and of dense exact search; their ratio;
* index build time (passage classification + CSR build) and bytes of the inverted lists against
  the bytes of the float32 passage matrix that exact search scans.

The forest is a trained checkpoint (``--checkpoint``) or, by default, a random forest of the
requested ``M`` x ``C`` (search cost depends on list sizes, not on whether the forest was trained).

Run: ``nice python bench/bench_forest.py --store runs/sample/stores/scifact/test
[--checkpoint DIR] [--models 128 --classes 32] [--k 100] [--threads 1]`` (``--store``: any store
split directory, e.g. the one ``bash scripts/sample.sh`` writes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from treerank.kernels.topk import exact_search
from treerank.models.forest import Forest, ForestConfig
from treerank.search.forest_index import ForestIndex


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def load_vectors(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str, str]:
    if args.store is not None and (Path(args.store) / "queries.bin").exists():
        from treerank.store import EmbeddingStore

        st = EmbeddingStore.open(args.store)
        return (
            np.asarray(st.queries, dtype=np.float32),
            np.asarray(st.passages, dtype=np.float32),
            str(args.store),
            st.encoder_fingerprint,
        )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((args.synthetic_queries, 384)).astype(np.float32)
    p = rng.standard_normal((args.synthetic_passages, 384)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    return q, p, f"synthetic {len(q)} x {len(p)} (no store at {args.store})", ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--store", required=True, help="store split dir, e.g. runs/sample/stores/scifact/test"
    )
    ap.add_argument("--checkpoint", default=None, help="a trained forest checkpoint dir")
    ap.add_argument("--models", type=int, default=128)
    ap.add_argument("--classes", type=int, default=32)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--synthetic-queries", type=int, default=300)
    ap.add_argument("--synthetic-passages", type=int, default=20000)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    q, p, label, fp = load_vectors(args)
    if args.checkpoint:
        from treerank.models.registry import load_model

        forest = load_model(args.checkpoint, expected_fingerprint=fp or None)
    else:
        forest = Forest.random(ForestConfig(args.models, args.classes, q.shape[1]), seed=0)
    m, c = forest.n_models, forest.n_classes
    print(f"store: {label}; {len(q)} queries, {len(p)} passages, d={q.shape[1]}")
    print(
        f"forest: M={m} C={c} ({'checkpoint' if args.checkpoint else 'random'}); k={args.k}; "
        f"torch threads={args.threads}"
    )

    # Dense exact search (reference), on normalised vectors: the cosine baseline.
    t_dense = best_of(lambda: exact_search(q, p, k=args.k), args.repeat)

    holder: dict[str, object] = {}

    def build() -> None:
        holder["index"] = ForestIndex.build(*forest.passage_classes(p), n_classes=c)

    t_build = best_of(build, args.repeat)
    index = holder["index"]
    assert isinstance(index, ForestIndex)
    qc, qp = forest.query_classes(q)
    t_classify = best_of(lambda: forest.query_classes(q), args.repeat)
    t_search = best_of(lambda: index.search(qc, qp, args.k), args.repeat)
    t_forest = t_classify + t_search

    nq = len(q)
    dense_qps, forest_qps, search_qps = nq / t_dense, nq / t_forest, nq / t_search
    print(f"\n{'system':<38}{'queries/s':>12}{'x dense':>10}")
    print(f"{'dense exact search (cosine)':<38}{dense_qps:>12.0f}{1.0:>10.2f}")
    for label, qps in (
        ("forest: classify queries + search", forest_qps),
        ("forest: search only (classes given)", search_qps),
    ):
        print(f"{label:<38}{qps:>12.0f}{qps / dense_qps:>10.2f}")
    mean_list = index.ids.size / max(1, m * c)
    sizes = index.list_sizes()
    scanned = sizes[np.arange(m)[None, :], qc].sum(axis=1).mean()
    print(f"\nforest index build (classify {len(p)} passages + CSR): {t_build:.3f} s")
    print(
        f"mean list length {mean_list:.1f}; posting entries scanned per query {scanned:.0f} "
        f"(balanced lists: {mean_list * m:.0f}; dense scans {len(p)} vectors x {q.shape[1]} dims)"
    )
    dense_bytes = p.nbytes
    model_bytes = 4 * sum(w.numel() for w in forest.passage_weights + forest.query_weights)
    print(
        f"memory: forest index {index.nbytes / 2**20:.2f} MiB stored, "
        f"{index.search_nbytes / 2**20:.2f} MiB while searching "
        f"(+ model {model_bytes / 2**20:.2f} MiB) vs float32 passages "
        f"{dense_bytes / 2**20:.2f} MiB; ratio {index.search_nbytes / dense_bytes:.2f}"
    )


if __name__ == "__main__":
    main()
