"""Training throughput of the thin heads: optimiser steps per second at B = 256, 1 hard negative,
384-d vectors (MiniLM's size), on this machine's CPU.

Reference measured in the same run: one step of the bare InfoNCE computation on a fixed
``(256, 512)`` score matrix (matmul + cross-entropy + backward, no model, no sampling), so the
printed ratios say how much the sampler, towers and optimiser cost on top of the loss itself.

Run: ``nice python bench/bench_train.py [--steps 50] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from treerank.models.linear import LinearHead
from treerank.models.mlp import MLPHead
from treerank.training.losses import info_nce
from treerank.training.sampler import ContrastiveSampler
from treerank.training.trainer import TrainerConfig, fit


def synthetic(nq: int, npas: int, dim: int, seed: int = 0):
    """Random unit vectors; each query has one positive and 10 grade-0 candidates."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nq, dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    p = rng.standard_normal((npas, dim)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    cand = rng.integers(0, npas, size=(nq, 11)).astype(np.int32)
    lab = np.zeros_like(cand, dtype=np.uint8)
    lab[:, 0] = 1
    return q, p, cand, lab


def bench_loss_only(b: int, m: int, dim: int, steps: int) -> float:
    torch.manual_seed(0)
    q = torch.randn(b, dim, requires_grad=True)
    p = torch.randn(m, dim, requires_grad=True)
    pos = torch.zeros(b, m, dtype=torch.bool)
    pos[torch.arange(b), torch.arange(b)] = True
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = info_nce(q @ p.T, pos, None, 0.05)
        loss.backward()
    return steps / (time.perf_counter() - t0)


def bench_head(head: torch.nn.Module, b: int, dim: int, steps: int) -> float:
    q, p, cand, lab = synthetic(20 * b, 100_000, dim)
    sampler = ContrastiveSampler(
        cand, lab, batch_size=b, n_hard=1, hard_pool=np.where(lab == 0, cand, -1).astype(np.int64)
    )
    cfg = TrainerConfig(epochs=10**6, max_steps=steps, log_every=10**9, patience=None)
    fit(head, sampler, q, p, TrainerConfig(epochs=1, max_steps=3, patience=None), progress=False)
    t0 = time.perf_counter()
    res = fit(head, sampler, q, p, cfg, progress=False)
    return res.steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ref = bench_loss_only(a.batch, 2 * a.batch, a.dim, a.steps)
    print(f"B={a.batch} H=1 d={a.dim} threads={a.threads} steps={a.steps}")
    print(f"{'reference: bare InfoNCE fwd+bwd':40s} {ref:8.1f} steps/s  1.00x")
    for name, head in [
        ("linear (separate towers)", LinearHead(a.dim)),
        ("linear (shared tower)", LinearHead(a.dim, shared=True)),
        ("mlp (separate towers, hidden=d)", MLPHead(a.dim)),
    ]:
        sps = bench_head(head, a.batch, a.dim, a.steps)
        print(f"{name:40s} {sps:8.1f} steps/s  {sps / ref:.2f}x of reference")


if __name__ == "__main__":
    main()
