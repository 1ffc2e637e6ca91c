"""1 process x 2 threads vs 2 processes x 1 thread (torchrun, gloo) for embed, search, training.

Each phase runs twice in this one invocation, on the same inputs:

* **single**: one Python process, ``torch.set_num_threads(2)`` (``OMP_NUM_THREADS=2``);
* **sharded**: ``torchrun --nproc_per_node=2``, one thread per process (``OMP_NUM_THREADS=1``),
  through treerank's distributed paths (``treerank.distributed``).

Phases (each timed inside the workers between barriers, so process start-up and model loading
are excluded and reported apart):

* ``embed``: ``--embed-passages`` SciFact passages (+ 10 queries) with the default encoder,
  ``max_batch_size=16``: ``embed_split`` vs every rank encoding its share of the batch plan +
  rank 0's merge (``embed_sharded``);
* ``search``: exact top-``--k`` of ``--queries`` random unit queries over ``--passages``
  memory-mapped random unit passages (384-d): ``exact_search`` vs ``sharded_exact_search``
  (each rank streams half of the memmap, the top-k are all-gathered and merged);
* ``train``: ``--steps`` steps of the linear head on synthetic 384-d data with global batch
  ``--batch`` (1 hard negative per query): ``fit`` vs ``fit`` under DDP with cross-process
  in-batch negatives (per-rank batch ``--batch / 2``); plus the measured gather volume per
  step (the formula is in ``treerank.distributed.gather``).

A control run of 1 process x 1 thread (``--no-control`` skips it) shows how much of the ratio is
parallelism and how much is the 2-thread process losing to a busy machine (an OpenMP team of 2
waits for its slower thread at every parallel region).

Printed: seconds of each phase, ``1x2 / 2x1`` (> 1: the two processes are faster), and
the gather bytes per step. Vectors embedded with 2 threads and with 1 thread per process differ
in the last bits (the thread count changes the order of float sums); the sharded store equals a
one-process store written with the same thread count (``tests/distributed/test_embed.py``).
This machine's 2 cores are shared with other work: read the ratios as this run's, and compare
them only within the run.

Run: ``nice python bench/bench_distributed.py [--passages 100000] [--steps 40] [--out x.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DIM = 384


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _scifact() -> Path:
    for p in (
        REPO.parent / "shared" / "data" / "beir-scifact" / "scifact.zip",
        REPO / "data" / "samples" / "scifact" / "scifact.zip",
    ):
        if p.is_file():
            return p
    raise FileNotFoundError("scifact.zip not found under ../shared/data or data/samples")


def _sync() -> None:
    from treerank.distributed.context import current

    ctx = current()
    if ctx is not None:
        ctx.barrier()


def _timed(fn):  # type: ignore[no-untyped-def]
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def worker(args: argparse.Namespace) -> None:
    """One mode's phases; rank 0 (or the single process) writes ``args.result``."""
    import torch

    from treerank.distributed.context import current, launch
    from treerank.encoders import SentenceEncoder
    from treerank.kernels.sharded import sharded_exact_search
    from treerank.kernels.topk import exact_search
    from treerank.models.linear import LinearHead
    from treerank.readers import read_split
    from treerank.store.sharded_embed import embed_sharded
    from treerank.training.sampler import ContrastiveSampler
    from treerank.training.trainer import TrainerConfig, fit

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    work = Path(args.work)
    res: dict[str, float] = {}
    with launch():
        ctx = current()
        tag = "sharded" if ctx is not None else f"single{os.environ.get('OMP_NUM_THREADS')}"
        # embed
        split = read_split(_scifact(), "scifact", "test", 10, args.embed_passages)
        encoder = SentenceEncoder(max_batch_size=16)
        encoder.encode_batch(["warm-up"] * 4, "query")  # lazy initialisation out of the timing
        out = work / f"embed-{tag}" / "test"
        res["embed_s"], _ = _timed(
            lambda: embed_sharded(split, encoder, out, overwrite=True, progress=False)
        )
        # search
        passages = np.memmap(work / "passages.bin", dtype=np.float32, mode="r").reshape(-1, DIM)
        queries = np.load(work / "queries.npy")
        fn = sharded_exact_search if ctx is not None else exact_search
        res["search_s"], (ids, _) = _timed(lambda: fn(queries, passages, args.k))
        if ctx is None or ctx.is_main:
            np.save(work / f"ids-{tag}.npy", ids)
        # train
        rng = np.random.default_rng(0)
        nq, npas = 40 * args.batch, 50_000
        q, p = _unit(rng, nq, DIM), _unit(rng, npas, DIM)
        cand = rng.integers(0, npas, size=(nq, 11)).astype(np.int32)
        lab = np.zeros_like(cand, dtype=np.uint8)
        lab[:, 0] = 1
        world = ctx.world_size if ctx is not None else 1
        sampler = ContrastiveSampler(
            cand,
            lab,
            batch_size=args.batch // world,
            n_hard=1,
            hard_pool=np.where(lab == 0, cand, -1).astype(np.int64),
        )
        torch.manual_seed(0)
        head = LinearHead(DIM)
        fit(head, sampler, q, p, TrainerConfig(max_steps=2, patience=None), progress=False)
        cfg = TrainerConfig(max_steps=args.steps, log_every=1, patience=None)
        res["train_s"], fr = _timed(lambda: fit(head, sampler, q, p, cfg, progress=False))
        comm = [r.get("comm_bytes") for r in fr.records if r.get("kind") == "train"]
        res["train_steps"] = fr.steps
        if ctx is not None:
            res["gather_bytes_per_step"] = float(np.mean([c for c in comm if c is not None] or [0]))
        if ctx is None or ctx.is_main:
            Path(args.result).write_text(json.dumps(res))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(mode: str, args: argparse.Namespace, work: Path) -> tuple[dict, float]:
    result = work / f"{mode}.json"
    wargs = ["worker", "--work", str(work), "--result", str(result)]
    wargs += ["--k", str(args.k), "--steps", str(args.steps), "--batch", str(args.batch)]
    wargs += ["--embed-passages", str(args.embed_passages)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    if mode in ("single", "single1"):
        env["OMP_NUM_THREADS"] = "2" if mode == "single" else "1"
        cmd = [sys.executable, __file__, *wargs]
    else:
        env.update(OMP_NUM_THREADS="1", TREERANK_DIST_BACKEND="gloo")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        cmd += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}", __file__, *wargs]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    return json.loads(result.read_text()), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="compare", choices=["compare", "worker"])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256, help="global batch (per rank: half)")
    ap.add_argument("--embed-passages", type=int, default=200)
    ap.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run 1 process x 1 thread (shows what 2 threads cost on a busy machine)",
    )
    ap.add_argument("--work", default=None)
    ap.add_argument("--result", default=None)
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    if args.mode == "worker":
        worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        work = Path(tmp)
        rng = np.random.default_rng(1)
        mm = np.memmap(
            work / "passages.bin", dtype=np.float32, mode="w+", shape=(args.passages, DIM)
        )
        for s in range(0, args.passages, 50_000):
            mm[s : s + 50_000] = _unit(rng, min(50_000, args.passages - s), DIM)
        mm.flush()
        del mm
        np.save(work / "queries.npy", _unit(rng, args.queries, DIM))
        single, wall_1 = _run("single", args, work)
        sharded, wall_2 = _run("sharded", args, work)
        control = _run("single1", args, work)[0] if args.control else None
        same_ids = bool(
            np.array_equal(np.load(work / "ids-single2.npy"), np.load(work / "ids-sharded.npy"))
        )
        ref = "single1" if args.control else "single2"
        embed_same = all(
            (work / f"embed-{ref}" / "test" / f).read_bytes()
            == (work / "embed-sharded" / "test" / f).read_bytes()
            for f in ("queries.bin", "passages.bin")
        )
    b_rank = args.batch // 2
    # per step, rank 0 receives rank 1's query rows (B/2 x 384) and passage columns (<= B x 384)
    print(f"1 process x 2 threads vs 2 processes x 1 thread (gloo), {time.strftime('%F %T')}")
    head = f"{'phase':<8} {'1x2 s':>9} {'2x1 s':>9} {'1x2 / 2x1':>10}"
    print(head + (f" {'1x1 s':>9} {'1x1 / 2x1':>10}" if control else ""))
    table = {}
    for phase in ("embed", "search", "train"):
        a, b = single[f"{phase}_s"], sharded[f"{phase}_s"]
        table[phase] = {"single_2threads_s": a, "sharded_2x1_s": b, "ratio": a / b}
        line = f"{phase:<8} {a:>9.2f} {b:>9.2f} {a / b:>10.2f}"
        if control:
            c = control[f"{phase}_s"]
            table[phase].update(single_1thread_s=c, ratio_1thread=c / b)
            line += f" {c:>9.2f} {c / b:>10.2f}"
        print(line)
    print(f"process wall incl. start-up: single {wall_1:.1f} s, sharded {wall_2:.1f} s")
    g = sharded.get("gather_bytes_per_step", 0.0)
    print(
        f"gather per train step and rank: {g / 1024:.1f} KiB received "
        f"(global batch {args.batch}, {b_rank} queries per rank, 1 hard negative, {DIM}-d float32)"
    )
    print(
        f"search top-{args.k} 1x2 == 2x1: {same_ids}; embedded vectors {ref} == 2x1: {embed_same}"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "table": table,
                    "wall_s": {"single": wall_1, "sharded": wall_2},
                    "gather_bytes_per_step": g,
                    "search_identical": same_ids,
                    "embed_identical": embed_same,
                    "args": vars(args),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
