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
  batch (they are timed and extrapolated).

Every timed search is extrapolated linearly to 100K queries (exact search cost is linear in the
number of queries for a fixed corpus). ``docs/scale.md`` is generated from the results JSON by
``bench/scale_table.py``. Run (about 30 CPU-minutes, 1 thread; disk: 15.4 GB passages + 12.4 GB
train queries + the int8 index 3.9 GB, deleted at the end unless ``--keep``)::

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


def write_rows(path: Path, mixture: Any, n: int, seed: int, snr: float, chunk: int) -> None:
    r = lift_matrix()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for i, s in enumerate(range(0, n, chunk)):
            base = mixture.sample(min(chunk, n - s), seed=[seed, i])
            f.write(lift(base, r, snr, np.random.default_rng([seed, i, 1])).tobytes())
    tmp.replace(path)


def write_split(
    dest: Path, mixtures: Any, n_queries: int, n_passages: int, seed: int, snr: float, chunk: int
) -> None:
    from treerank.atomic import atomic_write_json

    dest.mkdir(parents=True, exist_ok=True)
    write_rows(dest / "queries.bin", mixtures.queries, n_queries, seed + 1, snr, chunk)
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
    write_rows(val / "passages.bin", mix.passages, a.passages, 0, a.snr, 16_384)
    t_pass = time.perf_counter() - t0
    write_split(val, mix, a.eval_queries, a.passages, 0, a.snr, 16_384)
    train.mkdir(parents=True, exist_ok=True)
    if not (train / "passages.bin").exists():
        os.link(val / "passages.bin", train / "passages.bin")  # one passage file, shared
    t1 = time.perf_counter()
    write_split(train, mix, a.train_queries, a.passages, 100, a.snr, 16_384)
    t_train = time.perf_counter() - t1
    for d in (val, train):  # the store's own format constants
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
            "train_queries": (train / "queries.bin").stat().st_size,
            "eval_queries": (val / "queries.bin").stat().st_size,
        },
    }


# -- search -----------------------------------------------------------------------------------
def _eval_queries(a: argparse.Namespace, n: int) -> tuple[Any, np.ndarray]:
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(a.root / "validation")
    return store, np.ascontiguousarray(store.queries[:n], dtype=np.float32)


def stage_exact(a: argparse.Namespace) -> dict[str, Any]:
    from treerank.kernels.device import cpu_search_backend
    from treerank.kernels.topk import exact_search

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
        self.passages = store.passages
        self.n_passages = store.n_passages
        self.n_queries = n
        self.path = store.path
        self.dim = store.dim

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def _faiss_stage(a: argparse.Namespace, spec: str, n: int) -> dict[str, Any]:
    from treerank.search.systems import build_system

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
    return {
        "spec": spec,
        "queries": int(run.ids.shape[0]),
        "build_seconds": t_build,
        "seconds": sec,
        "qps": run.ids.shape[0] / sec,
        "index_bytes": sum(
            f.stat().st_size for f in (a.root / "validation" / "indexes").rglob("*") if f.is_file()
        )
        if (a.root / "validation" / "indexes").exists()
        else None,
    }


STAGES = {
    "data": stage_data,
    "exact": stage_exact,
    "flat-reference": stage_flat_reference,
    "train-linear": stage_train_linear,
    "eval-linear": stage_eval_linear,
    "ivfpq": lambda a: _faiss_stage(a, a.ivfpq, a.n_index_eval),
    "int8": lambda a: _faiss_stage(a, "faiss:int8:train_size=20000", a.n_index_eval),
}


def run_child(argv: list[str], timeout: float) -> dict[str, Any]:
    """One stage in a child process: its JSON result plus wall time, peak RSS, CPU seconds."""
    out_file = Path(argv[argv.index("--result") + 1])
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *argv])
    deadline = t0 + timeout
    status, ru = 0, None
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            _, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {
        "wall_seconds": wall,
        "peak_rss_gib": ru.ru_maxrss / 2**20,
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
        "exit": os.waitstatus_to_exitcode(status),
    }
    if out_file.exists():
        res.update(json.loads(out_file.read_text()))
    else:
        res["error"] = "no result (timed out or failed)"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/treerank-scale"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/scale/results.json"))
    ap.add_argument("--fit-store", type=Path, default=None)
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--eval-queries", type=int, default=2_000)
    ap.add_argument("--train-queries", type=int, default=808_000)
    ap.add_argument("--snr", type=float, default=4.0)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--n-index-eval", type=int, default=40)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--ivfpq", default="faiss:ivfpq:nlist=256,m=48,opq=0,nprobe=16,train_size=20000"
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
        print(f"[scale] {name}: {json.dumps(res)}", flush=True)
        doc["stages"][name] = res
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1))
    if not a.keep:
        shutil.rmtree(a.root, ignore_errors=True)
        print(f"[scale] deleted {a.root}", flush=True)


if __name__ == "__main__":
    main()
