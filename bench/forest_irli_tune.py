"""Choose the IRLI setting for SQuAD on held-out *training* articles, never on dev (issue 27).

SQuAD dev's articles are unseen in training, so its paragraphs are exactly the ones no training
question cites. This script imitates that inside the training split: the training paragraphs in
every tenth block of ``--block`` consecutive passage rows (the store keeps an article's
paragraphs together, so a block is mostly whole articles) are held out with all their
questions; IRLI re-partitions from the random twin on the other questions
(:func:`treerank.forest.repartition.repartition`), and the held-out questions are
searched over **all** passages of the store (the held-out paragraphs are indexed by their own
vectors, as dev's are). Each setting of ``SETTINGS`` against the random twin (same seed, M, C,
scoring), nDCG@10 and Recall@100, t = 1. The rule fixed before the run: the setting with the
best held-out nDCG@10 under the ``shipped`` scoring trains the SQuAD forest of
``docs/results/forest_twins_squad`` (``bench/bench_forest_twins.py``'s IRLI variant of the same
name).

Writes ``results.json`` and ``table.md`` under ``--out``. Run (niced, one thread)::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 nice -n 10 python bench/forest_irli_tune.py \\
        --train /work/stores/squad/train --out docs/results/forest_irli_tune_squad
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treerank.forest.index import ForestIndex
from treerank.forest.model import Forest, ForestConfig, ForestSearch
from treerank.forest.repartition import repartition
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels

METRICS = ["ndcg@10", "recall@100"]
SETTINGS: dict[str, dict[str, Any]] = {
    # rounds x steps of configs/forest/scifact_irli.yaml; full batch, then cheaper variants
    "irli": {"rounds": 3, "steps": 20},
    "irli-sample0.25": {"rounds": 3, "steps": 20, "sample": 0.25},
    "irli-sample0.25-passage1": {"rounds": 3, "steps": 20, "sample": 0.25, "passage_weight": 1.0},
    "irli-sample0.25-passage4": {"rounds": 3, "steps": 20, "sample": 0.25, "passage_weight": 4.0},
}


def holdout_split(
    cand: np.ndarray, lab: np.ndarray, threshold: int, n_rows: int, block: int, every: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """``(held-out query mask bool (nq,), held-out passage mask bool (n_rows,))``: passages in
    every ``every``-th block of ``block`` rows are held out, and so is every query with a
    relevant passage among them (padding ``-1`` ignored)."""
    held_p = (np.arange(n_rows) // block) % every == 0
    rel = (cand >= 0) & (lab >= threshold)
    held_q = (rel & held_p[np.where(cand >= 0, cand, 0)]).any(1)
    return held_q, held_p


def per_query(
    forest: Forest, queries: np.ndarray, qrels: Qrels, table: tuple[np.ndarray, np.ndarray]
) -> dict[str, np.ndarray]:
    """Per-query metrics of ``forest``'s search over the index of ``table`` (its first M)."""
    m = forest.n_models
    index = ForestIndex.build(table[0][:, :m], table[1][:, :m], forest.n_classes)
    sc = forest.search
    if sc.probe == 1 and sc.scoring == "shipped":
        hits = index.search(*forest.query_classes(queries), 100)
    else:
        qc, qp, fl = forest.query_top(queries, sc.probe)
        hits = index.search_probes(qc, qp, fl, 100, sc.scoring)
    res = evaluate_run(hits.ids, qrels, METRICS).per_query
    return {k: np.asarray(v) for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", type=int, default=16)
    ap.add_argument("--classes", type=int, default=32)
    ap.add_argument("--block", type=int, default=200)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--scorings", nargs="+", default=["shipped", "count", "soft"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    from treerank.store import EmbeddingStore

    st = EmbeddingStore.open(args.train)
    q = np.asarray(st.queries, dtype=np.float32)
    p = np.asarray(st.passages, dtype=np.float32)
    cand, lab = np.asarray(st.candidates), np.asarray(st.labels)
    thr = int(st.relevance_threshold)
    held_q, held_p = holdout_split(cand, lab, thr, len(p), args.block)
    train_rows = np.flatnonzero(~held_q)
    rel = (cand[train_rows] >= 0) & (lab[train_rows] >= thr)
    r_, c_ = np.nonzero(rel)
    pos_q, pos_p = r_, cand[train_rows][r_, c_].astype(np.int64)
    keep = ~held_p[pos_p]  # a training question of a kept article only cites kept paragraphs
    pos_q, pos_p = pos_q[keep], pos_p[keep]
    hq = q[held_q]
    qrels = Qrels(cand[held_q], lab[held_q], thr)
    cfg = ForestConfig(args.models, args.classes, q.shape[1])
    twin = Forest.random(cfg, seed=0)
    forests: dict[str, tuple[Forest, tuple[np.ndarray, np.ndarray]]] = {
        "twin-random": (twin, twin.passage_classes(p))
    }
    seconds: dict[str, float] = {}
    for name in args.settings:
        t0 = time.perf_counter()
        rep = repartition(twin, q[train_rows], pos_q, pos_p, p, **SETTINGS[name])
        seconds[name] = time.perf_counter() - t0
        forests[name] = (rep.forest, (rep.classes[:, :, 0], rep.probs[:, :, 0]))
        print(f"{name}: {seconds[name]:.0f} s", flush=True)
    rows = []
    for scoring in args.scorings:
        search = ForestSearch(scoring=scoring)
        res = {
            n: per_query(f.with_search(search), hq, qrels, tab) for n, (f, tab) in forests.items()
        }
        rows.append(
            {
                "scoring": scoring,
                "mean": {n: {k: float(v.mean()) for k, v in r.items()} for n, r in res.items()},
            }
        )
        print(scoring, {n: round(float(r["ndcg@10"].mean()), 4) for n, r in res.items()})
    doc = {
        "train": str(args.train),
        "n_models": args.models,
        "n_classes": args.classes,
        "block": args.block,
        "n_heldout_queries": int(held_q.sum()),
        "n_heldout_passages": int(held_p.sum()),
        "n_training_pairs": len(pos_q),
        "settings": {n: SETTINGS[n] for n in args.settings},
        "seconds": seconds,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "table.md").write_text(render(doc))
    print(render(doc))


def render(doc: dict[str, Any]) -> str:
    """Markdown: nDCG@10 / Recall@100 per setting and scoring on the held-out questions."""
    names = list(doc["rows"][0]["mean"])
    out = [
        f"Held-out SQuAD *train* articles (every tenth block of {doc['block']} passage rows: "
        f"{doc['n_heldout_passages']} paragraphs, {doc['n_heldout_queries']} questions), "
        f"IRLI from the random twin (seed 0) trained on the other {doc['n_training_pairs']} "
        f"questions, M = {doc['n_models']}, C = {doc['n_classes']}, t = 1; "
        "nDCG@10 / Recall@100 over all passages.",
        "",
        "| scoring | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for r in doc["rows"]:
        cells = [f"{r['mean'][n]['ndcg@10']:.3f} / {r['mean'][n]['recall@100']:.3f}" for n in names]
        out.append(f"| {r['scoring']} | " + " | ".join(cells) + " |")
    secs = ", ".join(f"{n} {s:.0f} s" for n, s in doc["seconds"].items())
    out += ["", f"Training seconds (one thread): {secs}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    # subnormal gradients slow CPU GEMMs ~30x and change nothing here; the flag is process-wide
    # (it breaks float32 round trips elsewhere), so it is set for the script, never by main()
    torch.set_flush_denormal(True)
    main()
