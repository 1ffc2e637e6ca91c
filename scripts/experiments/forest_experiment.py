"""TreeRank forest experiment: train, evaluate against the full split beside cosine, plot vs M.

Usage (from the repository root, venv active)::

    # SciFact: train on the train split, evaluate on the test split (all 5,183 passages)
    python scripts/experiments/forest_experiment.py --train /work/cache/stores/scifact/train \\
        --test /work/cache/stores/scifact/test --config configs/forest/scifact.yaml \\
        --out runs/forest-scifact

    # DL19 pool: no training split -> k-fold cross-validation over topics
    python scripts/experiments/forest_experiment.py --test /work/cache/stores/dl19/test \\
        --cv-folds 5 --config configs/forest/dl19_cv.yaml --out runs/forest-dl19

Writes ``results.json`` (forest and cosine metrics, metric-vs-M curve, class-balance and tie
statistics, memory and timing) and ``forest_metric_vs_m.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from treerank.config import load_yaml
from treerank.forest.index import ForestSystem
from treerank.forest.model import Forest
from treerank.forest.not_retrievable import not_retrievable_stats
from treerank.forest.trainer import plot_metric_vs_models, train_forest
from treerank.kernels.topk import exact_search
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.store import EmbeddingStore
from treerank.training.output import save_trained_model

METRICS = ("mrr@10", "ndcg@10", "recall@100", "recall@1000")


class QueryView:
    """A store restricted to some query rows (all passages kept): what a CV fold trains/ranks."""

    def __init__(self, store: Any, rows: np.ndarray) -> None:
        self.base, self.rows = store, np.asarray(rows)
        self.queries = np.asarray(store.queries[self.rows], dtype=np.float32)
        self.candidates = np.asarray(store.candidates)[self.rows]
        self.labels = np.asarray(store.labels)[self.rows]
        self.passages = store.passages
        for a in ("relevance_threshold", "encoder_name", "encoder_fingerprint", "path", "dim"):
            setattr(self, a, getattr(store, a))
        self.n_passages = store.n_passages
        self.n_queries = len(self.rows)

    def iter_passage_chunks(self, chunk_size: int = 65536) -> Any:
        return self.base.iter_passage_chunks(chunk_size)


def forest_eval(forest: Forest, view: Any, k: int = 1000) -> tuple[Any, ForestSystem, float]:
    system = ForestSystem(forest)
    t0 = time.perf_counter()
    run = system.retrieve(view, k)
    sec = time.perf_counter() - t0
    return evaluate_run(run, Qrels.from_store(view), METRICS), system, sec


def cosine_eval(view: Any, k: int = 1000) -> tuple[Any, float]:
    t0 = time.perf_counter()
    ids, _ = exact_search(np.asarray(view.queries, dtype=np.float32), view.passages, k=k)
    sec = time.perf_counter() - t0
    return evaluate_run(ids, Qrels.from_store(view), METRICS), sec


def pooled_mean(parts: list[Any]) -> dict[str, float]:
    """Mean over the evaluated queries of several EvalResults (CV folds)."""
    out = {}
    for m in METRICS:
        v = np.concatenate([p.per_query[m] for p in parts])
        out[m] = float(np.nanmean(v))
    return out


def paired_p(forest_parts: list[Any], cos_parts: list[Any]) -> dict[str, float]:
    """Two-sided paired randomization-test p-value, forest vs cosine, per metric."""
    from treerank.evaluation.significance import randomization_test

    out = {}
    for m in METRICS:
        a = np.concatenate([p.per_query[m] for p in forest_parts])
        b = np.concatenate([p.per_query[m] for p in cos_parts])
        out[m] = randomization_test(a, b)
    return out


def save_output(out_dir: Path, out: Any, store: Any) -> None:
    """The trained forest's directory (checkpoint, log, curves) via the one writer."""
    save_trained_model(
        out_dir,
        out.model,
        encoder_name=str(store.encoder_name),
        encoder_fingerprint=str(store.encoder_fingerprint),
        summary=out.summary,
        records=out.records,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train", type=Path, help="training store split dir")
    ap.add_argument("--test", type=Path, required=True, help="evaluated store split dir")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cv-folds", type=int, default=0, help="k-fold CV over --test's queries")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides section.key=yaml_value")
    ap.add_argument(
        "--seen-split",
        action="store_true",
        help="also report test queries whose relevant passage is / is not a training positive",
    )
    ap.add_argument(
        "--train-queries",
        type=int,
        default=0,
        help="train on a fixed random sample of this many labelled training queries (0 = all)",
    )
    ap.add_argument(
        "--systems", nargs="*", default=[], help="extra system specs to evaluate (ckpt:<dir>, bm25)"
    )
    args = ap.parse_args()
    cfg = load_yaml(args.config)
    for kv in args.set:
        key, _, val = kv.partition("=")
        sec, dot, name = key.partition(".")
        if dot:
            cfg.setdefault(sec, {})[name] = yaml.safe_load(val)
        else:
            cfg[key] = yaml.safe_load(val)
    args.out.mkdir(parents=True, exist_ok=True)
    test = EmbeddingStore.open(args.test)
    k = min(1000, test.n_passages)
    result: dict[str, Any] = {"config": cfg, "test": str(args.test), "metrics": list(METRICS)}
    t0 = time.perf_counter()
    if args.cv_folds:
        from treerank.evaluation.folds import relevant_rows, topic_folds

        rows = relevant_rows(test)
        folds = topic_folds(test, args.cv_folds, cfg.get("seed", 0))
        per_m: dict[int, list[Any]] = {}
        forest_parts, cos_parts, fold_stats = [], [], []
        train_secs = 0.0
        for f, held in enumerate(folds):
            train_rows = np.sort(np.setdiff1d(rows, held))
            tr, ev = QueryView(test, train_rows), QueryView(test, held)

            def validate(forest: Forest, ev: Any = ev) -> dict[str, float]:
                res, _, _ = forest_eval(forest, ev, k)
                per_m.setdefault(forest.n_models, []).append(res)
                return res.mean

            out = train_forest(tr, cfg, validate=validate, progress=True)
            save_output(args.out / f"fold{f}" / "checkpoint", out, tr)
            train_secs += out.summary["seconds"]
            res, system, _ = forest_eval(out.model, ev, k)
            forest_parts.append(res)
            cos_parts.append(cosine_eval(ev, k)[0])
            fold_stats.append(system.balance_stats())
        curve = [{"n_models": m, **pooled_mean(v)} for m, v in sorted(per_m.items())]
        result.update(
            protocol=f"{args.cv_folds}-fold CV over the {len(rows)} topics with a relevant "
            "passage; each fold trains on the other topics' judgments and ranks the FULL pool",
            forest=pooled_mean(forest_parts),
            cosine=pooled_mean(cos_parts),
            p_value_vs_cosine=paired_p(forest_parts, cos_parts),
            n_evaluated=int(sum(p.n_evaluated for p in forest_parts)),
            curve=curve,
            fold_stats=fold_stats,
            train_seconds=train_secs,
        )
    else:
        if args.train is None:
            ap.error("--train is required without --cv-folds")
        train = EmbeddingStore.open(args.train)
        if train.encoder_fingerprint != test.encoder_fingerprint:
            raise SystemExit(f"{args.train} and {args.test} were embedded with different encoders")

        def validate(forest: Forest) -> dict[str, float]:
            mean = forest_eval(forest, test, k)[0].mean
            # one line per curve point as it comes (a long run stopped early keeps its points)
            print(json.dumps({"n_models": forest.n_models, **mean}), flush=True)
            return mean

        train_rows = None
        if args.train_queries:
            has_rel = (
                (np.asarray(train.labels) >= train.relevance_threshold)
                & (np.asarray(train.candidates) >= 0)
            ).any(1)
            rows = np.nonzero(has_rel)[0]
            rng = np.random.default_rng(cfg.get("seed", 0))
            if args.train_queries < len(rows):
                rows = np.sort(rng.choice(rows, size=args.train_queries, replace=False))
            train_rows = rows
            result["train_queries"] = len(rows)
        out = train_forest(train, cfg, train_rows=train_rows, validate=validate, progress=True)
        save_output(args.out / "checkpoint", out, train)
        res, system, f_sec = forest_eval(out.model, test, k)
        cres, c_sec = cosine_eval(test, k)
        result.update(
            protocol="train split -> test split, full corpus",
            forest=res.mean,
            cosine=cres.mean,
            p_value_vs_cosine=paired_p([res], [cres]),
            n_evaluated=res.n_evaluated,
            curve=out.summary["curve"],
            stats=system.balance_stats(),
            train_summary={kk: v for kk, v in out.summary.items() if kk not in ("config", "curve")},
            train_seconds=out.summary["seconds"],
            retrieve_seconds={"forest_index_and_search": f_sec, "cosine_exact": c_sec},
            passages_bytes=int(test.n_passages * test.dim * 4),
            not_retrievable=not_retrievable_stats(out.model, test, k=100),
        )
        if args.seen_split:
            from treerank.evaluation.overlap import overlap_breakdown, seen_positive_mask

            seen = seen_positive_mask(test, train)
            per_query = {"forest": res.per_query, "cosine": cres.per_query}
            result["seen_split"] = overlap_breakdown(per_query, seen, "cosine", list(METRICS))
        from treerank.search.specs import build_system

        for spec in args.systems:
            run = build_system(spec).retrieve(test, k)
            result.setdefault("others", {})[spec] = evaluate_run(
                run, Qrels.from_store(test), METRICS
            ).mean
    result["wall_seconds"] = time.perf_counter() - t0
    if result["curve"]:
        plot_metric_vs_models(
            result["curve"],
            args.out / "forest_metric_vs_m.png",
            title=f"{cfg.get('name', 'forest')} on {args.test.parent.name}/{args.test.name} "
            f"(C={cfg.get('n_classes')})",
            baselines={"cosine": result["cosine"], **result.get("others", {})},
        )
    (args.out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    keys = ("forest", "cosine", "p_value_vs_cosine", "wall_seconds", "train_seconds")
    print(json.dumps({kk: result[kk] for kk in keys}, indent=2))


if __name__ == "__main__":
    main()
