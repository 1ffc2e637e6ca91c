"""Pareto benchmark of the FAISS index kinds: recall against exact search vs queries/s.

For one store split (a real one, or a synthetic one written by :mod:`treerank.store.synthetic`
from a mixture fitted to a real store), in ONE run, everything on ONE thread (FAISS's OpenMP
pool and BLAS set to 1 in every process):

1. the reference ids: treerank's exact streaming search (``exact_search``, FAISS backend, chunked
   from the memory map) of the same query batch (the first ``--queries`` queries) at depth 100,
   timed;
2. for each ``--system`` spec (``faiss:...``; ``faiss:flat`` is FAISS's exact ``IndexFlatIP``):
   in a child process (so that its peak RSS is its own), build the index from the memory-mapped
   store (training sample + chunked add) or load it from the cache, then search the same query
   batch at depth 100 (best of ``--reps``; one repetition when the first takes more than
   ``--max-rep-seconds``); Recall@10 / Recall@100 = overlap of the top 10 / 100 with the exact
   top 10 / 100, averaged over queries; queries/s, build seconds, index bytes, and three
   resident-set figures: the child's RSS before building (Python, NumPy, FAISS imported),
   its peak RSS when the build finished (``VmHWM``, the figure the memory cap is about) and its
   peak RSS after the searches;
3. ``results.json``, ``table.md`` and ``pareto.png`` (Recall@10 and Recall@100 vs queries/s,
   log x, the exact searches as reference points) under ``--out``. "x exact" divides by the
   queries/s of the faster of the two exact searches.

The synthetic store, the index cache and the exact ids go under ``--work`` (keep it outside the
repository: a 1M x 384 store is 1.5 GB and its indexes several GB more).

Usage (niced; the machine is shared)::

    OMP_NUM_THREADS=1 nice -n 10 python bench/bench_index.py --synthetic 1000000 \
        --fit-store /work/stores/squad/train --work /work/scratch/index --out DIR
    OMP_NUM_THREADS=1 nice -n 10 python bench/bench_index.py \
        --store .cache/test-stores/scifact-.../test --work /tmp/bench-index --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}


def one_thread() -> None:
    """FAISS's OpenMP pool to one thread (the environment covers BLAS in children)."""
    import faiss

    faiss.omp_set_num_threads(1)


