"""Trained forest against its untrained twins, same M, C, index and scoring (issue 27).

On one collection with a training split and an evaluation split over the same passages
(SciFact: ``train`` claims to train, ``test`` claims to evaluate, all 5,183 papers), in ONE run:

1. trained forests (the main job's settings, ``configs/sample.yaml``'s ``forest``, at
   ``--models`` pairs; variants: ``trained`` = the shipped init, ``trained-from-sign`` = each
   pair's query model starts from the sign-hyperplane twin's, ``trained-from-sign-passage-only``
   = the same with no query step and no joint round: only the passage model learns) are trained
   once and cached under ``--work``;
2. the untrained twins ``random`` (:meth:`Forest.random`), ``sign`` (``log2 C`` hyperplanes per
   model) and ``kmeans`` (spherical k-means on a bootstrap sample of the passages), three seeds
   each, at the same M and C;
3. every forest is searched at every M of ``--curve`` (its first M pairs), every probe depth
   ``--probes`` and every scoring of ``--scorings`` (no retraining: :class:`ForestSearch`);
   nDCG@10 and Recall@100 per query on all evaluation queries and on the ``unseen`` ones (no
   relevant passage cited by a training query,
   :func:`treerank.evaluation.overlap.seen_positive_mask`);
   a twin's per-query metrics are the mean over its seeds;
4. at every (M, probe, scoring) the trained forest is compared with the **strongest** twin there
   (highest mean nDCG@10 on the part) by :func:`treerank.evaluation.significance.compare_paired`
   (paired randomization test, 10,000 permutations).

Writes ``results.json`` and ``table.md`` under ``--out``. Run (niced, one thread)::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 nice -n 10 python bench/bench_forest_twins.py \
        --train .cache/test-stores/scifact-.../train --test .cache/test-stores/scifact-.../test \
        --work /tmp/forest-work --out docs/results/forest_twins_scifact
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from treerank.evaluation.metrics import evaluate_run
from treerank.evaluation.overlap import seen_positive_mask
from treerank.evaluation.qrels import Qrels
from treerank.evaluation.significance import compare_paired
from treerank.kernels.topk import exact_search
from treerank.models.forest import Forest, ForestConfig, ForestSearch
from treerank.search.forest_index import ForestIndex, ForestSystem

REPO = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@100"]
VARIANTS: dict[str, dict[str, Any]] = {
    "trained": {},
    "trained-from-sign": {"model": {"twin": "sign"}, "trainer": {"init": "twin"}},
    "trained-from-sign-passage-only": {
        "model": {"twin": "sign"},
        "trainer": {"init": "twin", "steps_query": 0, "steps_joint": 0},
    },
}
IRLI: dict[str, dict[str, Any]] = {
    # IRLI re-partitioning from an untrained twin (training/forest_repartition.py)
    "irli-from-sign": {"twin": "sign", "rounds": 3, "steps": 20},
    "irli-from-random": {"twin": "random", "rounds": 3, "steps": 20},
    "irli-from-random-light": {"twin": "random", "rounds": 2, "steps": 5},
    "irli-from-random-heavy": {"twin": "random", "rounds": 5, "steps": 40},
    "irli-from-random-nocap": {"twin": "random", "rounds": 3, "steps": 20, "capacity": None},
}
TWIN_KINDS = ("random", "sign", "kmeans")


def sample_forest_config(n_models: int) -> dict[str, Any]:
    """``configs/sample.yaml``'s ``forest`` section at ``n_models`` pairs."""
    raw = yaml.safe_load((REPO / "configs" / "sample.yaml").read_text())["models"]["forest"]
    cfg = {k: v for k, v in raw.items() if k != "family"}
    cfg["model"]["n_models"] = n_models
    return cfg


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for sec, vals in over.items():
        out.setdefault(sec, {}).update(vals)
    return out


def save_forest(forest: Forest, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"config": forest.checkpoint_config(), "state": forest.state_dict()}, tmp)
    tmp.replace(path)


def load_forest(path: Path) -> Forest:
    doc = torch.load(path, weights_only=True)
    return Forest.from_checkpoint_parts(doc["config"], doc["state"])


