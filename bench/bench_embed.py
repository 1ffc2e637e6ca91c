"""Benchmark `treerank embed` with each encoder backend against plain `SentenceTransformer.encode`.

Printed and written to ``bench/results/embed/backends.json``, all measured in the same run on
the same machine, every backend with the same thread count (``--threads``, torch's and ONNX
Runtime's):

* throughput ratio = plain ``encode`` seconds / ``embed_split`` seconds on the same N SciFact
  passages, for each backend (``torch``, ``onnx``, ``onnx-int8``; targets: torch >= 0.95, onnx
  >= 1.0, onnx-int8 >= 1.4). ``embed_split`` includes tokenising for lengths and writing the
  store. Plain encode and the backends are interleaved ``--repeats`` times (the order rotated
  each repeat) and the best time of each is kept, which damps the noise of a shared CPU; the
  process CPU seconds of that best run are recorded beside it;
* cosine of each backend's vectors to plain ``encode``'s (min, mean);
* padding ratio of ``embed_split``'s batches (target <= 20%) and of plain ``encode``'s (which
  sorts by character length and cuts fixed-size batches);
* achieved fp32 GFLOP/s of the encoder (matmul FLOPs of the transformer counted from the model
  config over the padded tokens) and the fraction of this machine's fp32 matmul peak, measured
  here with ``torch.mm`` on 1024 x 1024 matrices, best of samples taken before, between and
  after the timed runs (on a shared CPU a single sample can read low);
* peak RSS of a fresh process per backend embedding ``--memory-size`` passages (model, ONNX
  session and texts included);
* ``serve`` latency of one query per backend: an in-process `SearchService` (cosine over the
  N-passage store of that backend) answering ``--serve-queries`` SciFact queries one at a time,
  interleaved across backends; p50 and p90 in milliseconds (tokenising, encoding, search).

Usage: ``nice -n 10 python bench/bench_embed.py [--n-passages 500] [--threads 2]``; then
``python bench/encoding_table.py`` regenerates the table in ``docs/encoding.md``.
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "embed" / "backends.json"
BACKENDS = ("torch", "onnx", "onnx-int8")
SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact" / "scifact.zip"
if not SCIFACT.is_file():
    SCIFACT = REPO / "data" / "samples" / "scifact" / "scifact.zip"


def scifact_passages(n: int) -> list[str]:
    from treerank.readers.scifact import read_scifact

    return read_scifact(SCIFACT, "test").passage_texts[:n]


def scifact_queries(n: int) -> list[str]:
    from treerank.readers.scifact import read_scifact

    return read_scifact(SCIFACT, "test").query_texts[:n]


def passage_only_split(texts: list[str]):
    from treerank.readers.split import RetrievalSplit

    return RetrievalSplit(
        name="bench",
        source="scifact",
        query_ids=[],
        query_texts=[],
        passage_ids=[str(i) for i in range(len(texts))],
        passage_texts=texts,
        candidates=np.zeros((0, 1), dtype=np.int32),
        labels=np.zeros((0, 1), dtype=np.uint8),
    )


def matmul_peak_gflops(n: int = 1024, repeats: int = 10) -> float:
    """Best fp32 ``torch.mm`` GFLOP/s on ``n x n`` matrices (2 n^3 FLOPs per product)."""
    import torch

    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def encoder_flops(model, batches_tokens: list[tuple[int, int]]) -> float:
    """Matmul FLOPs of a BERT-style encoder over batches of (rows, padded length).

    Per layer and token: projections Q, K, V, O (4 d^2) and the FFN (2 d d_ff) multiply-adds,
    plus attention scores and weighted values (2 L d) over the padded length L; x2 for FLOPs.
    """
    cfg = model[0].auto_model.config
    d, dff, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    total = 0.0
    for rows, length in batches_tokens:
        tokens = rows * length
        total += layers * 2 * tokens * (4 * d * d + 2 * d * dff + 2 * length * d)
    return total


def _vm_hwm_mib() -> float:
    """Peak resident set of this process (``VmHWM``, MiB). Unlike ``ru_maxrss``, which a child
    started with fork + exec inherits from its (large) parent, it starts afresh at exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_memory(n: int, out: str, backend: str, threads: int) -> None:
    """Embed n passages into out with ``backend`` and print peak RSS (MiB) as JSON (run in a
    fresh process; the ONNX export is already cached by the parent)."""
    from treerank.encoders import SentenceEncoder
    from treerank.store import embed_split

    texts = scifact_passages(n)
    enc = SentenceEncoder(backend=backend, threads=threads)
    rss_loaded = _vm_hwm_mib()
    embed_split(passage_only_split(texts), enc, out, progress=False, reuse=False)
    rss = _vm_hwm_mib()
    text_mib = sum(len(t.encode()) for t in texts) / 2**20
    print(
        json.dumps(
            {
                "backend": backend,
                "rss_method": "VmHWM",
                "n": n,
                "peak_rss_mib": rss,
                "rss_after_load_mib": rss_loaded,
                "text_mib": text_mib,
            }
        )
    )


