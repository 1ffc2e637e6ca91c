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

Options for SQuAD (issue 27): ``--trained-config`` / ``--trained-set`` give the trained
variants another config (``configs/forest/squad.yaml`` at C = 32), ``--variant-models`` trains a
variant to fewer pairs than ``--models`` (it is absent from the rows past its M), ``--plot`` adds
the M curve at one (t, scoring) as ``curve.md`` + ``curve.png``; an evaluation split with no
query seen in training (SQuAD dev) has the part ``all`` only.

Writes ``results.json`` and ``table.md`` under ``--out``. Run (niced, one thread)::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 nice -n 10 python bench/bench_forest_twins.py \
        --train .cache/test-stores/scifact-.../train --test .cache/test-stores/scifact-.../test \
        --work /tmp/forest-work --out docs/results/forest_twins_scifact

SQuAD dev: the command is in ``docs/results/forest_twins_squad/results.json`` (``command``) and
in docs/forest.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from treerank.evaluation.overlap import seen_positive_mask
from treerank.evaluation.significance import compare_paired
from treerank.forest.index import ForestIndex
from treerank.forest.model import Forest, ForestConfig
from treerank.kernels.topk import exact_search
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels

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
    # IRLI re-partitioning from an untrained twin (forest/repartition.py)
    "irli-from-sign": {"twin": "sign", "rounds": 3, "steps": 20},
    "irli-from-random": {"twin": "random", "rounds": 3, "steps": 20},
    "irli-from-random-light": {"twin": "random", "rounds": 2, "steps": 5},
    "irli-from-random-heavy": {"twin": "random", "rounds": 5, "steps": 40},
    "irli-from-random-nocap": {"twin": "random", "rounds": 3, "steps": 20, "capacity": None},
    # SQuAD (87,599 training questions): each round's query training on a fresh quarter of the
    # pairs (4x cheaper; bench/forest_irli_tune.py), with or without the passage term J_p
    "irli-from-random-sample0.25": {"twin": "random", "rounds": 3, "steps": 20, "sample": 0.25},
    "irli-from-random-sample0.25-passage1": {
        "twin": "random",
        "rounds": 3,
        "steps": 20,
        "sample": 0.25,
        "passage_weight": 1.0,
    },
    "irli-from-random-sample0.25-passage4": {
        "twin": "random",
        "rounds": 3,
        "steps": 20,
        "sample": 0.25,
        "passage_weight": 4.0,
    },
}
TWIN_KINDS = ("random", "sign", "kmeans")


def sample_forest_config(n_models: int) -> dict[str, Any]:
    """``configs/sample.yaml``'s ``forest`` section at ``n_models`` pairs."""
    raw = yaml.safe_load((REPO / "configs" / "sample.yaml").read_text())["models"]["forest"]
    cfg = {k: v for k, v in raw.items() if k != "family"}
    cfg["model"]["n_models"] = n_models
    return cfg