def trained_forest(
    name: str, train: Any, n_models: int, work: Path, n_classes: int = 32
) -> tuple[Any, float]:
    """The variant's forest (an IRLI variant: ``(forest, classes table)``) from the cache, or
    trained now (seconds of training returned)."""
    from treerank.training.forest import train_forest

    path = work / f"{name}-M{n_models}.pt"
    if path.is_file():
        doc = json.loads(path.with_suffix(".json").read_text())
        if name in IRLI:
            tab = np.load(path.with_suffix(".npz"))
            return (load_forest(path), tab["classes"], tab["probs"]), float(doc["seconds"])
        return load_forest(path), float(doc["seconds"])
    if name in IRLI:
        from treerank.training.forest_repartition import repartition_store

        spec = IRLI[name]
        t0 = time.perf_counter()
        twin = Forest.twin(spec["twin"], ForestConfig(n_models, n_classes, int(train.dim)), 0)
        rep = repartition_store(
            twin,
            train,
            rounds=spec["rounds"],
            steps=spec["steps"],
            capacity_epsilon=spec.get("capacity", 0.2),
        )
        sec = time.perf_counter() - t0
        save_forest(rep.forest, path)
        np.savez(path.with_suffix(".npz"), classes=rep.classes, probs=rep.probs)
        path.with_suffix(".json").write_text(
            json.dumps(
                {
                    "seconds": sec,
                    "config": spec,
                    "objective": rep.objective,
                    "objective_initial": rep.objective_initial,
                }
            )
        )
        return (rep.forest, rep.classes, rep.probs), sec
    cfg = merged(sample_forest_config(n_models), VARIANTS[name])
    t0 = time.perf_counter()
    out = train_forest(train, cfg, progress=False)
    sec = time.perf_counter() - t0
    save_forest(out.model, path)
    path.with_suffix(".json").write_text(json.dumps({"seconds": sec, "config": cfg}))
    return out.model, sec


class _Split:
    def __init__(self, queries: np.ndarray, passages: np.ndarray) -> None:
        self.queries, self.passages = queries, passages

    def iter_passage_chunks(self, size: int):  # type: ignore[no-untyped-def]
        for s in range(0, len(self.passages), size):
            yield s, self.passages[s : s + size]


