"""Forest training at scale: time and peak memory per pair on a synthetic store (not a CI test).

The issue's setting is 1M passages x 384 dims, 200K training queries, 2 pairs at C = 256, with
peak RSS under 8 GiB. This script builds such a store on disk (float32 passages memory-mapped,
never loaded whole; each training query is a noisy copy of one random passage, its single
selected passage), trains ``--pairs`` pairs with the bounded-memory trainer (full-batch
gradients accumulated over ``chunk_size`` blocks, hard negatives mined through the exact top-k
kernel) and prints wall time per stage, time per pair and the process's peak RSS
(``resource.getrusage``, which includes the store's pages that were read).

Run the full setting where the CPU allows (hours on one core), or a reduced one and extrapolate
linearly in passages x queries (the note in ``docs/forest.md`` does this):
``nice python bench/bench_forest_scale.py --passages 1000000 --queries 200000`` or
``nice python bench/bench_forest_scale.py --passages 100000 --queries 20000 --steps 5``.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from treerank.training.forest import train_forest


@dataclass
class DiskStore:
    """The attributes the forest trainer reads, with memory-mapped passages."""

    queries: np.ndarray
    passages: np.ndarray
    candidates: np.ndarray
    labels: np.ndarray
    relevance_threshold: int = 1
    encoder_name: str = "synthetic"
    encoder_fingerprint: str = "synthetic"
    path: Path = Path("synthetic")
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.queries.shape[1])

    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    @property
    def n_passages(self) -> int:
        return int(self.passages.shape[0])


def build_store(root: Path, n_passages: int, n_queries: int, dim: int, seed: int) -> DiskStore:
    rng = np.random.default_rng(seed)
    mm = np.lib.format.open_memmap(
        root / "passages.npy", mode="w+", dtype=np.float32, shape=(n_passages, dim)
    )
    centres = rng.standard_normal((1024, dim)).astype(np.float32)
    for s in range(0, n_passages, 65536):
        e = min(n_passages, s + 65536)
        x = centres[rng.integers(0, 1024, e - s)] + rng.standard_normal((e - s, dim)).astype(
            np.float32
        )
        mm[s:e] = x / np.linalg.norm(x, axis=1, keepdims=True)
    mm.flush()
    del mm
    passages = np.load(root / "passages.npy", mmap_mode="r")
    gold = rng.integers(0, n_passages, n_queries)
    q = np.empty((n_queries, dim), dtype=np.float32)
    for s in range(0, n_queries, 65536):
        e = min(n_queries, s + 65536)
        order = np.argsort(gold[s:e])
        x = np.empty((e - s, dim), dtype=np.float32)
        x[order] = passages[gold[s:e][order]]
        x += 0.5 * rng.standard_normal(x.shape).astype(np.float32) / np.sqrt(dim)
        q[s:e] = x / np.linalg.norm(x, axis=1, keepdims=True)
    cand = gold.astype(np.int32)[:, None]
    return DiskStore(q, passages, cand, np.ones_like(cand, dtype=np.uint8))


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--classes", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="steps per stage (default: config)")
    ap.add_argument("--chunk-size", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        store = build_store(Path(tmp), args.passages, args.queries, args.dim, seed=0)
        t_build = time.perf_counter() - t0
        rss_store = peak_rss_gib()
        trainer = {"group_size": 1, "chunk_size": args.chunk_size, "num_threads": args.threads}
        if args.steps is not None:
            trainer.update(steps_query=args.steps, steps_passage=args.steps, steps_joint=args.steps)
        cfg = {
            "seed": 0,
            "model": {"n_models": args.pairs, "n_classes": args.classes},
            "data": {"hard_negatives": 8, "random_negatives": 8},
            "trainer": trainer,
        }
        t0 = time.perf_counter()
        out = train_forest(store, cfg, progress=True)
        t_train = time.perf_counter() - t0
        pairs = [r for r in out.records if r.get("kind") == "pair"]
        per_pair = [r["seconds"] for r in pairs]
        result = {
            "passages": args.passages,
            "queries": args.queries,
            "dim": args.dim,
            "classes": args.classes,
            "pairs": args.pairs,
            "steps_per_stage": args.steps,
            "chunk_size": args.chunk_size,
            "threads": args.threads,
            "store_build_seconds": t_build,
            "train_seconds": t_train,
            "seconds_per_pair": per_pair,
            "setup_seconds": t_train - sum(per_pair),
            "peak_rss_gib_after_store": rss_store,
            "peak_rss_gib": peak_rss_gib(),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
