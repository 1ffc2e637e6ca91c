"""SciFact measurements for the thin heads (issue 4's "done when").

Three steps, each writing JSON under ``--out``:

1. ``guard``: the false-negative guard study. SciFact's training qrels are sparse, so a mined
   BM25 "negative" may be an unlabelled positive. We cannot see those, but we can plant them:
   for every training query with >= 2 relevant passages, hide one relevant passage, mine BM25
   as if it were unlabelled, and measure where the hidden positive lands (its BM25 rank, its
   frozen cosine relative to the visible positive). A guard setting is judged by the share of
   hidden positives it removes from the negative pool against the share of all pool negatives
   it throws away.
2. ``sweep``: heads trained on 80% of the training queries, model selection on the other 20%
   (held out, scored against the full corpus): guard settings, hard negatives, linear vs mlp.
   The test split is not touched.
3. ``final``: the chosen configs trained with ``treerank.tasks.train.train_model`` on the
   training store, evaluated on the 300 test queries against the full corpus with
   ``treerank.evaluation.compare.compare_systems`` beside cosine and BM25 (paired
   randomization test and bootstrap CI against cosine and against BM25).

Run: ``nice python bench/scifact_heads.py {guard,sweep,final} --stores /work/cache/stores/scifact``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from treerank.config import load_yaml
from treerank.evaluation.settings import EvaluationSettings
from treerank.families import family
from treerank.search.bm25 import BM25Index
from treerank.store import EmbeddingStore
from treerank.tasks.train import ensure_mined_negatives, make_validator, train_model
from treerank.training.holdout import holdout_split, passage_groups
from treerank.training.sampler import relevant_lists

ROOT = Path(__file__).resolve().parents[1]


def load_cfg(model: str) -> dict[str, Any]:
    return load_yaml(ROOT / "configs" / "heads" / f"{model}.yaml")


def guard_study(store: EmbeddingStore, depth: int = 100, pool_depth: int = 30) -> dict[str, Any]:
    rel, _ = relevant_lists(np.asarray(store.candidates), np.asarray(store.labels))
    n_rel = (rel >= 0).sum(axis=1)
    multi = np.flatnonzero(n_rel >= 2)
    index = BM25Index(store.passage_texts())
    ids, scores = index.search([store.query_texts()[i] for i in multi], k=depth)
    q = np.asarray(store.queries, dtype=np.float32)
    p = np.asarray(store.passages, dtype=np.float32)
    hidden = []  # one row per (query, hidden positive)
    pool_all = []  # every pool negative: (query pos, rank, cos - best visible cos)
    for row, qi in enumerate(multi):
        r = rel[qi][rel[qi] >= 0]
        cos_r = p[r] @ q[qi]
        for h_idx, h in enumerate(r):
            visible = np.delete(r, h_idx)
            best_vis = float(np.delete(cos_r, h_idx).max())
            lst = [
                (rank, int(pid))
                for rank, pid in enumerate(ids[row])
                if pid not in visible and scores[row, rank] > 0
            ]
            lst = lst[:pool_depth]
            for rank, pid in lst:
                gap = float(p[pid] @ q[qi]) - best_vis
                if pid == h:
                    hidden.append({"rank": rank, "gap": gap})
                else:
                    pool_all.append({"rank": rank, "gap": gap})
    n_hidden_total = int(sum(n_rel[multi]))
    settings = [(s, m) for s in (0, 1, 3, 5, 10) for m in (None, 0.0, -0.05, 0.05, 0.1)]
    rows = []
    for s, m in settings:

        def dropped(e: dict[str, float], s: int = s, m: float | None = m) -> bool:
            return e["rank"] < s or (m is not None and e["gap"] >= -m)

        caught = sum(dropped(e) for e in hidden)
        lost = sum(dropped(e) for e in pool_all)
        rows.append(
            {
                "skip_top": s,
                "margin": m,
                "hidden_positives_in_pool": len(hidden),
                "hidden_caught": caught,
                "hidden_caught_frac": caught / max(1, len(hidden)),
                "negatives_dropped_frac": lost / max(1, len(pool_all)),
                "false_negatives_left_per_1000_negatives": 1000
                * (len(hidden) - caught)
                / max(1, len(hidden) - caught + len(pool_all) - lost),
            }
        )
    return {
        "queries_with_2plus_relevant": int(multi.size),
        "hidden_trials": n_hidden_total,
        "hidden_in_bm25_pool": len(hidden),
        "pool_depth": pool_depth,
        "hidden_rank_quantiles": np.quantile(
            [e["rank"] for e in hidden], [0.25, 0.5, 0.75]
        ).tolist()
        if hidden
        else None,
        "hidden_gap_quantiles": np.quantile([e["gap"] for e in hidden], [0.25, 0.5, 0.75]).tolist()
        if hidden
        else None,
        "pool_gap_quantiles": np.quantile(
            [e["gap"] for e in pool_all], [0.25, 0.5, 0.75, 0.9]
        ).tolist(),
        "settings": rows,
    }


def sweep(
    store: EmbeddingStore, variants: dict[str, tuple[str, dict[str, Any]]], seeds: list[int]
) -> dict[str, Any]:
    """Each variant trained once per seed (the seed moves the held-out split, the init and the
    batches); reported: held-out nDCG@10 at the best step, its gain over the untrained head on
    the same held-out queries, mean and standard deviation over seeds."""
    out = {}
    for name, (model, over) in variants.items():
        runs = []
        for seed in seeds:
            cfg = load_cfg(model)
            for sec, vals in over.items():
                cfg[sec] = {**cfg.get(sec, {}), **vals} if isinstance(vals, dict) else vals
            cfg["seed"] = seed
            parsed = family(model).parse_config(cfg, f"{name} (seed {seed})")
            vcfg = parsed.validation
            cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
            has_rel = ((cand >= 0) & (lab >= 1)).any(axis=1)
            groups = passage_groups(cand, lab) if vcfg.group_by_passage else None
            tr, held = holdout_split(has_rel, vcfg.fraction, seed, vcfg.max_queries, groups)
            validate = make_validator(store, held, vcfg, seed)
            ensure_mined_negatives(store, parsed.data)
            t0 = time.perf_counter()
            train = family(model).train_function()
            res = train(store, parsed, train_rows=tr, validate=validate, progress=False)
            s = res.summary
            init = validate(type(res.model)(store.dim, **parsed.model))
            runs.append(
                {
                    "seed": seed,
                    "best_step": s["best_step"],
                    "steps": s["steps"],
                    "heldout_at_init": init,
                    "heldout_best": s["best_metrics"],
                    "gain_ndcg@10": s["best_metrics"]["ndcg@10"] - init["ndcg@10"],
                    "sampler": s["sampler"],
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
        nd = np.array([r["heldout_best"]["ndcg@10"] for r in runs])
        gain = np.array([r["gain_ndcg@10"] for r in runs])
        out[name] = {
            "model": model,
            "overrides": over,
            "ndcg@10_mean": float(nd.mean()),
            "ndcg@10_std": float(nd.std(ddof=1)) if nd.size > 1 else None,
            "gain_mean": float(gain.mean()),
            "gain_std": float(gain.std(ddof=1)) if gain.size > 1 else None,
            "runs": runs,
        }
        print(
            f"{name:28s} nDCG@10 {nd.mean():.4f} (gain {gain.mean():+.4f} +- "
            f"{(gain.std(ddof=1) if gain.size > 1 else 0):.4f}) best_steps "
            f"{[r['best_step'] for r in runs]}",
            flush=True,
        )
    return out


SWEEP: dict[str, tuple[str, dict[str, Any]]] = {
    "linear_inbatch": ("linear", {"data": {"n_hard": 0}}),
    "linear_h1_noguard": ("linear", {"data": {"guard_margin": None, "guard_skip_top": 0}}),
    "linear_h1_margin0": ("linear", {"data": {"guard_margin": 0.0, "guard_skip_top": 0}}),
    "linear_h1_skip3": ("linear", {"data": {"guard_margin": None, "guard_skip_top": 3}}),
    "linear_h1_skip3_margin0": ("linear", {"data": {"guard_margin": 0.0, "guard_skip_top": 3}}),
    "linear_h1_skip10": ("linear", {"data": {"guard_margin": None, "guard_skip_top": 10}}),
    "linear_h3_skip3": (
        "linear",
        {"data": {"n_hard": 3, "guard_margin": None, "guard_skip_top": 3}},
    ),
    "linear_wd0.1": ("linear", {"trainer": {"weight_decay": 0.1}}),
    "linear_lr3e-4": ("linear", {"trainer": {"lr": 3e-4}}),
    "linear_lr3e-3": ("linear", {"trainer": {"lr": 3e-3}}),
    "linear_shared": ("linear", {"model": {"shared": True}}),
    "linear_learn_tau": ("linear", {"model": {"learn_temperature": True}}),
    "linear_sym": ("linear", {"trainer": {"symmetric_weight": 1.0}}),
    "linear_grouped": ("linear", {"validation": {"group_by_passage": True}}),
    "linear_grouped_inbatch": (
        "linear",
        {"validation": {"group_by_passage": True}, "data": {"n_hard": 0}},
    ),
    "mlp_grouped": ("mlp", {"validation": {"group_by_passage": True}}),
    "mlp_default": ("mlp", {}),
    "mlp_inbatch": ("mlp", {"data": {"n_hard": 0}}),
    "mlp_drop0.3": ("mlp", {"model": {"dropout": 0.3}}),
    "mlp_lr3e-4": ("mlp", {"trainer": {"lr": 3e-4}}),
}


def final(train: EmbeddingStore, test: EmbeddingStore, out: Path, models: list[str]) -> dict:
    from treerank.evaluation.compare import compare_systems

    systems: dict[str, str] = {"cosine": "cosine", "bm25": "bm25"}
    trained = {}
    for name in models:
        model, over = SWEEP[name] if name in SWEEP else (name, {})
        cfg = load_cfg(model)
        for sec, vals in over.items():
            cfg[sec] = {**cfg.get(sec, {}), **vals} if isinstance(vals, dict) else vals
        ck = out / f"ckpt-{name}"
        res = train_model(model, train, cfg, ck, progress=False)
        trained[name] = {
            "best_step": res.summary["best_step"],
            "heldout_best": res.summary["best_metrics"],
            "seconds": res.summary["seconds"],
        }
        systems[name] = f"ckpt:{ck}"
    comp = compare_systems(
        test,
        systems,
        settings=EvaluationSettings(
            baseline="cosine",
            second_baseline="bm25",
            k=1000,
            metrics=("mrr@10", "ndcg@10", "recall@100"),
        ),
        out_dir=out / "compare-test",
    )
    return {
        "trained": trained,
        "comparison": _jsonable(comp),
        "by_overlap": overlap_breakdown(train, test, out / "compare-test"),
    }


def overlap_breakdown(train: EmbeddingStore, test: EmbeddingStore, comp_dir: Path) -> dict:
    """nDCG@10 against cosine on test queries whose relevant passage is / is not relevant to
    some training query (SciFact's claims share cited papers), with the paired tests."""
    from treerank.evaluation.significance import compare_paired

    def gold(s: EmbeddingStore) -> list[set[int]]:
        c, lab = np.asarray(s.candidates), np.asarray(s.labels)
        return [set(c[i][(lab[i] > 0) & (c[i] >= 0)].tolist()) for i in range(len(c))]

    seen = set().union(*gold(train))
    overlap = np.array([bool(g & seen) for g in gold(test)])
    per: dict[str, np.ndarray] = {}
    for line in (comp_dir / "per_query.jsonl").read_text().splitlines():
        r = json.loads(line)
        per.setdefault(r["system"], np.full(test.n_queries, np.nan))[r["query_index"]] = r[
            "ndcg@10"
        ]
    out: dict[str, Any] = {"n_overlap": int(overlap.sum()), "n_unseen": int((~overlap).sum())}
    for part, mask in (("overlap", overlap), ("unseen", ~overlap)):
        for name, vals in per.items():
            if name == "cosine":
                continue
            t = compare_paired({"ndcg@10": vals[mask]}, {"ndcg@10": per["cosine"][mask]})
            out[f"{part}/{name}"] = t["ndcg@10"].to_dict()
    return out


def _jsonable(x: Any) -> Any:
    if hasattr(x, "to_dict"):
        return _jsonable(x.to_dict())
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return None  # per-query arrays are in the compare directory
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "__dataclass_fields__"):
        import dataclasses

        return _jsonable({f.name: getattr(x, f.name) for f in dataclasses.fields(x)})
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description="SciFact measurements for the thin heads")
    ap.add_argument("step", choices=["guard", "sweep", "final"])
    ap.add_argument("--stores", type=Path, default=Path("/work/cache/stores/scifact"))
    ap.add_argument("--out", type=Path, default=Path("/work/cache/heads-scifact"))
    ap.add_argument("--only", nargs="*", default=None, help="sweep variants to run")
    ap.add_argument("--models", nargs="*", default=["linear", "mlp"])
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    train = EmbeddingStore.open(a.stores / "train")
    if a.step == "guard":
        res = guard_study(train)
    elif a.step == "sweep":
        variants = {k: v for k, v in SWEEP.items() if not a.only or k in a.only}
        res = sweep(train, copy.deepcopy(variants), a.seeds)
    else:
        res = final(train, EmbeddingStore.open(a.stores / "test"), a.out, a.models)
    path = a.out / f"{a.step}.json"
    if a.step == "sweep" and path.exists():
        res = {**json.loads(path.read_text()), **res}
    path.write_text(json.dumps(_jsonable(res), indent=2))
    print(json.dumps(_jsonable(res), indent=1)[:6000])


if __name__ == "__main__":
    main()