def _timed(fn):
    """``(result, wall seconds, process CPU seconds)`` of ``fn()``."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def serve_latency(stores: dict[str, Path], encoders: dict, queries: list[str]) -> dict:
    """p50 / p90 ms of one-query searches through `SearchService`, backends interleaved."""
    from treerank.serve.service import SearchService, ServiceConfig

    services = {
        b: SearchService(ServiceConfig(store=stores[b], systems=("cosine",)), encoder=encoders[b])
        for b in stores
    }
    times: dict[str, list[float]] = {b: [] for b in services}
    for q in queries:
        for b, svc in services.items():
            t0 = time.perf_counter()
            svc.search([q], k=10)
            times[b].append((time.perf_counter() - t0) * 1e3)
    return {
        b: {
            "p50_ms": float(np.percentile(t, 50)),
            "p90_ms": float(np.percentile(t, 90)),
            "n_queries": len(t),
        }
        for b, t in times.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-passages", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="threads of every backend")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--batch-size", type=int, default=32, help="plain encode batch size")
    ap.add_argument("--memory-size", type=int, default=300, help="passages per RSS child")
    ap.add_argument("--serve-queries", type=int, default=30)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--child", nargs=4, metavar=("N", "OUT", "BACKEND", "T"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        child_memory(int(args.child[0]), args.child[1], args.child[2], int(args.child[3]))
        return

    import torch

    from treerank.encoders import SentenceEncoder
    from treerank.store import EmbeddingStore, embed_split

    torch.set_num_threads(args.threads)
    backends = [b for b in args.backends.split(",") if b]
    texts = scifact_passages(args.n_passages)
    encoders = {b: SentenceEncoder(backend=b, threads=args.threads) for b in backends}
    plain_model = SentenceEncoder(threads=args.threads).model  # its own copy: nothing shared
    plain_model.encode(texts[:16], batch_size=16)  # warm-up
    for enc in encoders.values():
        enc.encode_batch(texts[:16])
    split = passage_only_split(texts)
    names = ["plain", *backends]
    best: dict[str, tuple[float, float]] = {n: (float("inf"), 0.0) for n in names}
    stats: dict[str, object] = {}
    peak = matmul_peak_gflops()
    ref = None
    with tempfile.TemporaryDirectory() as tmp:
        stores = {b: Path(tmp) / b for b in backends}
        for r in range(args.repeats):
            peak = max(peak, matmul_peak_gflops())
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                if n == "plain":
                    out, wall, cpu = _timed(
                        lambda: plain_model.encode(
                            texts, batch_size=args.batch_size, normalize_embeddings=True
                        )
                    )
                    ref = out
                else:
                    dest = stores[n] if r == 0 else Path(tmp) / f"{n}-{r}"
                    out, wall, cpu = _timed(
                        lambda n=n, dest=dest: embed_split(
                            split, encoders[n], dest, progress=False, reuse=False
                        )
                    )
                    stats[n] = out
                if wall < best[n][0]:
                    best[n] = (wall, cpu)
        peak = max(peak, matmul_peak_gflops())
        assert ref is not None
        cos = {}
        for b in backends:
            v = np.asarray(EmbeddingStore.open(stores[b]).passages)
            c = (v * ref).sum(1)
            cos[b] = {"min": float(c.min()), "mean": float(c.mean())}
        serve = serve_latency(stores, encoders, scifact_queries(args.serve_queries))

    # plain encode's padding: it sorts by character length, cuts batches of batch_size
    torch_enc = next(iter(encoders.values()))
    lengths = torch_enc.token_lengths(texts)
    order_ = np.argsort([-len(t) for t in texts], kind="stable")
    ref_batches = [order_[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    ref_padded = sum(len(b) * int(lengths[b].max()) for b in ref_batches)
    ref_padding = 1 - lengths.sum() / ref_padded
    our_batches = torch_enc.plan(lengths)
    flops = encoder_flops(plain_model, [(len(b), int(lengths[b].max())) for b in our_batches])

    memory = []
    for b in backends:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, __file__, "--child", str(args.memory_size), str(Path(tmp) / "m")]
            cmd += [b, str(args.threads)]
            line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            memory.append(json.loads(line.strip().splitlines()[-1]))

    t_ref = best["plain"][0]
    rows = {
        "plain": {
            "seconds": t_ref,
            "cpu_seconds": best["plain"][1],
            "passages_per_s": len(texts) / t_ref,
            "padding": float(ref_padding),
            "ratio": 1.0,
        }
    }
    for b in backends:
        t = best[b][0]
        st = stats[b]
        rows[b] = {
            "seconds": t,
            "cpu_seconds": best[b][1],
            "passages_per_s": len(texts) / t,
            "padding": float(st.padding_ratio),  # type: ignore[attr-defined]
            "ratio": t_ref / t,
            "cpu_ratio": best["plain"][1] / best[b][1] if best[b][1] else None,
            "cosine_to_plain": cos[b],
            "peak_rss_mib": next(m["peak_rss_mib"] for m in memory if m["backend"] == b),
            "serve_p50_ms": serve[b]["p50_ms"],
            "serve_p90_ms": serve[b]["p90_ms"],
            "gflops_per_s": flops / t / 1e9,
        }
    import onnxruntime

    doc = {
        "dataset": "BEIR SciFact test passages (title + text), first N",
        "n_passages": len(texts),
        "model": torch_enc.name,
        "threads": args.threads,
        "repeats": args.repeats,
        "plain_batch_size": args.batch_size,
        "token_budget": torch_enc.token_budget,
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "matmul_peak_gflops": peak,
        "encoder_gflop": flops / 1e9,
        "memory_passages": args.memory_size,
        "serve_queries": args.serve_queries,
        "load_average": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "targets": {"torch": 0.95, "onnx": 1.0, "onnx-int8": 1.4},
        "rows": rows,
        "memory": memory,
        "created_unix": time.time(),
    }
    from treerank.atomic import atomic_write_json

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, doc)

    print(
        f"passages: {len(texts):,} SciFact, model {torch_enc.name}, threads {args.threads}, "
        f"best of {args.repeats}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for n, row in rows.items():
        extra = (
            ""
            if n == "plain"
            else f"  cos min {row['cosine_to_plain']['min']:.4f}  RSS {row['peak_rss_mib']:.0f} "
            f"MiB  serve p50 {row['serve_p50_ms']:.1f} ms"
        )
        print(
            f"{n:>10}: {row['seconds']:7.2f} s {row['passages_per_s']:6.1f} p/s  ratio "
            f"{row['ratio']:.3f}  padding {row['padding']:.1%}{extra}"
        )
    print(f"torch.mm peak {peak:.1f} GFLOP/s; wrote {args.out}")


if __name__ == "__main__":
    main()
