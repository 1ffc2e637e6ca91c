"""The encoder fine-tune in 1 process x 2 threads against torchrun 2 processes x 1 thread.

Both arms train the same ``biencoder`` plan (``--steps`` steps of ``--batch`` SciFact training
claims, one BM25-free seeded hard negative column, passages truncated at ``--passage-tokens``)
with :func:`treerank.training.finetune.finetune`:

* **single**: one process, ``trainer.threads: 2``;
* **ddp**: ``torchrun --nproc_per_node=2`` (gloo), ``trainer.threads: 1``: each planned batch is
  split over the two processes and every process's rows are the negatives of all
  (:class:`treerank.training.finetune_losses.CrossRankLoss`), so both arms train on the same
  batches (with dropout off their losses agree to float rounding:
  ``tests/distributed/test_finetune.py``; here the encoder's dropout is on, so the arms agree
  in distribution, not bit for bit).

The arms run interleaved, ``--rounds`` times each, as whole processes; printed per arm: the
best wall time of the process, the training's own wall seconds (``finetune.json``: model
loading included, process start-up not) and the loss of the last step, then
``single / ddp`` (> 1: the two processes are faster). The CPU's model and flags go into the
JSON. This machine's cores may be shared with other work: read the ratio as this run's.

Run: ``nice python bench/bench_finetune_ddp.py [--steps 6] [--out x.json]``.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_distributed import _scifact  # noqa: E402 (the bench folder is not a package)


def _config(args: argparse.Namespace, threads: int) -> dict:
    return {
        "family": "biencoder",
        "seed": 3,
        "model": {"max_query_length": 32, "max_passage_length": args.passage_tokens},
        "data": {"batch_size": args.batch, "hard_negatives": "mined", "n_hard": 1},
        "trainer": {
            "max_steps": args.steps,
            "save_steps": args.steps,
            "logging_steps": 1,
            "threads": threads,
        },
        "validation": {"fraction": 0},
    }


def worker(store: str, out: str, config: str) -> None:
    """One arm (under torchrun or not): the fine-tune of ``config`` (a JSON file)."""
    import numpy as np

    from treerank.distributed.context import launch
    from treerank.store import EmbeddingStore
    from treerank.training.finetune import finetune
    from treerank.training.finetune_config import parse_finetune_config

    st = EmbeddingStore.open(store)
    cfg = parse_finetune_config(json.loads(Path(config).read_text()))
    rng = np.random.default_rng(7)  # seeded hard negatives (the plan, not BM25, is timed)
    mined = rng.integers(0, st.n_passages, size=(st.n_queries, 10)).astype(np.int64)
    with launch():
        finetune(st, cfg, out, mined=mined)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(arm: str, store: Path, out: Path, config: Path) -> dict:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TREERANK_DIST_BACKEND": "gloo",
        "OMP_NUM_THREADS": "2" if arm == "single" else "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    me = [str(Path(__file__).resolve()), "--worker", str(store), str(out), str(config)]
    if arm == "single":
        cmd = [sys.executable, *me]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--nnodes=1",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            *me,
        ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{arm} failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "finetune.json").read_text())["summary"]
    return {
        "process_wall_s": round(wall, 2),
        "train_wall_s": s["cost"]["wall_seconds"],
        "rank0_cpu_s": s["cost"]["cpu_seconds"],
        "last_loss": s["log"][-1]["loss"] if s["log"] else None,
        "world_size": s["world_size"],
    }


def render(doc: dict) -> str:
    """The Markdown table of ``doc`` (``single / ddp``: > 1 means the two processes are faster)."""
    st = doc["settings"]
    cpu = doc["cpu"].get("Model name", "?")
    load = doc.get("load_average") or [float("nan")]
    lines = [
        f"biencoder, {st['steps']} steps of batch {st['batch']} (query 32 + passage "
        f"{st['passage_tokens']} tokens, 1 hard negative), fp32, {cpu}; "
        f"`python bench/bench_finetune_ddp.py --steps {st['steps']}`, {doc['when']} "
        f"(1-min load average {load[0]:.1f} at the end).",
        "",
        "| arm | process wall s | training wall s | rank 0 CPU-s | last loss |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"single": "1 process x 2 threads", "ddp": "torchrun 2 processes x 1 thread"}
    for arm in ("single", "ddp"):
        b = doc["best"][arm]
        lines.append(
            f"| {names[arm]} | {b['process_wall_s']:.1f} | {b['train_wall_s']:.1f} | "
            f"{b['rank0_cpu_s']:.1f} | {b['last_loss']:.4f} |"
        )
    r = doc["single_over_ddp"]
    lines += [
        "",
        f"single / ddp: {r['process_wall']:.2f}x process wall, "
        f"{r['train_wall']:.2f}x training wall.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--passage-tokens", type=int, default=128)
    ap.add_argument("--claims", type=int, default=200, help="SciFact training claims")
    ap.add_argument("--abstracts", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", nargs=3, metavar=("STORE", "OUT", "CONFIG"), default=None)
    args = ap.parse_args()
    if args.worker is not None:
        worker(*args.worker)
        return
    from bench_encoding import lscpu
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import embed_split

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        split = read_split(_scifact(), "scifact", "train", args.claims, args.abstracts)
        embed_split(split, SentenceEncoder(progress=False), root / "train", progress=False)
        configs = {}
        for arm, threads in (("single", 2), ("ddp", 1)):
            configs[arm] = root / f"{arm}.json"
            configs[arm].write_text(json.dumps(_config(args, threads)))
        runs: dict[str, list[dict]] = {"single": [], "ddp": []}
        for r in range(args.rounds):
            for arm in ("single", "ddp"):
                out = root / f"{arm}-{r}"
                runs[arm].append(_run(arm, root / "train", out, configs[arm]))
                print(f"round {r} {arm}: {runs[arm][-1]}", flush=True)
    best = {a: min(rs, key=lambda x: x["process_wall_s"]) for a, rs in runs.items()}
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": lscpu(),
        "load_average": os.getloadavg(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "worker")},
        "runs": runs,
        "best": best,
        "single_over_ddp": {
            "process_wall": round(
                best["single"]["process_wall_s"] / best["ddp"]["process_wall_s"], 3
            ),
            "train_wall": round(best["single"]["train_wall_s"] / best["ddp"]["train_wall_s"], 3),
        },
    }
    print(render(result))
    if args.out is not None:
        from treerank.atomic import atomic_write_json, atomic_write_text

        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out, result, indent=1)
        atomic_write_text(args.out.with_suffix(".md"), render(result) + "\n")


if __name__ == "__main__":
    main()
