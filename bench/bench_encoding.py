"""Encode throughput of every encoding path against plain ``SentenceTransformer.encode``, side by
side in one process, runs interleaved (issue 34).

Paths (all on the same ``--n-passages`` SciFact test abstracts, ``--threads`` threads, batches
of at most ``--batch-size`` texts):

* ``plain fp32`` -- ``SentenceTransformer.encode(batch_size=B)``: the reference of every ratio;
* ``plain bf16 autocast`` -- the same call under ``torch.autocast("cpu", dtype=torch.bfloat16)``
  (the issue's measurement);
* ``torch/fp32``, ``torch/bf16``, ``torch/bf16 + bf16 weights``, ``onnx/fp32``, ``onnx-int8``
  -- treerank's `SentenceEncoder.encode` (length-bucketed, ``max_batch_size=B``);
* ``auto`` -- ``SentenceEncoder(backend="auto", precision="auto")`` with its probe re-measured
  here (``refresh_probe``); its choice and probe ratio are recorded.

Every repeat runs every path once, the order rotated each repeat; the best wall time of each
path is kept with the process CPU seconds of that run. Printed and written to
``bench/results/embed/encoding_paths.json``: passages/s, ratio to plain fp32 (wall and CPU),
ratio to ``torch/fp32``, min / mean cosine to plain fp32's vectors, and the same min cosine of
each reduced path on two more collections (``--fidelity-n`` SQuAD dev paragraphs and Cranfield
abstracts, the CISI-like short technical texts), plus the CPU's model and flags (``lscpu``),
the load average and the library versions. ``python bench/encoding_table.py`` renders it into
``docs/encoding.md``.

Usage: ``nice -n 10 python bench/bench_encoding.py [--n-passages 320] [--batch-size 32]
[--threads 1] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "embed" / "encoding_paths.json"
DATA = REPO.parent / "shared" / "data"
if not DATA.is_dir():
    DATA = Path(os.environ.get("TREERANK_SHARED_DATA", "/work/shared/data"))
SCIFACT = DATA / "beir-scifact" / "scifact.zip"


def lscpu() -> dict[str, str]:
    """``Model name``, ``Flags`` and thread layout from ``lscpu`` (empty when unavailable)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    keep = ("Model name", "Flags", "CPU(s)", "Thread(s) per core", "Vendor ID")
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keep:
            out[key.strip()] = value.strip()
    return out


def fidelity_texts(n: int) -> dict[str, list[str]]:
    """``n`` texts of each extra collection: SQuAD dev paragraphs and Cranfield abstracts."""
    from treerank.readers.detect import read_split

    out = {}
    for name, path, split in (
        ("squad", DATA / "squad-v1.1" / "squad-v1.1.zip", "dev"),
        ("cranfield", DATA / "cranfield" / "cran.tar.gz", None),
    ):
        if path.exists():
            out[name] = read_split(path, "auto", split).passage_texts[:n]
    return out


