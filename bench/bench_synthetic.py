"""Realism of the synthetic generator: real vs synthetic vectors at equal size, one thread.

Fits :mod:`treerank.store.synthetic` (defaults) to a real store split, samples as many passages
as the split has plus ``--queries`` queries, and measures on the real and the synthetic sets
alike (queries: ``--queries`` real queries drawn uniformly with seed 0):

- neighbourhood: mean cosine of a query's 1st / 10th / 100th nearest passage (exact
  ``IndexFlatIP``), and of a passage's 1st / 100th nearest other passage (the first 1,000
  passages as probes, self excluded);
- ANN difficulty: Recall@10 / Recall@100 against exact search of ``IndexHNSWFlat`` (M 16,
  ef_construction 40) at ef_search 16 and 64, and of ``IVF{nlist},Flat`` (nlist ~ sqrt(n),
  k-means on all passages) at nprobe 4.

Rows: ``real``; ``synthetic`` (fitted on all passages, queries fitted on up to 50,000 queries);
``synthetic, fit on half`` (passage mixture fitted on a random half of the passages, then
sampled to the full count: does the model extrapolate to more passages than it saw?); and iid
unit Gaussian vectors (the floor). Writes ``results.json`` and ``table.md`` under ``--out``.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python bench/bench_synthetic.py \\
        --store /work/stores/squad/train --out bench/results/index/realism
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 16, 40, (16, 64)
IVF_NPROBE = 4
COLUMNS = [
    ("q_cos@1", "query: cos 1st"),
    ("q_cos@10", "query: cos 10th"),
    ("q_cos@100", "query: cos 100th"),
    ("p_cos@1", "passage: cos 1st"),
    ("p_cos@100", "passage: cos 100th"),
    ("hnsw16@10", "HNSW ef16 R@10"),
    ("hnsw16@100", "HNSW ef16 R@100"),
    ("hnsw64@10", "HNSW ef64 R@10"),
    ("hnsw64@100", "HNSW ef64 R@100"),
    ("ivf@10", "IVF nprobe4 R@10"),
    ("ivf@100", "IVF nprobe4 R@100"),
]


def recall_at(ids: np.ndarray, ref: np.ndarray, k: int) -> float:
    """Mean over rows of ``|ids[:, :k] & ref[:, :k]| / k``."""
    hits = [len(set(a[:k].tolist()) & set(b[:k].tolist())) for a, b in zip(ids, ref, strict=True)]
    return float(np.mean(hits)) / k


def measure(passages: np.ndarray, queries: np.ndarray, label: str) -> dict:
    """The neighbourhood and recall statistics of one set (module docstring)."""
    import faiss

    p = np.ascontiguousarray(passages, dtype=np.float32)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    n, d = p.shape
    t = time.perf_counter()
    flat = faiss.IndexFlatIP(d)
    flat.add(p)
    dist, ref = flat.search(q, 100)
    pdist, _ = flat.search(p[:1000], 101)  # column 0 is the probe itself
    row: dict = {
        "set": label,
        "n_passages": n,
        "n_queries": len(q),
        "q_cos@1": float(dist[:, 0].mean()),
        "q_cos@10": float(dist[:, 9].mean()),
        "q_cos@100": float(dist[:, 99].mean()),
        "p_cos@1": float(pdist[:, 1].mean()),
        "p_cos@100": float(pdist[:, 100].mean()),
    }
    hnsw = faiss.IndexHNSWFlat(d, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    hnsw.add(p)
    for ef in HNSW_EF_SEARCH:
        hnsw.hnsw.efSearch = ef
        ids = hnsw.search(q, 100)[1]
        row[f"hnsw{ef}@10"], row[f"hnsw{ef}@100"] = (
            recall_at(ids, ref, 10),
            recall_at(ids, ref, 100),
        )
    nlist = int(round(np.sqrt(n)))
    ivf = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(p)
    ivf.add(p)
    faiss.extract_index_ivf(ivf).nprobe = IVF_NPROBE
    ids = ivf.search(q, 100)[1]
    row["ivf@10"], row["ivf@100"] = recall_at(ids, ref, 10), recall_at(ids, ref, 100)
    row["ivf_nlist"] = nlist
    row["seconds"] = time.perf_counter() - t
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = "| set | " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|---|" + "---:|" * len(COLUMNS)]
    for r in rows:
        lines.append(f"| {r['set']} | " + " | ".join(f"{r[c[0]]:.3f}" for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="A real store split.")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import faiss

    from treerank.store import EmbeddingStore
    from treerank.store.synthetic import fit_mixture, fit_store

    faiss.omp_set_num_threads(1)
    store = EmbeddingStore.open(args.store)
    n = store.n_passages
    rng = np.random.default_rng(0)
    real_q = np.asarray(store.queries[np.sort(rng.choice(store.n_queries, args.queries, False))])
    rows = [measure(np.asarray(store.passages), real_q, "real")]

    t = time.perf_counter()
    mix = fit_store(store)
    fit_seconds = time.perf_counter() - t
    print(f"fit {fit_seconds:.0f} s", flush=True)
    synth_q = mix.queries.sample(args.queries, seed=1)
    rows.append(measure(mix.passages.sample(n, seed=0), synth_q, "synthetic"))
    half = fit_mixture(store.passages, max_fit=n // 2, seed=1)
    rows.append(measure(half.sample(n, seed=0), synth_q, "synthetic, passages fit on half"))
    iid = np.random.default_rng(2).standard_normal((n + args.queries, store.dim))
    iid /= np.linalg.norm(iid, axis=1, keepdims=True)
    rows.append(measure(iid[:n], iid[n:], "iid Gaussian"))

    info = {
        "store": str(args.store),
        "n_passages": n,
        "n_queries": args.queries,
        "fit_seconds": fit_seconds,
        "passage_mixture": {
            "components": mix.passages.n_components,
            "rank": mix.passages.rank,
            "local_rank": mix.passages.local_rank,
            "residual_variance": mix.passages.residual_variance,
        },
        "query_mixture": {
            "components": mix.queries.n_components,
            "rank": mix.queries.rank,
            "local_rank": mix.queries.local_rank,
            "residual_variance": mix.queries.residual_variance,
        },
        "half_fit_components": half.n_components,
        "hnsw": {"M": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION},
        "ivf_nprobe": IVF_NPROBE,
        "threads": 1,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({**info, "rows": rows}, indent=2) + "\n")
    md = (
        f"Real vs synthetic at equal size: {args.store}, {n:,} passages, {args.queries:,} queries "
        f"(real: drawn with seed 0; synthetic: sampled), one thread. Passage mixture: "
        f"{mix.passages.n_components} components, r {mix.passages.rank}, q "
        f"{mix.passages.local_rank}; query mixture: {mix.queries.n_components} components. "
        f"IVF nlist {rows[0]['ivf_nlist']}.\n\n" + table(rows)
    )
    (args.out / "table.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
