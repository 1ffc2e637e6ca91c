"""Pareto benchmark of the FAISS index kinds: recall against exact search vs queries/s.

For one store split (a real one, or a synthetic one written from a Gaussian mixture fitted to a
real store by :mod:`treerank.store.synthetic`), in ONE run:

1. the reference: treerank's exact streaming search (``exact_search``, FAISS backend, chunked
   from the memory map) of the same query batch (the first ``--queries`` queries) at depth 100,
   timed;
2. for each ``--system`` spec (``faiss:...``): in a child process (so that its peak RSS is its
   own), build the index from the memory-mapped store (training sample + chunked add), then
   search the same query batch at depth 100 (best of ``--reps``); Recall@10 / Recall@100 =
   overlap of the top 10 / 100 with the exact top 10 / 100, averaged over queries;
   queries/s, build seconds, index bytes, peak RSS;
3. ``results.json``, ``table.md`` and ``pareto.png`` (Recall@10 and Recall@100 vs queries/s,
   log x, the exact search as the reference point) under ``--out``.

Usage (niced; the machine is shared)::

    nice -n 15 python bench/bench_index.py --synthetic 1000000 --fit-store STORE/test --out DIR
    nice -n 15 python bench/bench_index.py --store .cache/test-stores/scifact-.../test --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_SYSTEMS = [
    "faiss:flat",
    "faiss:hnsw:M=16,ef_construction=40,ef_search=32",
    "faiss:hnsw:M=16,ef_construction=40,ef_search=128",
    "faiss:ivfflat:nlist=1024,nprobe=8",
    "faiss:ivfflat:nlist=1024,nprobe=32",
    "faiss:ivfpq:nlist=1024,m=48,nprobe=16",
    "faiss:ivfpq:nlist=1024,m=48,nprobe=32,rescore=200",
    "faiss:int8",
    "faiss:fp16",
    "faiss:binary:rescore=0",
    "faiss:binary:rescore=1000",
]
DEPTH = 100


def recall_at(ids: np.ndarray, ref: np.ndarray, k: int) -> float:
    """Mean over rows of ``|ids[:, :k] & ref[:, :k]| / k`` (padding ``-1`` never matches)."""
    hits = [
        len(set(a[:k].tolist()) & set(b[:k].tolist()) - {-1}) for a, b in zip(ids, ref, strict=True)
    ]
    return float(np.mean(hits)) / k


def child(args: argparse.Namespace) -> None:
    """Build one index and search the batch; print one JSON line."""
    from treerank.search.faiss_index import FaissSystem, peak_rss_mib
    from treerank.search.query import QueryView
    from treerank.search.systems import build_system
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(args.store)
    q = np.asarray(store.queries[: args.queries], dtype=np.float32)
    view = QueryView(store, q, [""] * len(q))
    system = build_system(args.child)
    inner = system if isinstance(system, FaissSystem) else system.first  # type: ignore[attr-defined]
    inner.index_dir = args.index_dir
    t0 = time.perf_counter()
    index = inner.index_for(store)
    build_wall = time.perf_counter() - t0
    cached = index.meta.get("build_seconds", build_wall)
    best = np.inf
    for _ in range(args.reps):
        t = time.perf_counter()
        run = system.retrieve(view, DEPTH)
        best = min(best, time.perf_counter() - t)
    ref = np.load(args.exact)
    print(
        json.dumps(
            {
                "system": args.child,
                "recall@10": recall_at(run.ids, ref, 10),
                "recall@100": recall_at(run.ids, ref, 100),
                "qps": len(q) / best,
                "search_seconds": best,
                "build_seconds": cached,
                "index_mib": index.meta.get("index_bytes", 0) / 2**20,
                "peak_rss_mib": peak_rss_mib(),
                "build_peak_rss_mib": index.meta.get("peak_rss_mib"),
            }
        )
    )


def exact_reference(store_dir: Path, n_queries: int, out: Path, reps: int) -> dict:
    from treerank.kernels.topk import exact_search
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(store_dir)
    q = np.asarray(store.queries[:n_queries], dtype=np.float32)
    best, ids = np.inf, None
    for _ in range(reps):
        t = time.perf_counter()
        ids, _ = exact_search(q, store.passages, k=DEPTH)
        best = min(best, time.perf_counter() - t)
    assert ids is not None
    np.save(out / "exact_ids.npy", ids)
    return {
        "system": "exact (treerank exact_search)",
        "recall@10": 1.0,
        "recall@100": 1.0,
        "qps": len(q) / best,
        "search_seconds": best,
        "build_seconds": 0.0,
        "index_mib": store.n_passages * store.dim * 4 / 2**20,
        "peak_rss_mib": None,
    }


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from treerank.atomic import atomic_savefig

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=False)
    for ax, key in zip(axes, ("recall@10", "recall@100"), strict=True):
        for r in rows:
            marker = "*" if r["system"].startswith("exact") else "o"
            ax.scatter(r["qps"], r[key], marker=marker, s=80 if marker == "*" else 30)
            ax.annotate(
                r["system"].replace("faiss:", ""), (r["qps"], r[key]), fontsize=6, alpha=0.8
            )
        ax.set_xscale("log")
        ax.set_xlabel("queries / s (same batch, log scale)")
        ax.set_ylabel(f"{key} vs exact search")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path)


def table(rows: list[dict], exact_qps: float) -> str:
    lines = [
        "| system | Recall@10 | Recall@100 | queries/s | x exact | build s | index MiB "
        "| peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rss = r.get("peak_rss_mib")
        lines.append(
            f"| {r['system']} | {r['recall@10']:.4f} | {r['recall@100']:.4f} | {r['qps']:.0f} "
            f"| {r['qps'] / exact_qps:.1f} | {r['build_seconds']:.1f} | {r['index_mib']:.1f} "
            f"| {'-' if rss is None else f'{rss:.0f}'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", type=Path, help="A store split to benchmark on.")
    ap.add_argument("--synthetic", type=int, default=0, help="Synthetic passages to generate.")
    ap.add_argument("--fit-store", type=Path, help="Real store split the mixture is fitted to.")
    ap.add_argument("--components", type=int, default=64)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--system", action="append", dest="systems")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--index-dir", type=Path, help="Index cache (default OUT/indexes).")
    ap.add_argument(
        "--from-log",
        type=Path,
        help="Rebuild results.json / table.md / pareto.png in --out from the JSON lines a run "
        "printed (for a run stopped before its end); --title names it.",
    )
    ap.add_argument("--title", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--exact", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_log:
        lines = args.from_log.read_text().splitlines()
        found = [json.loads(x) for x in lines if x.startswith('{"system"')]
        write_results(found, args.out, args.title or str(args.from_log))
        return
    index_dir = args.index_dir or args.out / "indexes"
    if args.synthetic:
        from treerank.store import EmbeddingStore
        from treerank.store.synthetic import fit_store, write_synthetic_store

        if args.fit_store is None:
            ap.error("--synthetic needs --fit-store")
        t = time.perf_counter()
        mix = fit_store(EmbeddingStore.open(args.fit_store), n_components=args.components)
        store_dir = write_synthetic_store(
            args.out / f"synthetic-{args.synthetic}", mix, args.synthetic, args.queries
        )
        print(f"synthetic store {store_dir}: {time.perf_counter() - t:.0f} s", flush=True)
        title = (
            f"{args.synthetic:,} x 384 synthetic (mixture of {args.components} fitted to "
            f"{args.fit_store}), {args.queries} queries"
        )
    elif args.store:
        store_dir = args.store
        from treerank.store import EmbeddingStore

        nq = min(args.queries, EmbeddingStore.open(store_dir).n_queries)
        title = f"{store_dir}, {nq} queries (the first {args.queries} at most)"
    else:
        ap.error("give --store or --synthetic N --fit-store STORE")
    ref = exact_reference(store_dir, args.queries, args.out, args.reps)
    print(json.dumps(ref), flush=True)
    rows = [ref]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "src")}
    for spec in args.systems or DEFAULT_SYSTEMS:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            spec,
            "--store",
            str(store_dir),
            "--queries",
            str(args.queries),
            "--reps",
            str(args.reps),
            "--exact",
            str(args.out / "exact_ids.npy"),
            "--index-dir",
            str(index_dir),
            "--out",
            str(args.out),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode:
            print(f"{spec}: FAILED\n{res.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(res.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_results(rows, args.out, title)


def write_results(rows: list[dict], out: Path, title: str) -> None:
    """``results.json``, ``table.md`` and ``pareto.png``; ``rows[0]`` is the exact reference."""
    (out / "results.json").write_text(json.dumps({"title": title, "rows": rows}, indent=2) + "\n")
    md = f"{title}\n\n" + table(rows, rows[0]["qps"])
    (out / "table.md").write_text(md)
    plot(rows, out / "pareto.png", title)
    print(md)


if __name__ == "__main__":
    main()
