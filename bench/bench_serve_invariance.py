"""What batch invariance costs the service (issue 36), and what it buys.

On one store split, for the first ``--queries`` query texts, in one process on one thread:

- **batched**: the old service's call, ``search_texts`` over all texts at once (one
  ``encode_queries``, one ``retrieve``);
- **alone**: :meth:`treerank.serve.service.SearchService.search`, which encodes and searches
  each text alone (its ranking never depends on the batch).

Each is timed best of ``--reps``; the result is queries/s of each and the ratio ``alone /
batched`` (the fraction of the batched throughput kept), plus how many of the queries got a
different top-``k`` (ids in order) from the batched call than alone, and the largest score
difference: the instability the old service showed. ``--out`` writes the JSON.

Usage (niced; the machine is shared)::

    OMP_NUM_THREADS=1 nice -n 10 python bench/bench_serve_invariance.py \
        --store .cache/test-stores/scifact-.../test --queries 56 --system cosine
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any


def measure(store_dir: Path, n_queries: int, system: str, k: int, reps: int) -> dict[str, Any]:
    from treerank.search.query import search_texts
    from treerank.serve.service import SearchService, ServiceConfig

    service = SearchService(ServiceConfig(store=store_dir, systems=(system,)))
    texts = service.store.query_texts()[:n_queries]
    built = service.systems[system]

    def batched() -> list[Any]:
        return search_texts(service.store, built, service.encoder, texts, k)[1]

    def alone() -> list[Any]:
        return service.search(texts, k=k, system=system, count=False)

    times: dict[str, float] = {}
    answers: dict[str, list[Any]] = {}
    for name, fn in (("batched", batched), ("alone", alone)):
        answers[name] = fn()  # warm-up
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        times[name] = best
    differ = 0
    max_diff = 0.0
    for a, b in zip(answers["batched"], answers["alone"], strict=True):
        differ += [h.passage_id for h in a] != [h.passage_id for h in b]
        same = {h.passage_id: h.score for h in a}
        max_diff = max(
            [max_diff] + [abs(same[h.passage_id] - h.score) for h in b if h.passage_id in same]
        )
    return {
        "store": str(store_dir),
        "system": system,
        "queries": len(texts),
        "k": k,
        "reps": reps,
        "seconds": times,
        "queries_per_s": {n: len(texts) / s for n, s in times.items()},
        "alone_over_batched_throughput": times["batched"] / times["alone"],
        "queries_whose_top_k_differs_batched_vs_alone": differ,
        "max_score_difference_batched_vs_alone": max_diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--queries", type=int, default=56)
    ap.add_argument("--system", default="cosine")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    doc = measure(args.store, args.queries, args.system, args.k, args.reps)
    doc["threads"] = os.environ.get("OMP_NUM_THREADS")
    doc["cpu"] = platform.processor() or platform.machine()
    doc["load_average_before"] = os.getloadavg()[0]
    qps = doc["queries_per_s"]
    print(
        f"{doc['system']}, {doc['queries']} queries, k={doc['k']}: batched "
        f"{qps['batched']:.1f} q/s, alone {qps['alone']:.1f} q/s, alone/batched "
        f"{doc['alone_over_batched_throughput']:.2f}; top-k differs for "
        f"{doc['queries_whose_top_k_differs_batched_vs_alone']} queries, max score difference "
        f"{doc['max_score_difference_batched_vs_alone']:.2e}"
    )
    if args.out is not None:
        from treerank.atomic import atomic_write_json

        atomic_write_json(args.out, doc)


if __name__ == "__main__":
    main()
