"""``negatives: all`` vs in-batch: training steps/s and peak memory of the full-corpus softmax.

Setting: a linear head (384 -> 384, MiniLM's size), B = 256 queries per step, 20,000 passages
(SQuAD's corpus size), random unit vectors; or, with ``--store <split>``, a real store's vectors
and labels (SQuAD train: 20,958 paragraphs, its questions and their labelled paragraph, the
hard negative a random passage). Measured in the same run, each setting in a fresh
subprocess (so its peak resident memory is its own):

* ``batch``: in-batch + 1 hard negative (today's default);
* ``all/<chunk>``: the exact softmax over all 20,000 passages, chunked (``chunk_size``);
  ``all/20000`` is one chunk, i.e. the unchunked cost.

Printed: steps/s, its ratio to ``batch``, and the peak RSS growth over the process's baseline
(after data and model are built) -- the full-corpus loss's extra memory should follow the chunk,
not the corpus.

Run: ``nice python bench/bench_full_corpus.py [--steps 20] [--passages 20000] [--store DIR]
[--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(
    setting: str, steps: int, n_passages: int, threads: int, store: str | None = None
) -> dict[str, float]:
    import numpy as np
    import torch

    from treerank.models.linear import LinearHead
    from treerank.training.sampler import ContrastiveSampler
    from treerank.training.trainer import compute_loss

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    d, nq = 384, 4096
    if store is not None:
        from treerank.store import EmbeddingStore

        st = EmbeddingStore.open(store)
        rows = np.sort(rng.choice(st.n_queries, nq, replace=False))
        p = np.asarray(st.passages, dtype=np.float32)
        q = np.asarray(st.queries[rows], dtype=np.float32)
        n_passages, d = p.shape
        pos = np.asarray(st.candidates[rows])[:, 0]
        cand = np.stack([pos, rng.choice(n_passages, nq)], 1).astype(np.int32)
    else:
        p = rng.standard_normal((n_passages, d)).astype(np.float32)
        p /= np.linalg.norm(p, axis=1, keepdims=True)
        q = rng.standard_normal((nq, d)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        cand = np.stack([rng.choice(n_passages, nq), rng.choice(n_passages, nq)], 1)
        cand = cand.astype(np.int32)
    lab = np.stack([np.ones(nq), np.zeros(nq)], 1).astype(np.uint8)
    sampler = ContrastiveSampler(
        cand, lab, batch_size=256, n_hard=1, hard_pool=cand[:, 1:].astype(np.int64)
    )
    head = LinearHead(d)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3)
    all_p = torch.from_numpy(p)
    chunk = int(setting.split("/")[1]) if setting.startswith("all") else 0
    batches = list(sampler.epoch(0))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    for i in range(steps):
        b = batches[i % len(batches)]
        qt, pt = torch.from_numpy(q[b.query_rows]), torch.from_numpy(p[b.passage_rows])
        loss, _ = compute_loss(head, b, qt, pt, 0.0, all_p if chunk else None, chunk or 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sec = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"steps_per_s": steps / sec, "peak_growth_mib": (peak - base) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--passages", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--store", default=None, help="a store split to take vectors from")
    ap.add_argument("--chunks", default="1024,4096", help="chunk sizes besides one chunk")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.steps, a.passages, a.threads, a.store)))
        return
    n = a.passages
    if a.store is not None:
        from treerank.store import EmbeddingStore

        n = EmbeddingStore.open(a.store).n_passages
    settings = ["batch", *(f"all/{c}" for c in a.chunks.split(",")), f"all/{n}"]
    res = {}
    for s in settings:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                s,
                "--steps",
                str(a.steps),
                "--passages",
                str(a.passages),
                "--threads",
                str(a.threads),
                *(["--store", a.store] if a.store else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        res[s] = json.loads(out.stdout.strip().splitlines()[-1])
    ref = res["batch"]["steps_per_s"]
    src = a.store or "random unit vectors"
    print(f"{n} passages ({src}), B = 256, d = 384, {a.steps} steps, {a.threads} thread(s)")
    print(f"{'setting':>12} {'steps/s':>9} {'x batch':>8} {'peak RSS growth MiB':>20}")
    for s, r in res.items():
        print(
            f"{s:>12} {r['steps_per_s']:9.2f} {r['steps_per_s'] / ref:8.3f} "
            f"{r['peak_growth_mib']:20.1f}"
        )
    if a.json:
        meta = {"passages": n, "source": src, "batch_size": 256, "dim": 384, "steps": a.steps}
        with open(a.json, "w") as f:
            json.dump({"setup": meta, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