def per_query(
    forest: Forest, split: _Split, qrels: Qrels, table: tuple[np.ndarray, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Per-query metrics of the forest's search (an IRLI ``table``: its passage assignment)."""
    system = ForestSystem(forest)
    if table is None:
        ids = system.retrieve(split, 100).ids
    else:
        m = forest.n_models
        system.index = ForestIndex.build(table[0][:, :m], table[1][:, :m], forest.n_classes)
        ids = system.search_queries(split.queries, 100).ids
    return {k: np.asarray(v) for k, v in evaluate_run(ids, qrels, METRICS).per_query.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--work", required=True, help="cache of trained forests (outside the repo)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--classes", type=int, default=32)
    ap.add_argument("--curve", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--probes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--scorings", nargs="+", default=["shipped", "count", "soft"])
    ap.add_argument("--variants", nargs="*", default=[*VARIANTS, *IRLI])
    ap.add_argument("--twin-kinds", nargs="+", default=list(TWIN_KINDS))
    ap.add_argument("--train-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from treerank.store import EmbeddingStore

    train, test = EmbeddingStore.open(args.train), EmbeddingStore.open(args.test)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    trained = {}
    seconds = {}
    for v in args.variants:
        trained[v], seconds[v] = trained_forest(v, train, args.models, work)
        print(f"{v}: {seconds[v]:.0f} s", flush=True)
    if args.train_only:
        return
    q = np.asarray(test.queries, dtype=np.float32)
    p = np.asarray(test.passages, dtype=np.float32)
    split = _Split(q, p)
    qrels = Qrels.from_store(test)
    seen = seen_positive_mask(test, train)
    parts = {"all": np.ones(len(q), dtype=bool), "unseen": ~seen}
    cos_ids, _ = exact_search(q, p, k=100)
    cosine = {m: np.asarray(v) for m, v in evaluate_run(cos_ids, qrels, METRICS).per_query.items()}
    cfg = ForestConfig(args.models, args.classes, q.shape[1])
    twins = {
        kind: [Forest.twin(kind, cfg, seed, vectors=p) for seed in (0, 1, 2)]
        for kind in args.twin_kinds
    }
    rows: list[dict[str, Any]] = []
    for m in args.curve:
        for t in args.probes:
            for scoring in args.scorings:
                search = ForestSearch(probe=t, scoring=scoring)
                res: dict[str, dict[str, np.ndarray]] = {}
                for v, f in trained.items():
                    if isinstance(f, tuple):
                        fs, tab = f[0], (f[1], f[2])
                        res[v] = per_query(fs.subset(m).with_search(search), split, qrels, tab)
                    else:
                        res[v] = per_query(f.subset(m).with_search(search), split, qrels)
                for kind, fs in twins.items():
                    seeds = [per_query(f.subset(m).with_search(search), split, qrels) for f in fs]
                    res[f"twin-{kind}"] = {
                        k: np.mean([s[k] for s in seeds], axis=0) for k in METRICS
                    }
                for part, mask in parts.items():
                    sub = {n: {k: v[mask] for k, v in r.items()} for n, r in res.items()}
                    twin_names = [n for n in sub if n.startswith("twin-")]
                    best = max(twin_names, key=lambda n: float(sub[n]["ndcg@10"].mean()))
                    row: dict[str, Any] = {
                        "n_models": m,
                        "probe": t,
                        "scoring": scoring,
                        "part": part,
                        "n_queries": int(mask.sum()),
                        "cosine": {k: float(v[mask].mean()) for k, v in cosine.items()},
                        "mean": {
                            n: {k: float(v.mean()) for k, v in r.items()} for n, r in sub.items()
                        },
                        "strongest_twin": best,
                        "vs_strongest_twin": {},
                    }
                    for v in trained:  # noqa: PLC0206
                        tests = compare_paired(sub[v], sub[best], METRICS)
                        row["vs_strongest_twin"][v] = {
                            k: {"delta": r.delta, "p": r.p_randomization} for k, r in tests.items()
                        }
                    rows.append(row)
                    print(
                        f"M={m} t={t} {scoring:<8} {part:<6} "
                        + " ".join(f"{n}={sub[n]['ndcg@10'].mean():.3f}" for n in sub)
                        + f" best twin {best}",
                        flush=True,
                    )
    # diagnostics at the largest M, t = 1: test claims' relevant pairs vs random pairs
    from treerank.search.forest_diagnostics import forest_diagnostics

    cand, lab = np.asarray(test.candidates), np.asarray(test.labels)
    rows_, cols_ = np.nonzero((cand >= 0) & (lab >= int(test.relevance_threshold)))
    pairs = np.stack([rows_, cand[rows_, cols_]], 1)
    diag: dict[str, Any] = {}
    for v, f in trained.items():
        diag[v] = forest_diagnostics(f[0] if isinstance(f, tuple) else f, q, p, pairs)
    for kind, fs in twins.items():
        diag[f"twin-{kind}"] = forest_diagnostics(fs[0], q, p, pairs)
    for d in diag.values():
        d.pop("collision_relevant")
        d.pop("collision_random")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "diagnostics": diag,
        "train": str(args.train),
        "test": str(args.test),
        "n_models": args.models,
        "n_classes": args.classes,
        "train_seconds": seconds,
        "variants": {v: VARIANTS[v] if v in VARIANTS else IRLI[v] for v in trained},
        "twin_seeds": [0, 1, 2],
        "rows": rows,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "table.md").write_text(render(doc))
    print(render(doc))


def render(doc: dict[str, Any]) -> str:
    """Markdown: nDCG@10 per (M, t, scoring, part); trained deltas vs the strongest twin."""
    rows = doc["rows"]
    if not rows:
        return ""
    names = list(rows[0]["mean"])
    trained = list(rows[0]["vs_strongest_twin"])
    head = (
        "| M | t | scoring | part | cosine | "
        + " | ".join(names)
        + " | strongest twin | "
        + " | ".join(f"{v} - twin (p)" for v in trained)
        + " |"
    )
    out = [
        f"nDCG@10, C = {doc['n_classes']}; twins: mean of seeds {doc['twin_seeds']}; "
        "p: paired randomization test against the strongest twin of the row.",
        "",
        head,
        "|" + "---|" * (5 + len(names) + 1 + len(trained)),
    ]
    diag = doc.get("diagnostics") or {}
    n_pairs = next(iter(diag.values()), {}).get("n_pairs", 0)
    diag_md = [
        "",
        f"Diagnostics at M = {doc['n_models']}, t = K = 1, on the {n_pairs} (test claim, "
        "relevant paper) pairs against as many random pairs (twins: seed 0; IRLI variants: "
        "their query models through their own passage rule, not the table):",
        "",
        "| forest | collision rate, relevant pairs | random pairs | lift | vote correlation, "
        "relevant | random | models voting per relevant pair |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, d in diag.items():
        diag_md.append(
            f"| {name} | {d['collision_relevant_mean']:.3f} | {d['collision_random_mean']:.3f} | "
            f"{d['lift_mean']:.1f} | {d['vote_correlation_relevant']:.3f} | "
            f"{d['vote_correlation_random']:.3f} | {d['mean_votes_relevant']:.1f} |"
        )
    for r in rows:
        cells = [
            str(r["n_models"]),
            str(r["probe"]),
            r["scoring"],
            f"{r['part']} ({r['n_queries']})",
        ]
        cells.append(f"{r['cosine']['ndcg@10']:.3f}")
        cells += [f"{r['mean'][n]['ndcg@10']:.3f}" for n in names]
        cells.append(r["strongest_twin"])
        for v in trained:
            d = r["vs_strongest_twin"][v]["ndcg@10"]
            cells.append(f"{d['delta']:+.3f} ({d['p']:.3g})")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out + (diag_md if diag else [])) + "\n"


if __name__ == "__main__":
    main()
