"""Where exact search's resident memory goes: anonymous vs file-backed, phase by phase.

Issue 34 item 4. Runs ``kernels.topk.exact_search`` (cosine, top-100, ``backend="auto"``) over
the ``validation`` split of a store written by ``bench/bench_scale.py --stages data`` and samples
``/proc/self/status`` every 50 ms from a thread: ``RssAnon`` (numpy / torch buffers) and
``RssFile`` (pages of the passage file mapped into the process). Each sample is labelled with the
phase the search is in, found by wrapping the kernel's internal steps (read-only wrappers that
record and call through):

* ``preselect``: the streaming BLAS pass over passage chunks;
* ``gather``: the exact rescoring of each query's preselected rows (rows gathered, then
  :func:`treerank.kernels.topk.pair_scores`);
* ``full``: queries whose preselection margin is under the float32 error bound, rescored over
  every passage.

Writes ``--out`` JSON: per phase the peak anonymous, file and total GiB and its seconds, the
process's ``ru_maxrss``, the number of queries rescored over every passage, the result ids'
SHA-256 (bit-identity across versions) and the CPU (``lscpu`` model and flags).

Usage: ``OMP_NUM_THREADS=1 python bench/scale_rss_probe.py --root /tmp/treerank-scale
--queries 2000 --out bench/results/scale/exact-rss-100k.json --label after``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_encoding import lscpu  # noqa: E402
from bench_scale import rss_split  # noqa: E402


def probe(root: Path, n_queries: int, k: int = 100) -> dict[str, Any]:
    """The phases' memory of one ``exact_search`` over ``root / "validation"`` (module doc)."""
    import treerank.kernels.topk as topk
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(root / "validation")
    q = np.ascontiguousarray(store.queries[:n_queries], dtype=np.float32)
    phase = ["start"]
    trace: list[tuple[float, str, float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            s = rss_split()
            anon, file = s.get("RssAnon", 0) / 2**20, s.get("RssFile", 0) / 2**20
            trace.append((time.perf_counter(), phase[0], anon, file))
            stop.wait(0.05)

    full_queries = [0]
    inner = topk._exact_top_k
    merge = topk.merge_topk
    rescoring = [False]

    def exact_top_k(*args: Any, **kwargs: Any) -> Any:
        rescoring[0] = True
        phase[0] = "gather"
        return inner(*args, **kwargs)

    def merge_topk(a: np.ndarray, b: np.ndarray, kk: int) -> np.ndarray:
        if rescoring[0]:  # only the full rescoring merges after the preselection
            if phase[0] != "full":
                full_queries[0] += int(a.shape[0])
            phase[0] = "full"
        return merge(a, b, kk)

    topk._exact_top_k = exact_top_k  # type: ignore[assignment]
    topk.merge_topk = merge_topk  # type: ignore[assignment]
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    phase[0] = "preselect"
    t0 = time.perf_counter()
    try:
        ids, scores = topk.exact_search(q, store.passages, k=k, backend="auto", device="cpu")
    finally:
        topk._exact_top_k, topk.merge_topk = inner, merge  # type: ignore[assignment]
    seconds = time.perf_counter() - t0
    stop.set()
    thread.join()
    phases: dict[str, Any] = {}
    for name in ("start", "preselect", "gather", "full"):
        rows = [r for r in trace if r[1] == name]
        if rows:
            phases[name] = {
                "peak_anon_gib": max(r[2] for r in rows),
                "peak_file_gib": max(r[3] for r in rows),
                "peak_total_gib": max(r[2] + r[3] for r in rows),
                "seconds": rows[-1][0] - rows[0][0],
            }
    digest = hashlib.sha256(ids.tobytes() + scores.tobytes()).hexdigest()
    return {
        "passages": int(store.n_passages),
        "dim": int(store.dim),
        "queries": int(q.shape[0]),
        "k": k,
        "seconds": seconds,
        "phases": phases,
        "ru_maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "full_rescore_queries": full_queries[0],
        "result_sha256": digest,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="run", help="the key of this run in --out")
    ap.add_argument("--note", default="", help="what this run is (the code version)")
    a = ap.parse_args()
    import subprocess

    res = probe(a.root, a.queries)
    res["note"] = a.note
    res["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    res["cpu"] = lscpu()
    doc = json.loads(a.out.read_text()) if a.out.exists() else {}
    doc[a.label] = res
    from treerank.atomic import atomic_write_json

    atomic_write_json(a.out, doc, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "cpu"}, indent=1))


if __name__ == "__main__":
    main()
