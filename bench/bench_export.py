"""The sentence-transformers export on the full SciFact test split: metrics of the exported
directory against those of the treerank checkpoint it came from, and the encode time of both
paths (the exported model encodes the texts; treerank reads the store's vectors).

In ONE run: train a linear and an MLP head on the SciFact train store (the shipped configs,
``configs/heads/*.yaml``, seed 0), export each with ``export_sentence_transformers``, then on
every passage (5,183) and query (300) of the test split

1. ``ckpt:<dir>``: exact search with the head's towers over the stored vectors;
2. the exported model: ``encode_query`` / ``encode_document`` of the texts, exact search;

and write ``results.json`` (metrics of both, their largest difference, the largest vector
difference per tower, seconds) and ``table.md`` under ``--out``.

Usage (niced; the machine is shared)::

    OMP_NUM_THREADS=1 nice -n 10 python bench/bench_export.py \
        --store .cache/test-stores/scifact-d8a75753-b38c5fc0-9ebeefb9b4f7 \
        --work /tmp/bench-export --out bench/results/export
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from treerank.evaluation.settings import EvaluationSettings

METRICS = ("mrr@10", "ndcg@10", "recall@100")


class _Fixed:
    """A system that returns a run computed beforehand (the exported model's search)."""

    def __init__(self, run) -> None:
        self.run, self.name = run, run.name

    def retrieve(self, store, k: int = 1000):
        return self.run.truncate(min(k, self.run.k))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, required=True, help="store root with train/ and test/")
    ap.add_argument("--work", type=Path, required=True, help="models and exports go here")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--families", nargs="+", default=["linear", "mlp"])
    args = ap.parse_args()

    from sentence_transformers import SentenceTransformer

    from treerank.config import load_yaml
    from treerank.evaluation.compare import compare_systems
    from treerank.kernels.topk import exact_search
    from treerank.models.export_st import export_sentence_transformers
    from treerank.models.registry import load_model
    from treerank.search.run import Run
    from treerank.store import EmbeddingStore
    from treerank.tasks.train import train_model

    train, test = (EmbeddingStore.open(args.store / s) for s in ("train", "test"))
    rows = []
    for fam in args.families:
        model_dir = args.work / fam
        if not (model_dir / "weights.safetensors").is_file():
            cfg = load_yaml(Path(__file__).resolve().parents[1] / "configs/heads" / f"{fam}.yaml")
            train_model(fam, train, cfg, model_dir, progress=False)
        st_dir = args.work / f"{fam}-st"
        export_sentence_transformers(model_dir, st_dir, overwrite=True)
        model = SentenceTransformer(str(st_dir), device="cpu")
        head = load_model(model_dir, test.encoder_fingerprint)
        cached = args.work / f"{fam}-st-vectors.npz"  # the slow part, kept across runs
        if cached.is_file():
            z = np.load(cached)
            q, p, encode_s = z["q"], z["p"], float(z["seconds"])
        else:
            t0 = time.perf_counter()
            q = model.encode_query(test.query_texts(), convert_to_numpy=True)
            p = model.encode_document(test.passage_texts(), convert_to_numpy=True, batch_size=64)
            encode_s = time.perf_counter() - t0
            np.savez(cached, q=q, p=p, seconds=encode_s)
        ids, scores = exact_search(q, p, k=100)
        comp = compare_systems(
            test,
            {"ckpt": f"ckpt:{model_dir}", "exported": _Fixed(Run("exported", ids, scores))},
            settings=EvaluationSettings(
                baseline="ckpt", k=100, metrics=METRICS, n_permutations=1000
            ),
        )
        if comp.failed:
            raise RuntimeError(f"systems failed: {comp.failed}")
        a, b = comp.results["ckpt"].mean, comp.results["exported"].mean
        rows.append(
            {
                "family": fam,
                "ckpt": {m: a[m] for m in METRICS},
                "exported": {m: b[m] for m in METRICS},
                "max_metric_diff": max(abs(a[m] - b[m]) for m in METRICS),
                "max_query_vector_diff": float(
                    np.abs(q - head.encode_queries(np.asarray(test.queries))).max()
                ),
                "max_passage_vector_diff": float(
                    np.abs(p - head.encode_passages(np.asarray(test.passages))).max()
                ),
                "exported_encode_seconds": encode_s,
                "n_queries": test.n_queries,
                "n_passages": test.n_passages,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        write(rows, args.out)  # after each family: a long run keeps what it measured


def write(rows: list[dict], out: Path) -> None:
    """``results.json`` and ``table.md`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"rows": rows}, indent=2))
    lines = [
        "| family | "
        + " | ".join(f"{m} ckpt / exported" for m in METRICS)
        + " | max metric diff | max vector diff (q, p) |",
        "|---" * (len(METRICS) + 3) + "|",
    ]
    for r in rows:
        cells = [f"{r['ckpt'][m]:.4f} / {r['exported'][m]:.4f}" for m in METRICS]
        lines.append(
            f"| {r['family']} | " + " | ".join(cells) + f" | {r['max_metric_diff']:.1e} | "
            f"{r['max_query_vector_diff']:.1e}, {r['max_passage_vector_diff']:.1e} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