def measure(
    n_passages: int = 320,
    batch_size: int = 32,
    threads: int = 1,
    repeats: int = 3,
    fidelity_n: int = 128,
) -> dict[str, Any]:
    """Every encoding path against plain ``encode``, runs interleaved (the module docstring).

    Returns:
        the results document (``rows`` by path: seconds, passages/s, ratio to plain fp32 in wall
        and CPU time, min / mean cosine to plain fp32; ``auto``'s choice; ``cpu``: ``lscpu``'s
        model and flags); ``fidelity_n = 0`` skips the two extra collections.
    """
    import torch

    from treerank.encoders import SentenceEncoder
    from treerank.encoders.precision import FIDELITY_BOUNDS, cosines, library_versions
    from treerank.readers.scifact import read_scifact

    torch.set_num_threads(threads)
    texts = read_scifact(SCIFACT, "test").passage_texts[:n_passages]
    kw = {"threads": threads, "max_batch_size": batch_size, "progress": False}
    encoders: dict[str, Any] = {
        "torch/fp32": SentenceEncoder(**kw),
        "torch/bf16": SentenceEncoder(precision="bf16", **kw),
        "torch/bf16 + bf16 weights": SentenceEncoder(precision="bf16", bf16_weights=True, **kw),
    }
    try:
        encoders["onnx/fp32"] = SentenceEncoder(backend="onnx", **kw)
        encoders["onnx-int8"] = SentenceEncoder(backend="onnx-int8", **kw)
    except ImportError as exc:  # onnxruntime not installed: torch paths only
        print(f"onnx paths skipped: {exc}", file=sys.stderr)
    auto = SentenceEncoder(backend="auto", precision="auto", refresh_probe=True, **kw)
    encoders["auto"] = auto
    st = encoders["torch/fp32"].model

    def plain(bf16: bool) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                v = st.encode(texts, batch_size=batch_size, convert_to_tensor=True)
            v = v.float()
            return torch.nn.functional.normalize(v, dim=1).numpy()

        return run

    runs: dict[str, Callable[[], np.ndarray]] = {
        "plain fp32": plain(False),
        "plain bf16 autocast": plain(True),
        **{name: (lambda e=e: e.encode(texts)) for name, e in encoders.items()},
    }
    precision_of = {"plain fp32": "fp32", "plain bf16 autocast": "bf16"}
    precision_of.update({name: e.precision for name, e in encoders.items()})

    best: dict[str, tuple[float, float]] = {}
    vectors: dict[str, np.ndarray] = {}
    names = list(runs)
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            c0, t0 = time.process_time(), time.perf_counter()
            v = runs[name]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            vectors[name] = v
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)
            print(f"repeat {r}: {name:28s} {wall:7.2f} s", file=sys.stderr, flush=True)

    ref_wall, ref_cpu = best["plain fp32"]
    ref_vec = vectors["plain fp32"]
    extra = fidelity_texts(fidelity_n) if fidelity_n > 0 else {}
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        wall, cpu = best[name]
        cos = cosines(vectors[name], ref_vec)
        row: dict[str, Any] = {
            "precision": precision_of[name],
            "seconds": wall,
            "cpu_seconds": cpu,
            "passages_per_s": len(texts) / wall,
            "ratio": ref_wall / wall,
            "cpu_ratio": ref_cpu / cpu if cpu > 0 else None,
            "ratio_to_torch_fp32": best["torch/fp32"][0] / wall,
            "cosine_to_fp32": {"min": float(cos.min()), "mean": float(cos.mean())},
            "bound": FIDELITY_BOUNDS[precision_of[name]],
        }
        if name in encoders and precision_of[name] != "fp32":
            enc = encoders[name]
            row["cosine_to_fp32_by_collection"] = {
                "scifact": float(cos.min()),
                **{
                    coll: float(cosines(enc.encode(t), enc.encode_reference(t)).min())
                    for coll, t in extra.items()
                },
            }
        rows[name] = row
        print(
            f"{name:28s} {row['passages_per_s']:6.2f} p/s  ratio {row['ratio']:.3f} "
            f"(cpu {row['cpu_ratio'] or 0:.3f}, vs torch/fp32 {row['ratio_to_torch_fp32']:.3f})  "
            f"min cos {row['cosine_to_fp32']['min']:.5f}"
        )
    doc = {
        "dataset": "BEIR SciFact test abstracts (the first N of the corpus)",
        "n_passages": len(texts),
        "batch_size": batch_size,
        "threads": threads,
        "repeats": repeats,
        "fidelity_collections": {k: len(v) for k, v in extra.items()},
        "reference": "plain fp32",
        "rows": rows,
        "auto": auto.auto_choice.to_dict() if auto.auto_choice is not None else None,
        "cpu": lscpu(),
        "load_average": list(os.getloadavg()),
        "versions": library_versions(),
        "measured_unix": time.time(),
    }
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-passages", type=int, default=320)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fidelity-n", type=int, default=128)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    doc = measure(args.n_passages, args.batch_size, args.threads, args.repeats, args.fidelity_n)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from treerank.atomic import atomic_write_json

    atomic_write_json(args.out, doc, indent=1)
    print(f"auto chose {doc['auto']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
