"""SciFact test nDCG@10 of a reduced-precision encoding path against the fp32 (torch) store.

``--path onnx-int8`` (default) or ``--path bf16`` (the torch backend under bf16 autocast).
Embeds BEIR SciFact's test split (300 queries, 5,183 passages) with that path once (cached
under ``--work``), ranks it with exact cosine search, and compares with the fp32 store of the
same split (the cached test store ``.cache/test-stores/scifact-*/test``, or one embedded here
with the torch backend when absent). Also reports the per-vector cosine of every int8 passage
and query vector to its fp32 counterpart. Target: nDCG@10 within 0.005 of fp32.

Writes ``bench/results/embed/scifact_int8_ndcg.json``. Not a CI test (minutes of CPU).

Usage: ``nice -n 10 python bench/bench_onnx_ndcg.py [--threads 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact" / "scifact.zip"
if not SCIFACT.is_file():
    SCIFACT = REPO / "data" / "samples" / "scifact" / "scifact.zip"
OUT = REPO / "bench" / "results" / "embed" / "scifact_int8_ndcg.json"
PATHS = {  # --path: (store name, encoder keywords, results file, cosine key, target)
    "onnx-int8": ("onnx-int8", {"backend": "onnx-int8"}, OUT, "int8", 0.005),
    "bf16": (
        "torch-bf16",
        {"precision": "bf16"},
        OUT.with_name("scifact_bf16_ndcg.json"),
        "bf16",
        0.001,
    ),
}


def fp32_store(work: Path, split, threads: int):
    from treerank.encoders import SentenceEncoder
    from treerank.store import EmbeddingStore, embed_split

    for cand in sorted((REPO / ".cache" / "test-stores").glob("scifact-*/test/meta.json")):
        meta = json.loads(cand.read_text())
        if meta.get("n_passages") == split.n_passages and meta.get("n_queries") == split.n_queries:
            return EmbeddingStore.open(cand.parent)
    out = work / "fp32" / "test"
    embed_split(split, SentenceEncoder(threads=threads), out, resume=True, reuse=False)
    return EmbeddingStore.open(out)


def partial(work: Path) -> None:
    """Cosine of the int8 rows already written (non-zero rows of the pre-sized vector files)
    to the fp32 store's; written with ``"complete": false`` and no nDCG."""
    from treerank.readers.scifact import read_scifact

    split = read_scifact(SCIFACT, "test")
    ref = fp32_store(work, split, 1)
    out = work / "onnx-int8" / "test"
    progress = json.loads((out / "progress.json").read_text())
    cos = {}
    for kind, name, n in (
        ("passages", "passages.bin", split.n_passages),
        ("queries", "queries.bin", split.n_queries),
    ):
        v = np.fromfile(out / name, dtype="<f4").reshape(n, ref.dim)
        done = np.linalg.norm(v, axis=1) > 0
        c = (v[done] * np.asarray(getattr(ref, kind))[done]).sum(1)
        cos[kind] = {
            "n": int(done.sum()),
            "of": n,
            "min": float(c.min()),
            "mean": float(c.mean()),
            "p01": float(np.quantile(c, 0.01)),
            "below_0.99": int((c < 0.99).sum()),
        }
    doc = {
        "dataset": "BEIR SciFact test",
        "complete": False,
        "note": "int8 embed not finished: no nDCG; cosines over the rows written so far "
        "(the longest passages first, as the batch plan orders them)",
        "n_queries": split.n_queries,
        "n_passages": split.n_passages,
        "cosine_int8_vs_fp32": cos,
        "int8_embed": {
            "passage_batches_done": progress["passage_batches_done"],
            "passage_seconds": progress["stats"]["passage_seconds"],
        },
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    from treerank.atomic import atomic_write_json

    atomic_write_json(OUT, doc)
    print(json.dumps(doc, indent=1))


def _cpu() -> dict[str, object]:
    """The CPU's model name and whether it has AMX (the bf16 kernels differ with it)."""
    import subprocess

    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name:")),
        "unknown",
    )
    flags = next((ln.split(":", 1)[1] for ln in out.splitlines() if ln.startswith("Flags:")), "")
    simd = [f for f in flags.split() if f.startswith(("avx", "amx"))]
    return {"model": model, "amx": "amx_bf16" in out, "flags": " ".join(simd)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-onnx")
    ap.add_argument(
        "--partial",
        action="store_true",
        help="do not embed: report the cosines of the int8 vectors written so far by a running "
        "(or interrupted) embed into --work (nDCG needs the finished store)",
    )
    ap.add_argument("--path", choices=sorted(PATHS), default="onnx-int8")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default: the path's, per CPU: "
        "name another for a second machine, e.g. scifact_bf16_ndcg_amx.json)",
    )
    args = ap.parse_args()
    if args.partial:
        partial(args.work)
        return

    from treerank.encoders import SentenceEncoder
    from treerank.metrics.metrics import evaluate_run
    from treerank.metrics.qrels import Qrels
    from treerank.readers.scifact import read_scifact
    from treerank.search.specs import build_system
    from treerank.store import EmbeddingStore, embed_split

    split = read_scifact(SCIFACT, "test")
    ref = fp32_store(args.work, split, args.threads)
    label, enc_kw, out_file, cos_label, target = PATHS[args.path]
    out_file = args.out or out_file
    out = args.work / label / "test"
    enc = SentenceEncoder(threads=args.threads, **enc_kw)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    stats = embed_split(split, enc, out, resume=True, reuse=False, progress=False)
    wall = time.perf_counter() - t0
    int8 = EmbeddingStore.open(out)  # the reduced-precision store (int8 or bf16)
    assert int8.meta["data_sha256"] == ref.meta["data_sha256"], "different SciFact test data"

    res = {}
    for name, store in (("fp32", ref), (label, int8)):
        run = build_system("cosine").retrieve(store, 10)
        ev = evaluate_run(run, Qrels.from_store(store), ["ndcg@10", "recall@10"])
        res[name] = {
            "ndcg@10": ev.mean["ndcg@10"],
            "recall@10": ev.mean["recall@10"],
            "per_query_ndcg@10": ev.per_query["ndcg@10"],
            "backend": store.meta["encoder"].get("backend", "torch"),
            "store": str(store.path.relative_to(REPO) if store.path.is_relative_to(REPO) else ""),
        }
    pq = np.asarray(res[label].pop("per_query_ndcg@10")) - np.asarray(
        res["fp32"].pop("per_query_ndcg@10")
    )
    cos = {
        kind: (np.asarray(getattr(int8, kind)) * np.asarray(getattr(ref, kind))).sum(1)
        for kind in ("passages", "queries")
    }
    doc = {
        "dataset": "BEIR SciFact test",
        "complete": True,
        "cpu": _cpu(),
        "n_queries": int8.n_queries,
        "n_passages": int8.n_passages,
        "threads": args.threads,
        "system": "cosine (exact)",
        "results": res,
        "ndcg@10_delta": res[label]["ndcg@10"] - res["fp32"]["ndcg@10"],
        "target_abs_delta": target,
        "queries_changed_ndcg": int((np.abs(pq) > 1e-12).sum()),
        f"cosine_{cos_label}_vs_fp32": {
            k: {
                "min": float(v.min()),
                "mean": float(v.mean()),
                "p01": float(np.quantile(v, 0.01)),
                "below_0.99": int((v < 0.99).sum()),
            }
            for k, v in cos.items()
        },
        f"{cos_label}_embed": {
            "passages_per_s": (stats.n_passages / stats.passage_seconds)
            if stats.passage_seconds
            else None,
            "wall_s": wall,
            "quantization": int8.meta["encoder"]["quantization"],
            "fidelity": int8.meta["encoder"].get("fidelity"),
        },
    }
    out_file.parent.mkdir(parents=True, exist_ok=True)
    from treerank.atomic import atomic_write_json

    atomic_write_json(out_file, doc)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
