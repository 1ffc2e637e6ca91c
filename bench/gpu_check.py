"""The device check: CPU-vs-GPU agreement and throughput of every stage, in one short run.

Run by ``scripts/gpu_check.sh`` (``PYTHONPATH=src``, no install, no network, any torch 2.x;
every input is generated here: no FAISS, bm25s or bundled model is needed). Parts:

1. **embed**: a tiny random BERT (``transformers.BertConfig``: 4 layers, 256 wide) encodes random
   token batches with mean pooling + L2 normalisation; fp32 on the GPU vs fp32 on the CPU (max
   abs difference), and fp16 on the GPU (cosine to the CPU fp32 vector, every vector >= 0.999).
   Skipped (said so) when ``transformers`` is not importable.
2. **exact search**: ``kernels.topk.exact_search`` on 20K x 384 passages, 1,000 queries, top-100:
   the same ids on both devices except where the two scores differ by < 1e-5; MRR@10 and
   Recall@100 against random qrels within 1e-4.
3. **head epoch**: one epoch of a linear head (``training.heads.train_head``) on a generated
   labelled store; the weights of the two devices within 1e-4.
4. **forest pair**: one forest pair (``forest.trainer.train_forest``, 2 models in one group)
   on both devices, weights within 1e-3; then the forest's counting: the same class tables of a
   random forest counted by the CPU kernel (numba; the torch kernel on the CPU where numba is
   not importable) and by the torch kernel on the GPU, with identical ids, counts and secondary
   scores; the GPU's own classification is reported as its agreement with the CPU's classes.
5. **throughput**: GPU/CPU ratios of parts 1-4, measured in this run.

Without CUDA the CPU halves run and every GPU half is reported as ``skipped (no CUDA)``; the
exit status is 0 when every check that ran passed, 1 otherwise. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treerank.kernels.device import Device, parse_device

SKIP_NO_CUDA = "skipped (no CUDA)"
GDEV = Device("cuda")
"""The device of the "GPU" halves (``--gpu-device cpu`` runs them on the CPU: a self-test of
this script, whose comparisons must then be exact)."""
CPU = Device("cpu")
"""The reference halves' device."""


def _timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