def rss_mib() -> float:
    """Current resident set of this process (``VmRSS``), MiB; 0 where unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


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
    from treerank.search.specs import build_system
    from treerank.store import EmbeddingStore

    one_thread()
    store = EmbeddingStore.open(args.store)
    q = np.asarray(store.queries[: args.queries], dtype=np.float32)
    view = QueryView(store, q, [""] * len(q))
    system = build_system(args.child)
    inner = system if isinstance(system, FaissSystem) else system.first  # type: ignore[attr-defined]
    inner.index_dir = args.index_dir
    rss_before = rss_mib()
    t0 = time.perf_counter()
    index = inner.index_for(store)
    build_wall = time.perf_counter() - t0
    cached = index.meta.get("build_seconds", build_wall)
    best, reps = np.inf, 0
    while reps < args.reps and not (reps and best > args.max_rep_seconds):
        t = time.perf_counter()
        run = system.retrieve(view, DEPTH)
        best = min(best, time.perf_counter() - t)
        reps += 1
    ref = np.load(args.exact)
    print(
        json.dumps(
            {
                "system": args.child,
                "recall@10": recall_at(run.ids, ref, 10),
                "recall@100": recall_at(run.ids, ref, 100),
                "qps": len(q) / best,
                "search_seconds": best,
                "reps": reps,
                "build_seconds": cached,
                "loaded_from_cache": build_wall < 0.5 * cached,
                "index_mib": index.meta.get("index_bytes", 0) / 2**20,
                "rss_before_build_mib": rss_before,
                "build_peak_rss_mib": index.meta.get("peak_rss_mib"),
                "peak_rss_mib": peak_rss_mib(),
            }
        )
    )


def exact_reference(
    store_dir: Path, n_queries: int, out: Path, reps: int, max_rep_seconds: float
) -> dict:
    from treerank.kernels.topk import exact_search
    from treerank.store import EmbeddingStore

    one_thread()
    store = EmbeddingStore.open(store_dir)
    q = np.asarray(store.queries[:n_queries], dtype=np.float32)
    best, ids, done = np.inf, None, 0
    while done < reps and not (done and best > max_rep_seconds):
        t = time.perf_counter()
        ids, _ = exact_search(q, store.passages, k=DEPTH)
        best = min(best, time.perf_counter() - t)
        done += 1
    assert ids is not None
    np.save(out / "exact_ids.npy", ids)
    return {
        "system": "exact (treerank exact_search)",
        "recall@10": 1.0,
        "recall@100": 1.0,
        "qps": len(q) / best,
        "search_seconds": best,
        "reps": done,
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
            marker = "*" if r["system"].startswith("exact") or r["system"] == "faiss:flat" else "o"
            ax.scatter(r["qps"], r[key], marker=marker, s=80 if marker == "*" else 30)
            ax.annotate(
                r["system"].replace("faiss:", ""), (r["qps"], r[key]), fontsize=6, alpha=0.8
            )
        ax.axvline(10 * exact_qps(rows), color="grey", ls=":", lw=1, label="10x exact queries/s")
        if key == "recall@100":
            ax.axhline(0.95, color="grey", ls="--", lw=1, label="Recall@100 0.95")
        ax.legend(fontsize=7, loc="lower left")
        ax.set_xscale("log")
        ax.set_xlabel("queries / s (same batch, log scale)")
        ax.set_ylabel(f"{key} vs exact search")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path)


def exact_qps(rows: list[dict]) -> float:
    """Queries/s of the faster exact search (treerank's streaming one or ``faiss:flat``)."""
    return max(
        r["qps"] for r in rows if r["system"].startswith("exact") or r["system"] == "faiss:flat"
    )


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(rows: list[dict], reference_qps: float) -> str:
    lines = [
        "| system | Recall@10 | Recall@100 | queries/s | x exact | build s | index MiB "
        "| RSS before build MiB | peak RSS after build MiB | peak RSS after search MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['system']} | {r['recall@10']:.4f} | {r['recall@100']:.4f} | {r['qps']:.0f} "
            f"| {r['qps'] / reference_qps:.1f} | {r['build_seconds']:.1f} | {r['index_mib']:.1f} "
            f"| {_mib(r.get('rss_before_build_mib'))} | {_mib(r.get('build_peak_rss_mib'))} "
            f"| {_mib(r.get('peak_rss_mib'))} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", type=Path, help="A store split to benchmark on.")
    ap.add_argument("--synthetic", type=int, default=0, help="Synthetic passages to generate.")
    ap.add_argument("--fit-store", type=Path, help="Real store split the mixture is fitted to.")
    ap.add_argument(
        "--components", type=int, help="Mixture components (default: one per 20 fitted rows)."
    )
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--system", action="append", dest="systems")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--max-rep-seconds",
        type=float,
        default=60.0,
        help="No second repetition when the first search took longer than this.",
    )
    ap.add_argument("--out", type=Path, required=True, help="Where the tables and plot go.")
    ap.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "treerank-bench-index",
        help="Synthetic store, exact ids and index cache (outside the repository).",
    )
    ap.add_argument("--index-dir", type=Path, help="Index cache (default WORK/indexes).")
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
    os.environ.update(ONE_THREAD)
    args.work.mkdir(parents=True, exist_ok=True)
    index_dir = args.index_dir or args.work / "indexes"
    if args.synthetic:
        from treerank.store import EmbeddingStore
        from treerank.store.synthetic import fit_store, write_synthetic_store

        if args.fit_store is None:
            ap.error("--synthetic needs --fit-store")
        t = time.perf_counter()
        mix = fit_store(EmbeddingStore.open(args.fit_store), n_components=args.components)
        store_dir = write_synthetic_store(
            args.work / f"synthetic-{args.synthetic}", mix, args.synthetic, args.queries
        )
        print(f"synthetic store {store_dir}: {time.perf_counter() - t:.0f} s", flush=True)
        title = (
            f"{args.synthetic:,} x 384 synthetic passages (mixture of "
            f"{mix.passages.n_components} PPCA components fitted to {args.fit_store} passages, "
            f"{mix.queries.n_components} to its queries), {args.queries:,} synthetic queries, "
            "depth 100, one thread"
        )
    elif args.store:
        store_dir = args.store
        from treerank.store import EmbeddingStore

        nq = min(args.queries, EmbeddingStore.open(store_dir).n_queries)
        title = f"{store_dir}, {nq} queries (the first {args.queries} at most), one thread"
    else:
        ap.error("give --store or --synthetic N --fit-store STORE")
    ref = exact_reference(store_dir, args.queries, args.work, args.reps, args.max_rep_seconds)
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
            "--max-rep-seconds",
            str(args.max_rep_seconds),
            "--exact",
            str(args.work / "exact_ids.npy"),
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
    md = f"{title}\n\n" + table(rows, exact_qps(rows))
    (out / "table.md").write_text(md)
    plot(rows, out / "pareto.png", title)
    print(md)


if __name__ == "__main__":
    main()
