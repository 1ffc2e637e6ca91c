"""Benchmark `treerank embed` against plain `SentenceTransformer.encode` on SciFact passages.

Printed, all measured in the same run on the same machine:

* throughput ratio = plain ``encode`` seconds / ``embed_split`` seconds on the same N SciFact
  passages (target >= 0.95; ``embed_split`` includes tokenising for lengths and writing the
  store). The two are interleaved ``--repeats`` times and the best time of each is kept, which
  damps the noise of a shared CPU;
* padding ratio of ``embed_split``'s batches (target <= 20%) and of plain ``encode``'s (which
  sorts by character length and cuts fixed-size batches);
* achieved fp32 GFLOP/s of the encoder (matmul FLOPs of the transformer counted from the model
  config over the padded tokens) and the fraction of this machine's fp32 matmul peak, measured
  here with ``torch.mm`` on 1024 x 1024 matrices, best of samples taken before, between and
  after the timed runs (on a shared CPU a single sample can read low);
* peak RSS of a fresh process embedding N1 and N2 passages, beside the growth of the text
  tables (the store is written through memory maps, so RSS may only grow with the texts).

Usage: ``python bench/bench_embed.py [--n-passages 1000] [--memory-sizes 200,800]``.
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
SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact" / "scifact.zip"
if not SCIFACT.is_file():
    SCIFACT = REPO / "data" / "samples" / "scifact" / "scifact.zip"


def scifact_passages(n: int) -> list[str]:
    from treerank.readers.scifact import read_scifact

    return read_scifact(SCIFACT, "test").passage_texts[:n]


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


def child_memory(n: int, out: str) -> None:
    """Embed n passages into out and print peak RSS (MiB) as JSON (run in a fresh process)."""
    from treerank.encoders import SentenceEncoder
    from treerank.store import embed_split

    texts = scifact_passages(n)
    enc = SentenceEncoder()
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    embed_split(passage_only_split(texts), enc, out, progress=False, reuse=False)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    text_mib = sum(len(t.encode()) for t in texts) / 2**20
    print(
        json.dumps(
            {"n": n, "peak_rss_mib": rss, "rss_after_load_mib": rss_loaded, "text_mib": text_mib}
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-passages", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32, help="plain encode batch size")
    ap.add_argument("--memory-sizes", default="200,800")
    ap.add_argument("--child", nargs=2, metavar=("N", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_memory(int(args.child[0]), args.child[1])
        return

    from treerank.encoders import SentenceEncoder
    from treerank.store import embed_split

    texts = scifact_passages(args.n_passages)
    enc = SentenceEncoder()
    model = enc.model
    model.encode(texts[:16], batch_size=16)  # warm-up
    enc.encode_batch(texts[:16])
    t_ref, t_ours, stats = float("inf"), float("inf"), None
    # the CPU is shared: sample the matmul peak between the timed runs and keep the best
    peak = matmul_peak_gflops()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            peak = max(peak, matmul_peak_gflops())
            t0 = time.perf_counter()
            ref = model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)
            t_ref = min(t_ref, time.perf_counter() - t0)
            t0 = time.perf_counter()
            stats = embed_split(
                passage_only_split(texts), enc, Path(tmp) / f"s{r}", progress=False, reuse=False
            )
            t_ours = min(t_ours, time.perf_counter() - t0)
        peak = max(peak, matmul_peak_gflops())
        from treerank.store import EmbeddingStore

        ours = np.asarray(EmbeddingStore.open(Path(tmp) / "s0").passages)
    assert stats is not None
    cos = (ours * ref).sum(1)

    # plain encode's padding: it sorts by character length, cuts batches of batch_size
    lengths = enc.token_lengths(texts)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    ref_batches = [order[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    ref_padded = sum(len(b) * int(lengths[b].max()) for b in ref_batches)
    ref_padding = 1 - lengths.sum() / ref_padded

    our_batches = enc.plan(lengths)
    flops = encoder_flops(model, [(len(b), int(lengths[b].max())) for b in our_batches])
    achieved = flops / t_ours / 1e9

    print(
        f"passages: {len(texts):,} SciFact (title + text), model {enc.name}, "
        f"torch threads {__import__('torch').get_num_threads()}"
    )
    print(
        f"plain SentenceTransformer.encode (batch {args.batch_size}): {t_ref:8.2f} s  "
        f"{len(texts) / t_ref:7.1f} passages/s  padding {ref_padding:.1%}"
    )
    print(
        f"treerank embed_split (budget {enc.token_budget}):        {t_ours:8.2f} s  "
        f"{len(texts) / t_ours:7.1f} passages/s  padding {stats.padding_ratio:.1%}"
    )
    print(f"throughput ratio (treerank / plain): {t_ref / t_ours:.3f}   (target >= 0.95)")
    print(f"min cosine treerank vs plain encode: {cos.min():.6f}")
    print(
        f"encoder fp32 matmul work: {flops / 1e9:.1f} GFLOP -> {achieved:.1f} GFLOP/s; "
        f"torch.mm peak {peak:.1f} GFLOP/s -> {achieved / peak:.1%} of peak"
    )

    rows = []
    for n in [int(x) for x in args.memory_sizes.split(",") if x]:
        with tempfile.TemporaryDirectory() as tmp:
            out = (
                subprocess.run(
                    [sys.executable, __file__, "--child", str(n), str(Path(tmp) / "m")],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
        rows.append(json.loads(out))
    for r in rows:
        print(
            f"peak RSS embedding {r['n']:>6,} passages: {r['peak_rss_mib']:7.1f} MiB "
            f"(after model load {r['rss_after_load_mib']:.1f} MiB; texts {r['text_mib']:.2f} MiB)"
        )
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        print(
            f"RSS growth {a['n']:,} -> {b['n']:,} passages: "
            f"{b['peak_rss_mib'] - a['peak_rss_mib']:+.1f} MiB for "
            f"{b['text_mib'] - a['text_mib']:+.2f} MiB more text"
        )


if __name__ == "__main__":
    main()
