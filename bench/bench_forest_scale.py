"""Forest training at scale: time and peak memory per pair on a synthetic store (not a CI test).

The issue's setting is 1M passages x 384 dims, 200K training queries, 2 pairs at C = 256, with
peak RSS under 8 GiB. This script

1. fits the shared synthetic generator (:mod:`treerank.store.synthetic`: a PCA-rotated Gaussian
   mixture) to a real store's passages (``--fit-store``) and writes ``--passages`` synthetic
   passages as a store split with :func:`~treerank.store.synthetic.write_synthetic_store`
   (float32, memory-mapped, never loaded whole);
2. makes ``--queries`` labelled training queries: each a noisy copy of one random passage (its
   single selected passage; cosine ~0.6 to it, like a question to its paragraph), plus
   ``--judged-negatives`` random judged non-selected candidates per query;
3. trains ``--pairs`` pairs with the bounded-memory trainer and prints wall time per pair, setup
   time and the process's peak RSS (``resource.getrusage``, which includes the store's pages that
   were read).

The judged negatives stand in for the mined ones (``hard_negatives``): they give the trainer the
same number of negative examples and passage rows per query as 8 mined hard negatives, without
the exact 200K x 1M top-k search that mining costs (~1.5e14 FLOP). ``--mine-sample N`` times that
search for N queries, to extrapolate it.

``nice python bench/bench_forest_scale.py --fit-store STORE_SPLIT --passages 1000000
--queries 200000 --steps 2 --mine-sample 1000``
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from treerank.forest.trainer import train_forest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the attributes the forest trainer reads, over memory-mapped passages: the tests' in-memory store
from tests.training.conftest import ToyStore  # noqa: E402


def build_store(
    root: Path, fit_store: Path, n_passages: int, n_queries: int, judged: int, seed: int
) -> ToyStore:
    """Synthetic passages from the shared generator, labelled noisy-copy queries (see above)."""
    from treerank.store import EmbeddingStore
    from treerank.store.synthetic import fit_store as fit
    from treerank.store.synthetic import write_synthetic_store

    mixtures = fit(EmbeddingStore.open(fit_store), seed=seed)
    split = EmbeddingStore.open(write_synthetic_store(root / "synthetic", mixtures, n_passages, 1))
    passages = split.passages  # (n, d) float32 memory-mapped
    dim = int(passages.shape[1])
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, n_passages, n_queries)
    q = np.empty((n_queries, dim), dtype=np.float32)
    for s in range(0, n_queries, 65536):
        e = min(n_queries, s + 65536)
        order = np.argsort(gold[s:e])
        x = np.empty((e - s, dim), dtype=np.float32)
        x[order] = passages[gold[s:e][order]]
        x += 1.33 * rng.standard_normal(x.shape).astype(np.float32) / np.sqrt(dim)
        q[s:e] = x / np.linalg.norm(x, axis=1, keepdims=True)
    cand = np.concatenate(
        [gold[:, None], rng.integers(0, n_passages, (n_queries, judged))], axis=1
    ).astype(np.int32)
    labels = np.zeros(cand.shape, dtype=np.uint8)
    labels[:, 0] = 1
    labels[:, 1:][cand[:, 1:] == cand[:, :1]] = 1  # a random draw of the gold passage is gold
    synthetic = {"encoder_name": "synthetic", "encoder_fingerprint": "synthetic"}
    return ToyStore(q, passages, cand, labels, path=root / "synthetic", **synthetic)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fit-store", type=Path, required=True, help="real store split to fit")
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--classes", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="steps per stage (default: config)")
    ap.add_argument("--judged-negatives", type=int, default=7)
    ap.add_argument("--hard-negatives", type=int, default=0)
    ap.add_argument("--random-negatives", type=int, default=8)
    ap.add_argument("--mine-sample", type=int, default=0, help="time mining for N queries")
    ap.add_argument("--chunk-size", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        t0 = time.perf_counter()
        store = build_store(
            Path(tmp), args.fit_store, args.passages, args.queries, args.judged_negatives, 0
        )
        t_build = time.perf_counter() - t0
        rss_store = peak_rss_gib()
        mine = None
        if args.mine_sample:
            from treerank.forest.data import mine_hard_negatives

            n = min(args.mine_sample, args.queries)
            t0 = time.perf_counter()
            mine_hard_negatives(
                store.queries[:n], store.passages, np.arange(n), store.candidates[:n, 0], 8
            )
            sec = time.perf_counter() - t0
            mine = {
                "queries": n,
                "seconds": sec,
                "extrapolated_seconds_all_queries": sec * args.queries / n,
            }
        trainer: dict[str, object] = {
            "group_size": 1,
            "chunk_size": args.chunk_size,
            "num_threads": args.threads,
            "validate_at": list(range(1, args.pairs + 1)),
        }
        if args.steps is not None:
            trainer.update(steps_query=args.steps, steps_passage=args.steps, steps_joint=args.steps)
        cfg = {
            "seed": 0,
            "model": {"n_models": args.pairs, "n_classes": args.classes},
            "data": {
                "hard_negatives": args.hard_negatives,
                "random_negatives": args.random_negatives,
            },
            "trainer": trainer,
        }
        from treerank.forest.data import pair_data, shared_rows

        passage_rows = len(shared_rows(store, pair_data(store, 0, None)).ids) + min(
            1024, args.queries * args.random_negatives, args.passages
        )
        t0 = time.perf_counter()
        out = train_forest(store, cfg, validate=lambda _: {"peak_rss_gib": peak_rss_gib()})
        t_train = time.perf_counter() - t0
        pairs = [r for r in out.records if r.get("kind") == "pair"]
        per_pair = [r["seconds"] for r in pairs]
        result = {
            "passages": args.passages,
            "queries": args.queries,
            "dim": store.dim,
            "classes": args.classes,
            "pairs": args.pairs,
            "steps_per_stage": args.steps,
            "judged_negatives": args.judged_negatives,
            "hard_negatives": args.hard_negatives,
            "random_negatives": args.random_negatives,
            "chunk_size": args.chunk_size,
            "threads": args.threads,
            "store_build_seconds": t_build,
            "mining": mine,
            "train_seconds": t_train,
            "seconds_per_pair": per_pair,
            "setup_seconds": t_train - sum(per_pair),
            "train_queries": out.summary["n_train_queries"],
            "positive_examples": out.summary["n_positive_pairs"],
            "fixed_negative_examples": out.summary["n_fixed_negative_pairs"],
            "peak_rss_gib_after_store": rss_store,
            "peak_rss_gib_after_pair": [p["peak_rss_gib"] for p in out.summary["curve"]],
            "peak_rss_gib": peak_rss_gib(),
            # what the trainer before block-wise logits held whole per step: the logits of both
            # sides and their gradients, float32 (computed from the shapes, not measured)
            "whole_logits_and_gradients_gib": 2
            * 4
            * (out.summary["n_train_queries"] * args.classes + passage_rows * (args.classes + 1))
            / 2**30,
            "passage_rows": passage_rows,
        }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