# -- 1. embed ---------------------------------------------------------------------------------
def check_embed(cuda: bool, quick: bool) -> dict[str, Any]:
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        return {"status": "skipped (transformers not importable)"}
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=2000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=128,
    )
    model = BertModel(cfg).eval()
    n, seq = (128, 64) if quick else (512, 64)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (n, seq), generator=g)
    lengths = torch.randint(8, seq + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()

    def encode(m: Any, dev: str, dtype: torch.dtype) -> tuple[np.ndarray, float]:
        m = m.to(dev, dtype=dtype)
        out = []
        with torch.no_grad():
            t0 = time.perf_counter()
            for s in range(0, n, 64):
                i, a = ids[s : s + 64].to(dev), mask[s : s + 64].to(dev)
                h = m(input_ids=i, attention_mask=a).last_hidden_state.float()
                e = (h * a[..., None]).sum(1) / a.sum(1, keepdim=True)
                out.append(torch.nn.functional.normalize(e, dim=-1).cpu())
            if dev != "cpu":
                torch.cuda.synchronize()
            sec = time.perf_counter() - t0
        return torch.cat(out).numpy(), sec

    ref, t_cpu = encode(model, "cpu", torch.float32)
    res: dict[str, Any] = {"vectors": n, "cpu_seconds": t_cpu, "cpu_per_second": n / t_cpu}
    if not cuda:
        res["status"] = SKIP_NO_CUDA
        return res
    encode(model, GDEV, torch.float32)  # warm-up
    g32, t32 = encode(model, GDEV, torch.float32)
    g16, t16 = encode(model, GDEV, torch.float16 if GDEV != "cpu" else torch.bfloat16)
    cos16 = (g16 * ref).sum(1)
    res.update(
        fp32_max_abs_diff=float(np.abs(g32 - ref).max()),
        fp16_min_cosine=float(cos16.min()),
        gpu_fp32_seconds=t32,
        gpu_fp16_seconds=t16,
        ratio_fp32=t_cpu / t32,
        ratio_fp16=t_cpu / t16,
    )
    res["half_dtype"] = "float16" if GDEV != "cpu" else "bfloat16 (CPU self-test)"
    ok = res["fp32_max_abs_diff"] < 1e-4 and res["fp16_min_cosine"] >= (
        0.999 if GDEV != "cpu" else 0.99
    )
    res["status"] = "ok" if ok else "FAILED"
    return res


# -- 2. exact search --------------------------------------------------------------------------
def _metrics(ids: np.ndarray, rel: np.ndarray) -> dict[str, float]:
    hit = ids == rel[:, None]
    first = np.where(hit.any(1), hit.argmax(1), -1)
    mrr = np.where((first >= 0) & (first < 10), 1.0 / (first + 1), 0.0)
    return {"mrr@10": float(mrr.mean()), "recall@100": float(hit[:, :100].any(1).mean())}


def check_search(cuda: bool, quick: bool) -> dict[str, Any]:
    from treerank.kernels.topk import exact_search

    rng = np.random.default_rng(0)
    n, nq, d, k = (20_000, 500, 384, 100) if quick else (100_000, 1_000, 384, 100)
    p = rng.standard_normal((n, d), dtype=np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    q = 0.3 * p[rng.integers(0, n, nq)] + rng.standard_normal((nq, d), dtype=np.float32) / 20
    q = np.ascontiguousarray(q / np.linalg.norm(q, axis=1, keepdims=True), dtype=np.float32)
    (c_ids, c_vals), t_cpu = _timed(exact_search, q, p, k=k, backend="torch", device=CPU)
    rel = c_ids[np.arange(nq), rng.integers(0, 20, nq)]  # a relevant passage in the top 20
    res: dict[str, Any] = {
        "shape": f"{nq} x {n} x {d}, k={k}",
        "cpu_seconds": t_cpu,
        "cpu_qps": nq / t_cpu,
        "cpu_metrics": _metrics(c_ids, rel),
    }
    if not cuda:
        res["status"] = SKIP_NO_CUDA
        return res
    exact_search(q[:8], p, k=k, device=GDEV)  # warm-up
    (g_ids, g_vals), t_gpu = _timed(exact_search, q, p, k=k, backend="torch", device=GDEV)
    differ = g_ids != c_ids
    gap = np.abs(g_vals - c_vals)
    gm = _metrics(g_ids, rel)
    res.update(
        gpu_seconds=t_gpu,
        gpu_qps=nq / t_gpu,
        ratio=t_cpu / t_gpu,
        ids_differ=int(differ.sum()),
        max_score_gap_where_ids_differ=float(gap[differ].max()) if differ.any() else 0.0,
        max_score_diff=float(gap.max()),
        gpu_metrics=gm,
        max_metric_diff=max(abs(gm[m] - res["cpu_metrics"][m]) for m in gm),
    )
    # extrapolation: the seed's 100K x 1M x 3,840 (cost linear in nq * n * d)
    res["seed_scale_seconds_extrapolated"] = t_gpu * (100_000 * 1_000_000 * 3840) / (nq * n * d)
    ok = res["max_score_gap_where_ids_differ"] < 1e-5 and res["max_metric_diff"] <= 1e-4
    res["status"] = "ok" if ok else "FAILED"
    return res


# -- 3. head epoch ----------------------------------------------------------------------------
class _Store:
    """A generated labelled store (the attributes the trainers read)."""

    def __init__(self, nq: int, n: int, d: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        p = rng.standard_normal((n, d)).astype(np.float32)
        p /= np.linalg.norm(p, axis=1, keepdims=True)
        gold = rng.integers(0, n, nq)
        rot, _ = np.linalg.qr(rng.standard_normal((d, d)))
        q = p[gold] @ rot.T.astype(np.float32) + 0.5 * rng.standard_normal((nq, d)) / np.sqrt(d)
        self.queries = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
        self.passages = p
        self.candidates = np.stack([gold, rng.integers(0, n, nq)], 1).astype(np.int32)
        self.labels = np.array([[1, 0]] * nq, dtype=np.uint8)
        self.relevance_threshold = 1
        self.path = Path("generated")
        self.dim, self.n_queries, self.n_passages = d, nq, n
        self.encoder_name = self.encoder_fingerprint = "generated"
        self.meta: dict[str, object] = {}
        self.has_texts = False  # the Texts protocol's flag: no texts, so no text checks

    def has_array(self, name: str) -> bool:
        return False

    def load_array(self, name: str) -> None:
        return None


def check_head(cuda: bool, quick: bool) -> dict[str, Any]:
    from treerank.models.linear import LinearHead
    from treerank.training.heads import train_head

    store = _Store(*((2_000, 5_000, 128) if quick else (8_000, 20_000, 384)))
    cfg = {"seed": 0, "data": {"batch_size": 128}, "trainer": {"epochs": 1, "patience": None}}
    cpu, t_cpu = _timed(train_head, LinearHead, store, cfg, progress=False, device=CPU)
    res: dict[str, Any] = {"steps": int(cpu.summary["steps"]), "cpu_seconds": t_cpu}
    if not cuda:
        res["status"] = SKIP_NO_CUDA
        return res
    gpu, t_gpu = _timed(train_head, LinearHead, store, cfg, progress=False, device=GDEV)
    a, b = cpu.model.state_dict(), gpu.model.state_dict()
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    res.update(gpu_seconds=t_gpu, ratio=t_cpu / t_gpu, max_weight_diff=diff)
    res["status"] = "ok" if diff < 1e-4 else "FAILED"
    return res


# -- 4. forest pair ---------------------------------------------------------------------------
FOREST_WEIGHT_ATOL = 1e-3
"""Largest |w_gpu - w_cpu| of the trained pair (``tests/training/test_forest_device.py``)."""


def _forest_cpu_count(index: Any, qc: np.ndarray, qp: np.ndarray, k: int) -> tuple[Any, str]:
    """The CPU reference count: the numba kernel where numba imports, else the torch kernel on
    the CPU (which equals it bit for bit, ``tests/search/test_forest_torch_kernel.py``)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return index.search(qc, qp, k, device=CPU, backend="torch"), "torch (no numba)"
    return index.search(qc, qp, k, device=CPU, backend="numba"), "numba"


def check_forest(cuda: bool, quick: bool) -> dict[str, Any]:
    """Train one forest pair (2 models, one group) on both devices, then count: a random forest
    classifies the passages and queries once on the CPU and the same class tables are counted
    by the CPU kernel and on the GPU (identical ids, counts and secondary scores required);
    the GPU's own classification is reported as its agreement with the CPU's classes."""
    from treerank.forest.index import ForestIndex
    from treerank.forest.model import Forest, ForestConfig
    from treerank.forest.trainer import train_forest

    store = _Store(600, 2_000, 64)
    cfg = {
        "model": {"n_models": 2, "n_classes": 4},
        "trainer": {"group_size": 2, "steps_query": 10, "steps_passage": 10, "steps_joint": 5},
        "data": {"hard_negatives": 0},  # mining is exact search (part 2), and needs no FAISS
    }
    train_forest(store, cfg, progress=False, device=CPU)  # warm-up (imports, first calls)
    cpu, t_cpu = _timed(train_forest, store, cfg, progress=False, device=CPU)
    n, nq, m, c, k = (3_000, 100, 16, 8, 100) if quick else (50_000, 1_000, 64, 32, 100)
    rng = np.random.default_rng(3)
    passages = rng.standard_normal((n, 64), dtype=np.float32)
    queries = rng.standard_normal((nq, 64), dtype=np.float32)
    forest = Forest.random(ForestConfig(n_models=m, n_classes=c, dim=64), seed=3)
    pc, pp = forest.passage_classes(passages)
    qc, qp = forest.query_classes(queries)
    index = ForestIndex.build(pc, pp, c)
    _forest_cpu_count(index, qc[:4], qp[:4], k)  # warm-up (numba compiles or loads its cache)
    (ref, kernel), t_count_cpu = _timed(_forest_cpu_count, index, qc, qp, k)
    res: dict[str, Any] = {
        "train": "2 models x 4 classes, 600 queries x 2,000 passages x 64",
        "count": f"{nq} queries x {n} passages, M={m}, C={c}, k={k}",
        "cpu_kernel": kernel,
        "cpu_seconds": t_cpu,
        "cpu_count_seconds": t_count_cpu,
    }
    if not cuda:
        res["status"] = SKIP_NO_CUDA
        return res
    gpu, t_gpu = _timed(train_forest, store, cfg, progress=False, device=GDEV)
    a, b = cpu.model.state_dict(), gpu.model.state_dict()
    diff = max(float((a[key] - b[key]).abs().max()) for key in a)
    index.search(qc[:4], qp[:4], k, device=GDEV, backend="torch")  # warm-up
    got, t_count_gpu = _timed(index.search, qc, qp, k, device=GDEV, backend="torch")
    g_qc, _ = forest.query_classes(queries, device=GDEV)
    g_pc, _ = forest.passage_classes(passages, device=GDEV)
    res.update(
        gpu_seconds=t_gpu,
        ratio=t_cpu / t_gpu,
        max_weight_diff=diff,
        gpu_count_seconds=t_count_gpu,
        count_ratio=t_count_cpu / t_count_gpu,
        ids_differ=int((got.ids != ref.ids).sum()),
        counts_differ=int((got.counts != ref.counts).sum()),
        secondary_differ=int((got.secondary != ref.secondary).sum()),
        query_class_agreement=float((g_qc == qc).mean()),
        passage_class_agreement=float((g_pc == pc).mean()),
    )
    exact = res["ids_differ"] == res["counts_differ"] == res["secondary_differ"] == 0
    res["status"] = "ok" if exact and diff <= FOREST_WEIGHT_ATOL else "FAILED"
    return res


CHECKS = {"embed": check_embed, "search": check_search, "head": check_head, "forest": check_forest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="treerank device check (CPU vs GPU)")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CPU-only CI)")
    ap.add_argument("--only", default=",".join(CHECKS), help="comma-separated parts")
    ap.add_argument("--gpu-device", default="cuda", help="cpu: self-test of this script")
    a = ap.parse_args(argv)
    global GDEV
    GDEV = parse_device(a.gpu_device, check=False)
    cuda = torch.cuda.is_available() or GDEV.kind == "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    doc: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_device": str(GDEV),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "quick": a.quick,
        "checks": {},
    }
    if not cuda:
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False): running the CPU")
        print("gpu_check: halves only; every GPU part below is SKIPPED, nothing was compared.")
    for name in a.only.split(","):
        t0 = time.perf_counter()
        try:
            res = CHECKS[name](cuda, a.quick)
        except Exception as exc:
            res = {"status": f"FAILED: {type(exc).__name__}: {exc}"}
        res["wall_seconds"] = time.perf_counter() - t0
        doc["checks"][name] = res
        print(f"gpu_check: {name}: {res['status']} ({res['wall_seconds']:.1f} s)", flush=True)
    keys = (
        "status",
        "cpu_seconds",
        "gpu_seconds",
        "ratio",
        "ratio_fp16",
        "count_ratio",
        "ids_differ",
    )
    print("\n| part | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, res in doc["checks"].items():
        cells = [
            f"{res[k]:.4g}" if isinstance(res.get(k), float) else str(res.get(k, "")) for k in keys
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    failed = [n for n, r in doc["checks"].items() if str(r["status"]).startswith("FAILED")]
    doc["failed"] = failed
    doc["gpu_parts"] = "ran" if cuda else "skipped: no CUDA device"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"\ngpu_check: wrote {a.out}; {'FAILED: ' + ', '.join(failed) if failed else 'all ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
