"""The seed's scale, simulated: 1M passages x 3,840 dims through search, training and indexes.

Issue 26 item 4. The seed embeds MS MARCO v2.1 with a 3,840-d encoder (validation ~101K queries
over ~980K passages, 15 GB of passage vectors; train ~808K queries). This bench writes a store of
that shape and measures every stage's wall time and peak RSS, each stage in its own child
process (``os.wait4`` rusage: ``ru_maxrss``, user + system CPU):

* **data**: the shared generator (:mod:`treerank.store.synthetic`, a PPCA mixture) fitted to a
  real 384-d store (SciFact test, all-MiniLM-L6-v2), sampled in 384-d, lifted to 3,840-d by a
  random orthonormal map ``R`` (384 x 3,840, orthonormal rows) plus isotropic Gaussian noise at
  signal-to-noise ratio ``SNR`` (signal power 1, noise power ``1 / SNR`` spread over the 3,840
  dims), then L2-normalised: ``x = normalize(x_384 R + e / sqrt(SNR * 3840))``. Splits:
  ``validation`` (1M passages; ``--eval-queries`` queries written, the 100K of the seed is
  extrapolated), ``train`` (``--train-queries`` queries, the same passage file hard-linked).
  Labels are random (one selected passage per query): the store measures time and memory, not
  retrieval quality (the synthetic queries are not "about" any passage), so no metric here
  means anything and none is reported.
* **exact**: ``kernels.topk.exact_search`` (cosine, top-100, ``backend="auto"``: the faster CPU
  kernel, measured) vs the FAISS reference on the *same* query batch: ``IndexFlatIP`` filled and
  searched chunk by chunk (the whole 15 GB flat index does not fit a 24 GiB machine shared with
  others), so both read the same memory map.
* **train-linear**: a linear head (3,840 -> 256) on the 808K-query train split, ``--train-steps``
  capped, through ``training.heads.train_head`` (rows gathered from the memory map,
  :mod:`treerank.kernels.rows`).
* **eval-linear**: the trained head as a ``DenseSystem`` (its passage tower applied chunk by chunk
  while streaming the 1M passages) on the evaluation queries.
* **ivfpq**, **int8**: ``faiss:ivfpq`` / ``faiss:int8`` systems (build + search) on a smaller query
  batch (they are timed and extrapolated); each index is deleted after its stage.
* **forest**: one TreeRank pair at C = ``--forest-classes`` (1,000) on the whole train split, one
  step per stage, block-wise (``chunk_size``; :func:`stage_forest`); each step's time and the
  peak RSS so far are written as it ends, so a stage stopped at its ``--timeout`` says how far
  it got.

Every stage records the load average at its start and end, and the bytes under ``--root``
after it. A data file of the expected size already under ``--root`` is reused (``--keep`` then a
later run), so stages can run one invocation each, each with its own ``--out`` (merged by
``bench/scale_table.py --merge``, which also generates ``docs/scale.md``). Disk: 15.4 GB
passages + 12.4 GB train queries + one index (the int8 one is 3.9 GB), deleted at the end
unless ``--keep``. One run of every stage::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_scale.py \\
        --root /tmp/treerank-scale --out bench/results/scale/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

DIM = 3840
BASE_DIM = 384
SEED_VALIDATION_QUERIES = 100_000
SEED_COLLECTION = 8_800_000


# -- data -------------------------------------------------------------------------------------
def lift_matrix(seed: int = 0) -> np.ndarray:
    """``float32 (384, 3840)`` with orthonormal rows (``R R^T = I``): norms and inner products of
    lifted 384-d vectors are kept exactly before the noise."""
    rng = np.random.default_rng([seed, 3840])
    q, _ = np.linalg.qr(rng.standard_normal((DIM, BASE_DIM)))
    return np.ascontiguousarray(q.T, dtype=np.float32)


def lift(x: np.ndarray, r: np.ndarray, snr: float, rng: np.random.Generator) -> np.ndarray:
    y = x @ r
    y += rng.standard_normal(y.shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(snr * DIM))
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return y


def write_rows(
    path: Path, mixture: Any, n: int, seed: int, snr: float, chunk: int
) -> tuple[int, int | None]:
    """Write ``n`` lifted rows (float32, 3,840-d) to ``path`` (atomic rename); returns
    ``(count, first)`` of the rows that are not finite (counted as they are written, for the
    store's ``finite`` record). A file of the expected size already there is reused (a resumed
    run): its rows are scanned instead."""
    from treerank.kernels.topk import nonfinite_rows

    if path.exists() and path.stat().st_size == n * DIM * 4:
        return nonfinite_rows(np.memmap(path, np.float32, "r", shape=(n, DIM)))
    r = lift_matrix()
    tmp = path.with_suffix(".tmp")
    bad, first = 0, None
    with open(tmp, "wb") as f:
        for i, s in enumerate(range(0, n, chunk)):
            base = mixture.sample(min(chunk, n - s), seed=[seed, i])
            y = lift(base, r, snr, np.random.default_rng([seed, i, 1]))
            c, f0 = nonfinite_rows(y)
            if c and first is None:
                first = s + int(f0 or 0)
            bad += c
            f.write(y.tobytes())
    tmp.replace(path)
    return bad, first


def write_split(
    dest: Path,
    mixtures: Any,
    n_queries: int,
    n_passages: int,
    seed: int,
    snr: float,
    chunk: int,
    passages_non_finite: tuple[int, int | None] = (0, None),
) -> None:
    from treerank.atomic import atomic_write_json

    dest.mkdir(parents=True, exist_ok=True)
    bad_q, first_q = write_rows(
        dest / "queries.bin", mixtures.queries, n_queries, seed + 1, snr, chunk
    )
    rng = np.random.default_rng([seed, 7])
    cand = rng.integers(0, n_passages, size=(n_queries, 1), dtype=np.int32)
    cand.tofile(dest / "query_indices.bin")
    np.ones((n_queries, 1), np.uint8).tofile(dest / "query_is_selected.bin")
    meta = {
        "format": "treerank-store",
        "format_version": 1,
        "complete": True,
        "split": dest.name,
        "source": "synthetic",
        "dim": DIM,
        "k": 1,
        "n_queries": n_queries,
        "n_passages": n_passages,
        "dtype": "float32",
        "byteorder": "little",
        "index_dtype": "int32",
        "label_dtype": "uint8",
        "normalized": True,
        # the finiteness record (treerank.kernels.topk.finite_record's fields), counted while
        # the rows were written, so readers need not scan the 15 GB file
        "finite": bad_q == 0 and passages_non_finite[0] == 0,
        "non_finite_rows": {"queries": bad_q, "passages": passages_non_finite[0]},
        "first_non_finite_row": {"queries": first_q, "passages": passages_non_finite[1]},
        "relevance_threshold": 1,
        "encoder": {"name": "synthetic-lifted-3840", "fingerprint": f"synthetic-lifted:{snr}"},
        "signature": f"scale-{dest.name}-{n_queries}-{n_passages}-{seed}-{snr}",
        "synthetic": {"lift": "orthonormal 384->3840 + isotropic noise", "snr": snr},
        "created_unix": time.time(),
    }
    atomic_write_json(dest / "meta.json", meta)


def stage_data(a: argparse.Namespace) -> dict[str, Any]:
    from treerank.store import EmbeddingStore
    from treerank.store.format import FORMAT_NAME, FORMAT_VERSION
    from treerank.store.synthetic import fit_store

    mix = fit_store(EmbeddingStore.open(a.fit_store), seed=0)
    val, train = a.root / "validation", a.root / "train"
    val.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bad_p = write_rows(val / "passages.bin", mix.passages, a.passages, 0, a.snr, 16_384)
    t_pass = time.perf_counter() - t0
    write_split(val, mix, a.eval_queries, a.passages, 0, a.snr, 16_384, bad_p)
    t1 = time.perf_counter()
    splits = [val]
    if a.train_queries > 0:  # --train-queries 0: the search stages' store only (no train split)
        train.mkdir(parents=True, exist_ok=True)
        if not (train / "passages.bin").exists():
            os.link(val / "passages.bin", train / "passages.bin")  # one passage file, shared
        write_split(train, mix, a.train_queries, a.passages, 100, a.snr, 16_384, bad_p)
        splits.append(train)
    t_train = time.perf_counter() - t1
    for d in splits:  # the store's own format constants
        m = json.loads((d / "meta.json").read_text())
        m.update(format=FORMAT_NAME, format_version=FORMAT_VERSION)
        (d / "meta.json").write_text(json.dumps(m))
    return {
        "fitted_on": str(a.fit_store),
        "components": mix.passages.n_components,
        "snr": a.snr,
        "passages_seconds": t_pass,
        "train_queries_seconds": t_train,
        "bytes": {
            "passages": (val / "passages.bin").stat().st_size,
            "train_queries": (train / "queries.bin").stat().st_size if a.train_queries else 0,
            "eval_queries": (val / "queries.bin").stat().st_size,
        },
    }


# -- search -----------------------------------------------------------------------------------
def _eval_queries(a: argparse.Namespace, n: int) -> tuple[Any, np.ndarray]:
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(a.root / "validation")
    return store, np.ascontiguousarray(store.queries[:n], dtype=np.float32)


def stage_exact(a: argparse.Namespace) -> dict[str, Any]:
    from treerank.kernels.topk import cpu_search_backend, exact_search

    store, q = _eval_queries(a, a.n_eval)
    backend = cpu_search_backend()
    t0 = time.perf_counter()
    ids, _ = exact_search(q, store.passages, k=100, backend="auto", device="cpu")
    sec = time.perf_counter() - t0
    np.save(a.root / "exact_ids.npy", ids)
    return {"queries": len(q), "seconds": sec, "backend": backend, "qps": len(q) / sec}


def stage_flat_reference(a: argparse.Namespace) -> dict[str, Any]:
    import faiss

    from treerank.kernels.topk import DEFAULT_CHUNK_BYTES, merge_topk, rank_keys, release_pages

    store, q = _eval_queries(a, a.n_eval)
    p = store.passages
    chunk = DEFAULT_CHUNK_BYTES // (4 * DIM)
    keys = np.empty((len(q), 0), np.int64)
    t0 = time.perf_counter()
    for s in range(0, p.shape[0], chunk):
        block = np.ascontiguousarray(p[s : s + chunk], dtype=np.float32)
        index = faiss.IndexFlatIP(DIM)
        index.add(block)
        d, i = index.search(q, 100)
        keys = merge_topk(keys, rank_keys(i.astype(np.int64) + s, d), 100)
        del index, block
        release_pages(p, s, min(s + chunk, p.shape[0]))
    sec = time.perf_counter() - t0
    out: dict[str, Any] = {"queries": len(q), "seconds": sec, "qps": len(q) / sec}
    ref = a.root / "exact_ids.npy"
    if ref.exists():
        from treerank.kernels.topk import decode_keys

        ids, _ = decode_keys(np.sort(keys, axis=1))
        mine = np.load(ref)
        out["same_ids_fraction"] = float((np.sort(ids, 1) == np.sort(mine, 1)).mean())
    return out


def stage_train_linear(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from treerank.models.linear import LinearHead
    from treerank.store import EmbeddingStore
    from treerank.training.heads import train_head

    store = EmbeddingStore.open(a.root / "train")
    cfg = {
        "seed": 0,
        "model": {"out_dim": 256},
        "data": {"batch_size": a.batch_size, "hard_negatives": "none", "n_hard": 0},
        "trainer": {"max_steps": a.train_steps, "epochs": 1, "patience": None, "log_every": 50},
    }
    t0 = time.perf_counter()
    out = train_head(LinearHead, store, cfg, progress=False)
    sec = time.perf_counter() - t0
    torch.save(out.model.state_dict(), a.root / "linear.pt")
    steps = int(out.summary["steps"])
    return {
        "train_queries": int(store.n_queries),
        "steps": steps,
        "batch_size": a.batch_size,
        "seconds": sec,
        "steps_per_second": steps / sec,
        "fit_seconds": out.summary["seconds"],
    }


def stage_eval_linear(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from treerank.models.linear import LinearHead
    from treerank.search.systems import DenseSystem

    head = LinearHead(DIM, out_dim=256)
    head.load_state_dict(torch.load(a.root / "linear.pt"))
    store, _ = _eval_queries(a, 1)
    view = _QueryPrefix(store, a.n_eval)
    t0 = time.perf_counter()
    run = DenseSystem(head, name="linear", backend="auto").retrieve(view, k=100)
    sec = time.perf_counter() - t0
    return {"queries": int(run.ids.shape[0]), "seconds": sec, "qps": run.ids.shape[0] / sec}


class _QueryPrefix:
    """The first ``n`` queries of a store split (everything else passed through)."""

    def __init__(self, store: Any, n: int) -> None:
        self.base, self.n = store, n
        self.queries = store.queries[:n]
        for name in ("candidates", "labels"):  # a training split's judgements, per query
            if hasattr(store, name):
                setattr(self, name, getattr(store, name)[:n])
        self.passages = store.passages
        self.n_passages = store.n_passages
        self.n_queries = n
        self.path = store.path
        self.dim = store.dim

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def _faiss_stage(a: argparse.Namespace, spec: str, n: int) -> dict[str, Any]:
    from treerank.search.specs import build_system

    store, _ = _eval_queries(a, 1)
    view = _QueryPrefix(store, n)
    system = build_system(spec)
    t0 = time.perf_counter()
    build = getattr(system, "index_for", None)
    if callable(build):
        build(store)
    t_build = time.perf_counter() - t0
    t1 = time.perf_counter()
    run = system.retrieve(view, k=100)  # type: ignore[union-attr]
    sec = time.perf_counter() - t1
    index_dir = a.root / "validation" / "indexes"
    index_bytes = (
        sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file())
        if index_dir.exists()
        else None
    )
    shutil.rmtree(index_dir, ignore_errors=True)  # delete as we go: one index on disk at a time
    return {
        "spec": spec,
        "queries": int(run.ids.shape[0]),
        "build_seconds": t_build,
        "seconds": sec,
        "qps": run.ids.shape[0] / sec,
        "index_bytes": index_bytes,
        "bytes_per_passage": index_bytes / store.n_passages if index_bytes else None,
    }


FOREST_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "forest" / "seed_scale.yaml"


def stage_forest(a: argparse.Namespace) -> dict[str, Any]:
    """One forest pair at C = ``--forest-classes`` on the whole 3,840-d train split, one Adam step
    per stage (``configs/forest/seed_scale.yaml`` otherwise: bagging 0.7, a 1,024-passage random
    negative pool, ``chunk_size`` rows per block of every full-batch gradient), with
    ``--forest-random-negatives`` random negatives per query (1, as ``forest_memory.json``'s 384-d
    run: every example's rows are gathered and their logits recomputed, so the seed's 8 cost
    ~4x the examples of 1) and no mined hard negatives (mining is an exact top-8 search of every
    training query over the 1M passages: the ``exact`` stage's cost at 808K queries,
    extrapolated in ``docs/scale.md``)."""
    import resource

    import yaml

    from treerank.forest.data import pair_data, shared_rows
    from treerank.forest.trainer import train_forest
    from treerank.store import EmbeddingStore

    store: Any = EmbeddingStore.open(a.root / "train")
    if 0 < a.forest_queries < store.n_queries:  # the memory model's smaller splits
        store = _QueryPrefix(store, a.forest_queries)
    cfg = yaml.safe_load(FOREST_CONFIG.read_text())
    cfg["model"].update(n_models=1, n_classes=a.forest_classes)
    cfg["data"].update(hard_negatives=0, random_negatives=a.forest_random_negatives)
    steps = a.forest_steps
    cfg["trainer"].update(
        steps_query=steps,
        steps_passage=steps,
        steps_joint=steps,
        chunk_size=a.forest_chunk,
        num_threads=1,
        validate_at=[1],
    )

    def rss(_: Any) -> dict[str, float]:
        return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}

    # Each stage's step timed as it ends and written at once, so that a run stopped at its time
    # limit still says how far it got and at what peak RSS (run_child reads the file).
    import treerank.forest.trainer as forest_module

    blocked_step = forest_module._blocked_step
    steps_done: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    # each step's own peaks of anonymous and file-backed resident memory, sampled every 50 ms
    # (ru_maxrss is the process's peak so far, not the step's)
    current: dict[str, Any] = {"peaks": {}}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, kib in rss_split().items():
                current["peaks"][key] = max(current["peaks"].get(key, 0), kib)
            stop.wait(0.05)

    threading.Thread(target=sample, daemon=True).start()

    def timed_step(sides: Any, stage: str, *args: Any, **kwargs: Any) -> float:
        t = time.perf_counter()
        current["peaks"] = {}
        value = blocked_step(sides, stage, *args, **kwargs)
        steps_done.append(
            {
                "stage": stage,
                "seconds": time.perf_counter() - t,
                "ended_at_seconds": time.perf_counter() - t0,
                **rss(None),
                "step_peak_gib": {k: v / 2**20 for k, v in current["peaks"].items()},
            }
        )
        a.result.with_suffix(".progress.json").write_text(json.dumps(steps_done))
        return value

    forest_module._blocked_step = timed_step  # type: ignore[assignment]
    try:
        out = train_forest(store, cfg, validate=rss, progress=False)
    finally:
        stop.set()
    sec = time.perf_counter() - t0
    pairs = [r for r in out.records if r.get("kind") == "pair"]
    nq = int(out.summary["n_train_queries"])
    rows = len(shared_rows(store, pair_data(store, 0, None)).ids) + int(cfg["data"]["random_pool"])
    return {
        "train_queries": nq,
        "classes": a.forest_classes,
        "pairs": 1,
        "steps_per_stage": steps,
        "chunk_size": a.forest_chunk,
        "config": str(FOREST_CONFIG.relative_to(FOREST_CONFIG.parents[2])),
        "random_negatives": int(cfg["data"]["random_negatives"]),
        "hard_negatives": 0,
        "positive_examples": int(out.summary["n_positive_pairs"]),
        "passage_rows": rows,
        "seconds": sec,
        "pair_seconds": float(pairs[0]["seconds"]),
        "peak_rss_gib_after_pair": float(out.summary["curve"][0]["peak_rss_gib"]),
        "steps": steps_done,
        "dim": int(store.dim),
        # what a trainer holding the (G, n, C) logits of both sides and their gradients whole
        # would need, float32 (from the shapes, not measured)
        "whole_logits_and_gradients_gib": 2
        * 4
        * (nq * a.forest_classes + rows * (a.forest_classes + 1))
        / 2**30,
    }


STAGES = {
    "data": stage_data,
    "exact": stage_exact,
    "flat-reference": stage_flat_reference,
    "train-linear": stage_train_linear,
    "eval-linear": stage_eval_linear,
    "ivfpq": lambda a: _faiss_stage(a, a.ivfpq, a.n_index_eval),
    "int8": lambda a: _faiss_stage(a, "faiss:int8:train_size=20000", a.n_index_eval),
    "forest": stage_forest,
}


RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def rss_split(pid: int | str = "self") -> dict[str, int]:
    """Resident memory of a process by kind, in KiB, from ``/proc/<pid>/status``: ``VmRSS``
    (all), ``RssAnon`` (heap, numpy / torch buffers), ``RssFile`` (file pages mapped into the
    process: a memory map's pages read and not yet released), ``RssShmem``; ``{}`` when the
    file is unreadable (not Linux, or the process ended)."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in RSS_FIELDS:
                out[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def run_child(argv: list[str], timeout: float) -> dict[str, Any]:
    """One stage in a child process: its JSON result plus wall time, peak RSS, CPU seconds, and
    the peaks of its anonymous and file-backed resident memory (``/proc/<pid>/status`` sampled
    every 0.2 s: which kind dominates the peak)."""
    out_file = Path(argv[argv.index("--result") + 1])
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    proc = subprocess.Popen([sys.executable, __file__, *argv])
    deadline = t0 + timeout
    status, ru, killed = 0, None, False
    peaks: dict[str, int] = {}
    at_peak: dict[str, int] = {}  # the kinds when VmRSS was at its sampled peak
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            _, status, ru = os.wait4(proc.pid, 0)
            killed = True
            break
        sample = rss_split(proc.pid)
        for key, kib in sample.items():
            peaks[key] = max(peaks.get(key, 0), kib)
        if sample.get("VmRSS", 0) >= at_peak.get("VmRSS", 0):
            at_peak = sample
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {
        "wall_seconds": wall,
        "peak_rss_gib": ru.ru_maxrss / 2**20,
        # sampled (0.2 s): each kind's own peak, and the split at the sampled VmRSS peak
        "sampled_peak_gib": {k: v / 2**20 for k, v in peaks.items()},
        "at_sampled_peak_gib": {k: v / 2**20 for k, v in at_peak.items()},
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
        "exit": os.waitstatus_to_exitcode(status),
        # the machine's 1/5/15-minute load averages when the stage started and ended (shared
        # machine: the times are lower bounds on an idle one's speed)
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
    }
    if out_file.exists():
        res.update(json.loads(out_file.read_text()))
    elif killed:
        res["error"] = f"stopped at its time limit ({timeout:,.0f} s wall, the session's deadline)"
    else:
        res["error"] = "no result (the stage failed)"
    progress = out_file.with_suffix(".progress.json")
    if progress.exists() and "steps" not in res:  # how far a stopped stage got
        res["steps"] = json.loads(progress.read_text())
    return res


def disk_bytes(root: Path) -> int:
    """Bytes of the files under ``root``, each hard-linked file counted once."""
    seen: dict[int, int] = {}
    for f in root.rglob("*"):
        if f.is_file():
            st = f.stat()
            seen[st.st_ino] = st.st_size
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/treerank-scale"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/scale/results.json"))
    ap.add_argument("--fit-store", type=Path, default=None)
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--eval-queries", type=int, default=2_000)
    ap.add_argument("--train-queries", type=int, default=808_000)
    ap.add_argument("--snr", type=float, default=4.0)
    ap.add_argument("--n-eval", type=int, default=2_000)
    ap.add_argument("--n-index-eval", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--ivfpq", default="faiss:ivfpq:nlist=256,m=48,opq=0,nprobe=16,train_size=20000"
    )
    ap.add_argument("--forest-classes", type=int, default=1000)
    ap.add_argument("--forest-steps", type=int, default=1, help="Adam steps per forest stage")
    ap.add_argument("--forest-chunk", type=int, default=65536, help="forest rows per block")
    ap.add_argument(
        "--forest-queries",
        type=int,
        default=0,
        help="forest: train on the first N training queries only (0: all)",
    )
    ap.add_argument(
        "--forest-random-negatives",
        type=int,
        default=1,
        help="random negatives per query (the seed config's 8 make ~5M examples at 808K queries)",
    )
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="keep the store files")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.stage:  # child
        res = STAGES[a.stage](a)
        a.result.write_text(json.dumps(res))
        return
    if a.fit_store is None:
        root = Path(__file__).resolve().parents[1] / ".cache" / "test-stores"
        a.fit_store = sorted(p for p in root.glob("scifact-*/test") if "slice" not in str(p))[0]
    a.root.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {}
    if a.out.exists():
        doc = json.loads(a.out.read_text())
    doc.setdefault("stages", {})
    doc["settings"] = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(a).items()
        if k not in ("stage", "result")
    }
    doc["machine"] = {"cpus": os.cpu_count(), "threads_env": os.environ.get("OMP_NUM_THREADS")}
    passthrough = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(a).items()
        if k not in ("stage", "result", "stages", "keep", "out") and v is not None
    ]
    for name in a.stages.split(","):
        res_file = a.root / f"result-{name}.json"
        res_file.unlink(missing_ok=True)
        print(f"[scale] stage {name} ...", flush=True)
        res = run_child([*passthrough, "--stage", name, "--result", str(res_file)], a.timeout)
        res["disk_bytes_after"] = disk_bytes(a.root)  # the store (+ what the stage kept)
        print(f"[scale] {name}: {json.dumps(res)}", flush=True)
        doc["stages"][name] = res
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1))
    if not a.keep:
        shutil.rmtree(a.root, ignore_errors=True)
        print(f"[scale] deleted {a.root}", flush=True)


if __name__ == "__main__":
    main()
