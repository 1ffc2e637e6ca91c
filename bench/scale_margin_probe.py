"""How many queries of the seed-scale store lack exact search's margin (``docs/scale.md``).

``kernels.topk.exact_search`` keeps the BLAS top ``kk = preselect_depth(k, n)`` per query and
rescores them exactly; a query whose BLAS scores at rank ``k`` and rank ``kk`` differ by no more
than the error bound (``4 * dot_error_bound(d) * |q| * max |p|``) is rescored over *every*
passage instead. This probe computes, for the first ``N`` evaluation queries of a
``bench_scale.py`` store (float32 BLAS scores, top 1,000, chunk by chunk), how many lack the
margin at ``kk`` and at deeper preselections. One thread.

    .venv/bin/python bench/scale_margin_probe.py 50 [--root /tmp/scale-run]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from treerank.kernels.topk import dot_error_bound, preselect_depth, release_pages
from treerank.store import EmbeddingStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("queries", type=int)
    ap.add_argument("--root", type=Path, default=Path("/tmp/scale-run"))
    ap.add_argument("--k", type=int, default=100)
    a = ap.parse_args()
    torch.set_num_threads(1)
    store = EmbeddingStore.open(a.root / "validation")
    q = torch.from_numpy(np.array(store.queries[: a.queries], dtype=np.float32))
    p = store.passages
    n, depth, chunk = int(p.shape[0]), 1000, 32768
    best = torch.full((a.queries, 0), -1e9)
    p_norm = 0.0
    t0 = time.perf_counter()
    for s in range(0, n, chunk):
        block = torch.from_numpy(np.array(p[s : s + chunk], dtype=np.float32))
        p_norm = max(p_norm, float(block.norm(dim=1).max()))
        both = torch.cat([best, q @ block.T], 1)
        best = both.topk(min(depth, both.shape[1]), dim=1).values
        release_pages(p, s, min(s + chunk, n))
    k, kk = a.k, preselect_depth(a.k, n)
    bound = 4 * dot_error_bound(q.shape[1]) * q.norm(dim=1).numpy() * p_norm
    v = best.numpy()
    out = {
        "queries": a.queries,
        "kk": kk,
        "bound_median": float(np.median(bound)),
        "gap_k_kk_median": float(np.median(v[:, k - 1] - v[:, kk - 1])),
        "bad_at_kk": int((v[:, k - 1] - v[:, kk - 1] <= bound).sum()),
        **{
            f"bad_at_{d}": int((v[:, k - 1] - v[:, d - 1] <= bound).sum()) for d in (200, 400, 1000)
        },
        "score_at_k_median": float(np.median(v[:, k - 1])),
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