def forest_config_file(path: str | Path, n_models: int, sets: list[str]) -> dict[str, Any]:
    """A sectioned forest config file (``configs/forest/*.yaml``) at ``n_models`` pairs, with
    ``sets`` overrides ``SECTION.KEY=VALUE`` (``VALUE`` read as YAML).

    Raises:
        ValueError: an override that is not ``SECTION.KEY=VALUE`` (named with its position).
    """
    cfg = yaml.safe_load(Path(path).read_text())
    for i, item in enumerate(sets):
        key, eq, val = item.partition("=")
        sec, dot, name = key.partition(".")
        if not eq or not dot or not sec or not name:
            raise ValueError(f"--trained-set #{i + 1} {item!r}: expected SECTION.KEY=VALUE")
        cfg.setdefault(sec, {})[name] = yaml.safe_load(val)
    cfg.setdefault("model", {})["n_models"] = n_models
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
    name: str,
    train: Any,
    n_models: int,
    work: Path,
    n_classes: int = 32,
    base: dict[str, Any] | None = None,
) -> tuple[Any, float]:
    """The variant's forest (an IRLI variant: ``(forest, classes table)``) from the cache, or
    trained now (seconds of training returned). ``base``: the trained variants' config
    (default: :func:`sample_forest_config`)."""
    from treerank.forest.trainer import train_forest

    path = work / f"{name}-M{n_models}.pt"
    if path.is_file():
        doc = json.loads(path.with_suffix(".json").read_text())
        if name in IRLI:
            tab = np.load(path.with_suffix(".npz"))
            return (load_forest(path), tab["classes"], tab["probs"]), float(doc["seconds"])
        return load_forest(path), float(doc["seconds"])
    if name in IRLI:
        from treerank.forest.repartition import repartition_store

        spec = IRLI[name]
        t0 = time.perf_counter()
        twin = Forest.twin(spec["twin"], ForestConfig(n_models, n_classes, int(train.dim)), 0)
        rep = repartition_store(
            twin,
            train,
            rounds=spec["rounds"],
            steps=spec["steps"],
            capacity_epsilon=spec.get("capacity", 0.2),
            sample=spec.get("sample", 1.0),
            passage_weight=spec.get("passage_weight", 0.0),
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
    cfg = merged(base or sample_forest_config(n_models), VARIANTS[name])
    t0 = time.perf_counter()
    out = train_forest(train, cfg, progress=False)
    sec = time.perf_counter() - t0
    save_forest(out.model, path)
    path.with_suffix(".json").write_text(json.dumps({"seconds": sec, "config": cfg}))
    return out.model, sec


def forest_index(forest: Forest, passages: np.ndarray, table: Any = None) -> ForestIndex:
    """The inverted lists of ``forest`` over ``passages`` (its passage models), or of an IRLI
    assignment ``table`` ``(classes (n, M', K), probs)`` cut to the forest's M."""
    if table is None:
        return ForestIndex.build(*forest.passage_classes(passages), forest.n_classes)
    m = forest.n_models
    return ForestIndex.build(table[0][:, :m], table[1][:, :m], forest.n_classes)


def search_ids(
    forest: Forest, index: ForestIndex, queries: np.ndarray, probe: int, scoring: str, k: int
) -> np.ndarray:
    """``int64 (nq, k)`` ids of the forest's search at probe depth ``probe`` and ``scoring``
    (the rules of :meth:`ForestSystem.search_queries`, K = 1)."""
    if probe == 1 and scoring == "shipped":
        return index.search(*forest.query_classes(queries), k).ids
    qc, qp, fl = forest.query_top(queries, min(probe, forest.n_classes))
    return index.search_probes(qc, qp, fl, k, scoring).ids


def _per_name_models(
    names: list[str], default: int, items: list[str], option: str, key: str, what: str
) -> dict[str, int]:
    """``{name: M}``: ``default`` for every name, overridden by ``option``'s ``NAME=M`` items.

    Raises:
        SystemExit: an item that is not ``NAME=M`` for one of ``names``."""
    out = dict.fromkeys(names, default)
    for item in items:
        name, eq, val = item.partition("=")
        if not eq or name not in out or not val.isdigit():
            raise SystemExit(f"{option} {item!r}: expected {key}=M for a chosen {what}")
        out[name] = int(val)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--work", required=True, help="cache of trained forests (outside the repo)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", type=int, default=64, help="M of the twins and the largest M")
    ap.add_argument("--classes", type=int, default=32)
    ap.add_argument("--curve", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--probes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--scorings", nargs="+", default=["shipped", "count", "soft"])
    ap.add_argument("--variants", nargs="*", default=[*VARIANTS, *IRLI])
    ap.add_argument(
        "--variant-models",
        nargs="*",
        default=[],
        metavar="NAME=M",
        help="train that variant to M pairs only (default: --models)",
    )
    ap.add_argument(
        "--trained-config",
        default=None,
        help="sectioned forest config of the trained (non-IRLI) variants "
        "(default: configs/sample.yaml's forest section)",
    )
    ap.add_argument(
        "--trained-set",
        nargs="*",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="overrides of --trained-config",
    )
    ap.add_argument("--twin-kinds", nargs="+", default=list(TWIN_KINDS))
    ap.add_argument(
        "--twin-max-models",
        nargs="*",
        default=[],
        metavar="KIND=M",
        help="search that twin kind only up to M (CPU budget)",
    )
    ap.add_argument("--label", default=None, help="dataset label of the tables and plot")
    ap.add_argument(
        "--plot",
        default=None,
        metavar="T,SCORING",
        help="also write curve.png and curve.md: metrics vs M at this t, scoring",
    )
    ap.add_argument("--train-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from treerank.store import EmbeddingStore

    models_of = _per_name_models(
        args.variants, args.models, args.variant_models, "--variant-models", "NAME", "variant"
    )
    train, test = EmbeddingStore.open(args.train), EmbeddingStore.open(args.test)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    trained = {}
    seconds = {}
    configs: dict[str, Any] = {}
    for v in args.variants:
        base = None
        if args.trained_config and v in VARIANTS:
            base = forest_config_file(args.trained_config, models_of[v], args.trained_set)
        trained[v], seconds[v] = trained_forest(v, train, models_of[v], work, args.classes, base)
        configs[v] = IRLI[v] if v in IRLI else merged(base or {}, VARIANTS[v])
        print(f"{v}: M = {models_of[v]}, {seconds[v]:.0f} s", flush=True)
    twin_max = _per_name_models(
        args.twin_kinds, args.models, args.twin_max_models, "--twin-max-models", "KIND", "kind"
    )
    if args.train_only:
        return
    q = np.asarray(test.queries, dtype=np.float32)
    p = np.asarray(test.passages, dtype=np.float32)
    qrels = Qrels.from_store(test)
    seen = seen_positive_mask(test, train)
    parts = {"all": np.ones(len(q), dtype=bool)}
    if seen.any():  # SQuAD dev: every article unseen, "unseen" would repeat "all"
        parts["unseen"] = ~seen
    cos_ids, _ = exact_search(q, p, k=100)
    cosine = {m: np.asarray(v) for m, v in evaluate_run(cos_ids, qrels, METRICS).per_query.items()}
    cfg = ForestConfig(args.models, args.classes, q.shape[1])
    twins = {
        kind: [Forest.twin(kind, cfg, seed, vectors=p) for seed in (0, 1, 2)]
        for kind in args.twin_kinds
    }

    def metrics_of(ids: np.ndarray) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in evaluate_run(ids, qrels, METRICS).per_query.items()}

    # res[(M, t, scoring)][forest name] = per-query metrics (twins: mean over seeds)
    res: dict[tuple[int, int, str], dict[str, dict[str, np.ndarray]]] = {}
    for m in args.curve:
        grid = [(t, sc) for t in args.probes for sc in args.scorings]
        for t, sc in grid:
            res[(m, t, sc)] = {}
        for v, f in trained.items():
            if models_of[v] < m:
                continue
            fs, tab = (f[0], (f[1], f[2])) if isinstance(f, tuple) else (f, None)
            fm = fs.subset(m)
            index = forest_index(fm, p, tab)
            for t, sc in grid:
                res[(m, t, sc)][v] = metrics_of(search_ids(fm, index, q, t, sc, 100))
        for kind, fs in twins.items():
            if twin_max[kind] < m:
                continue
            per_seed: dict[tuple[int, str], list[dict[str, np.ndarray]]] = {g: [] for g in grid}
            for f in fs:
                fm = f.subset(m)
                index = forest_index(fm, p)
                for t, sc in grid:
                    per_seed[(t, sc)].append(metrics_of(search_ids(fm, index, q, t, sc, 100)))
            for t, sc in grid:
                res[(m, t, sc)][f"twin-{kind}"] = {
                    k: np.mean([s[k] for s in per_seed[(t, sc)]], axis=0) for k in METRICS
                }
        print(f"M={m} searched", flush=True)
    rows: list[dict[str, Any]] = []
    for (m, t, scoring), r_all in res.items():
        for part, mask in parts.items():
            sub = {n: {k: v[mask] for k, v in r.items()} for n, r in r_all.items()}
            twin_names = [n for n in sub if n.startswith("twin-")]
            best = max(twin_names, key=lambda n: float(sub[n]["ndcg@10"].mean()))
            row: dict[str, Any] = {
                "n_models": m,
                "probe": t,
                "scoring": scoring,
                "part": part,
                "n_queries": int(mask.sum()),
                "cosine": {k: float(v[mask].mean()) for k, v in cosine.items()},
                "mean": {n: {k: float(v.mean()) for k, v in r.items()} for n, r in sub.items()},
                "strongest_twin": best,
                "vs_strongest_twin": {},
            }
            for v in sub:
                if v in trained:
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
    # diagnostics at the largest M, t = 1: test queries' relevant pairs vs random pairs
    from treerank.forest.diagnostics import forest_diagnostics

    cand, lab = np.asarray(test.candidates), np.asarray(test.labels)
    rows_, cols_ = np.nonzero((cand >= 0) & (lab >= int(test.relevance_threshold)))
    pairs = np.stack([rows_, cand[rows_, cols_]], 1)
    diag: dict[str, Any] = {}
    for v, f in trained.items():
        diag[v] = forest_diagnostics(f[0] if isinstance(f, tuple) else f, q, p, pairs)
        diag[v]["n_models"] = models_of[v]
    for kind, fs in twins.items():
        diag[f"twin-{kind}"] = forest_diagnostics(fs[0], q, p, pairs)
        diag[f"twin-{kind}"]["n_models"] = args.models
    for d in diag.values():
        d.pop("collision_relevant")
        d.pop("collision_random")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "label": args.label,
        "diagnostics": diag,
        "train": str(args.train),
        "test": str(args.test),
        "n_models": args.models,
        "variant_models": models_of,
        "twin_max_models": twin_max,
        "n_classes": args.classes,
        "train_seconds": seconds,
        "variants": configs,
        "twin_seeds": [0, 1, 2],
        "command": "python bench/bench_forest_twins.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "table.md").write_text(render(doc))
    if args.plot:
        t_s, _, sc_s = args.plot.partition(",")
        (out / "curve.md").write_text(render_curve(doc, int(t_s), sc_s))
        plot_curve(doc, int(t_s), sc_s, out / "curve.png")
    print(render(doc))


def _names(rows: list[dict[str, Any]], key: str) -> list[str]:
    """Forest names of ``rows[*][key]`` in first-seen order (a variant trained to a smaller M
    is absent from the rows past it)."""
    out: list[str] = []
    for r in rows:
        out += [n for n in r[key] if n not in out]
    return out


def render(doc: dict[str, Any]) -> str:
    """Markdown: per (M, t, scoring, part) the mean metric of every forest and each trained
    forest minus the strongest twin of the row (paired randomization p); nDCG@10, then
    Recall@100 when the rows have it; then the diagnostics."""
    rows = doc["rows"]
    if not rows:
        return ""
    names = _names(rows, "mean")
    trained = _names(rows, "vs_strongest_twin")
    label = f"{doc['label']}: " if doc.get("label") else ""
    out: list[str] = []
    for metric in METRICS:
        if metric not in rows[0]["cosine"]:
            continue
        head = (
            "| M | t | scoring | part | cosine | "
            + " | ".join(names)
            + " | strongest twin | "
            + " | ".join(f"{v} - twin (p)" for v in trained)
            + " |"
        )
        out += [
            f"{label}{metric}, C = {doc['n_classes']}; twins: mean of seeds "
            f"{doc['twin_seeds']}; p: paired randomization test against the strongest twin of "
            "the row (strongest by nDCG@10).",
            "",
            head,
            "|" + "---|" * (5 + len(names) + 1 + len(trained)),
        ]
        for r in rows:
            cells = [
                str(r["n_models"]),
                str(r["probe"]),
                r["scoring"],
                f"{r['part']} ({r['n_queries']})",
                f"{r['cosine'][metric]:.3f}",
            ]
            cells += [f"{r['mean'][n][metric]:.3f}" if n in r["mean"] else "-" for n in names]
            cells.append(r["strongest_twin"])
            for v in trained:
                d = r["vs_strongest_twin"].get(v, {}).get(metric)
                cells.append(f"{d['delta']:+.3f} ({d['p']:.3g})" if d else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    diag = doc.get("diagnostics") or {}
    if diag:
        n_pairs = next(iter(diag.values())).get("n_pairs", 0)
        ms = sorted({d.get("n_models", doc["n_models"]) for d in diag.values()})
        m_txt = " / ".join(str(m) for m in ms)
        out += [
            f"Diagnostics at M = {m_txt} (each forest's largest), t = K = 1, on the {n_pairs} "
            "(test query, relevant passage) pairs against as many random pairs (twins: seed 0; "
            "IRLI variants: their query models through their own passage rule, not the table):",
            "",
            "| forest | M | collision rate, relevant pairs | random pairs | lift | "
            "vote correlation, relevant | random | models voting per relevant pair |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, d in diag.items():
            out.append(
                f"| {name} | {d.get('n_models', doc['n_models'])} | "
                f"{d['collision_relevant_mean']:.3f} | {d['collision_random_mean']:.3f} | "
                f"{d['lift_mean']:.1f} | {d['vote_correlation_relevant']:.3f} | "
                f"{d['vote_correlation_random']:.3f} | {d['mean_votes_relevant']:.1f} |"
            )
    return "\n".join(out).rstrip("\n") + "\n"


def curve_rows(doc: dict[str, Any], probe: int, scoring: str) -> list[dict[str, Any]]:
    """The rows of part ``all`` at ``probe`` and ``scoring``, by ascending M."""
    rows = [
        r
        for r in doc["rows"]
        if r["probe"] == probe and r["scoring"] == scoring and r["part"] == "all"
    ]
    return sorted(rows, key=lambda r: r["n_models"])


def render_curve(doc: dict[str, Any], probe: int, scoring: str) -> str:
    """Markdown: the M curve at one (t, scoring): each trained forest and each twin (mean of
    seeds), nDCG@10 / Recall@100, and each trained forest minus the strongest twin (p)."""
    rows = curve_rows(doc, probe, scoring)
    names = _names(rows, "mean")
    trained = _names(rows, "vs_strongest_twin")
    label = f"{doc['label']}: " if doc.get("label") else ""
    out = [
        f"{label}nDCG@10 / Recall@100 against M, C = {doc['n_classes']}, t = {probe}, scoring "
        f"`{scoring}`, all {rows[0]['n_queries'] if rows else 0} queries; twins: mean of seeds "
        f"{doc['twin_seeds']}; delta (p): trained minus the strongest twin of the row, paired "
        "randomization test.",
        "",
        "| M | cosine | "
        + " | ".join(names)
        + " | strongest twin | "
        + " | ".join(f"{v} - twin, nDCG@10 (p) | R@100 (p)" for v in trained)
        + " |",
        "|" + "---|" * (2 + len(names) + 1 + 2 * len(trained)),
    ]
    for r in rows:
        cells = [
            str(r["n_models"]),
            f"{r['cosine']['ndcg@10']:.3f} / {r['cosine']['recall@100']:.3f}",
        ]
        for n in names:
            mm = r["mean"].get(n)
            cells.append(f"{mm['ndcg@10']:.3f} / {mm['recall@100']:.3f}" if mm else "-")
        cells.append(r["strongest_twin"])
        for v in trained:
            d = r["vs_strongest_twin"].get(v)
            for metric in METRICS:
                cells.append(f"{d[metric]['delta']:+.3f} ({d[metric]['p']:.3g})" if d else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot_curve(doc: dict[str, Any], probe: int, scoring: str, path: Path) -> None:
    """nDCG@10 and Recall@100 against M (log 2) for every forest at ``probe`` / ``scoring``,
    cosine as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from treerank.atomic import atomic_savefig

    rows = curve_rows(doc, probe, scoring)
    names = _names(rows, "mean")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, METRICS, strict=True):
        for i, n in enumerate(names):
            pts = [(r["n_models"], r["mean"][n][metric]) for r in rows if n in r["mean"]]
            style = "--" if n.startswith("twin-") else "-"
            ax.plot(*zip(*pts, strict=True), style, marker="o", ms=3, color=f"C{i}", label=n)
        ax.axhline(rows[0]["cosine"][metric], color="k", ls=":", lw=1, label="cosine")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (models)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    label = doc.get("label") or "forest"
    fig.suptitle(f"{label}: trained forests vs untrained twins, t = {probe}, {scoring}")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)


if __name__ == "__main__":
    # subnormal gradients slow CPU GEMMs ~30x and change nothing here; the flag is process-wide
    # (it breaks float32 round trips elsewhere), so it is set for the script, never by main()
    torch.set_flush_denormal(True)
    main()
