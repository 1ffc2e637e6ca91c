"""Exact-search benchmark: treerank ``exact_search`` against FAISS ``IndexFlatIP`` (same run).

1. Throughput: ``--queries`` x ``--passages`` x ``--dim`` random unit vectors, top-``--k``;
   FAISS ``IndexFlatIP.search`` and ``exact_search`` (both backends) interleaved ``--reps`` times;
   prints the best time of each and the throughput ratio ``faiss_time / treerank_time``
   (>= 1 means treerank is at least as fast).
2. Scale (``--scale-passages`` > 0): writes that many unit vectors to a memory-mapped file like a
   store's ``passages.bin``, searches ``--scale-queries`` queries over it from the memmap and
   reports wall time and peak RSS (``ru_maxrss``) against the file size and the chunk size, in a
   child process so that the throughput part's memory does not count.

Usage: ``nice python bench/bench_search.py [--passages 200000] [--scale-passages 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def throughput(args: argparse.Namespace) -> dict[str, float]:
    import faiss

    from treerank.kernels.topk import exact_search

    rng = np.random.default_rng(0)
    p = unit(rng, args.passages, args.dim)
    q = unit(rng, args.queries, args.dim)
    index = faiss.IndexFlatIP(args.dim)
    index.add(p)
    best = {
        "faiss IndexFlatIP": np.inf,
        "treerank faiss-backend": np.inf,
        "treerank torch-backend": np.inf,
    }
    agree = 0.0
    for _ in range(args.reps):
        t = time.perf_counter()
        ref_s, ref_i = index.search(q, args.k)
        best["faiss IndexFlatIP"] = min(best["faiss IndexFlatIP"], time.perf_counter() - t)
        for backend in ("faiss", "torch"):
            t = time.perf_counter()
            ids, scores = exact_search(q, p, k=args.k, chunk_size=args.chunk_size, backend=backend)
            key = f"treerank {backend}-backend"
            best[key] = min(best[key], time.perf_counter() - t)
            agree = float((ids == ref_i).mean())
            assert np.allclose(scores, ref_s, atol=1e-5)
    out = {k: float(v) for k, v in best.items()}
    for key in ("treerank faiss-backend", "treerank torch-backend"):
        out[f"ratio {key}"] = best["faiss IndexFlatIP"] / best[key]
    out["id agreement (ties listed differently)"] = agree
    return out


def peak_rss_mib() -> float:
    """Peak resident set of this process (``VmHWM``; reset by exec, unlike ``ru_maxrss``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scale_child(path: str, n: int, d: int, nq: int, k: int, chunk: int) -> None:
    from treerank.kernels.topk import exact_search

    rss0 = peak_rss_mib()
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=(n, d))
    q = unit(np.random.default_rng(1), nq, d)
    t = time.perf_counter()
    ids, _ = exact_search(q, mm, k=k, chunk_size=chunk)
    secs = time.perf_counter() - t
    res = {"seconds": secs, "peak_rss_mib": peak_rss_mib(), "rss_before_search_mib": rss0}
    print(json.dumps(res | {"shape": list(ids.shape)}))


def scale(args: argparse.Namespace) -> dict[str, float]:
    n, d = args.scale_passages, args.dim
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = os.path.join(tmp, "passages.bin")
        mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, d))
        rng = np.random.default_rng(2)
        for s in range(0, n, 100_000):
            mm[s : s + 100_000] = unit(rng, min(100_000, n - s), d)
        mm.flush()
        del mm
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                path,
                str(n),
                str(d),
                str(args.scale_queries),
                str(args.k),
                str(args.chunk_size),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    res = json.loads(out.strip().splitlines()[-1])
    res["file_mib"] = n * d * 4 / 2**20
    res["chunk_mib"] = args.chunk_size * d * 4 / 2**20
    res["run_arrays_mib"] = args.scale_queries * args.k * 8 * 2 / 2**20
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        path, n, d, nq, k, chunk = sys.argv[2:8]
        scale_child(path, int(n), int(d), int(nq), int(k), int(chunk))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=1_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument(
        "--chunk-size", type=int, default=262_144, help="rows (treerank's default at 384 dims)"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale-passages", type=int, default=1_000_000)
    ap.add_argument("--scale-queries", type=int, default=1_000)
    ap.add_argument("--tmp", default=None, help="directory for the scale run's memmapped file")
    args = ap.parse_args()
    import faiss
    import torch

    nthreads = f"torch {torch.get_num_threads()}, faiss {faiss.omp_get_max_threads()}"
    print(f"threads: {nthreads}; cores {os.cpu_count()}")
    res = throughput(args)
    print(
        f"throughput: {args.queries} queries x {args.passages:,} x {args.dim} passages, "
        f"k={args.k}, best of {args.reps}"
    )
    for key, v in res.items():
        unit_ = "s" if not key.startswith(("ratio", "id")) else ""
        print(f"  {key:42s} {v:8.3f}{unit_}")
    if args.scale_passages > 0:
        r = scale(args)
        print(
            f"scale: {args.scale_queries} queries over {args.scale_passages:,} x {args.dim} "
            f"memmapped passages ({r['file_mib']:.0f} MiB file), chunk {args.chunk_size:,} rows "
            f"({r['chunk_mib']:.0f} MiB), k={args.k}"
        )
        print(
            f"  time {r['seconds']:.1f}s; peak RSS {r['peak_rss_mib']:.0f} MiB "
            f"(before search {r['rss_before_search_mib']:.0f} MiB)"
        )


if __name__ == "__main__":
    main()
