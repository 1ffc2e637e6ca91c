"""Zero-shot transfer of several seeds' tuned query towers to other collections (issue 35).

Each run's tower re-encodes another collection's queries (the passage vectors stay the store's
own: the tower was trained against the same encoder's vectors). The towers' per-query metrics,
averaged over the seeds, are tested against frozen cosine on every passage of that split
(paired randomization test and bootstrap 95% CI over the queries: they resample queries, not
seeds, so a verdict holds for these towers, and the seeds' spread is reported beside it), and
each seed alone (descriptive rows; the seed mean is the one primary verdict). The reading is the
non-inferiority rule of ``bench/results/trainingdata/README.md`` section D, margin -0.01
nDCG@10 (:func:`verdict`). :func:`render` gives the page's table.

Usage (docs/finetune.md, "Zero-shot transfer of the three seeds' towers"):

    python scripts/experiments/qt_transfer_seeds.py \
        --run runs/s2q/query-tower-seed0 --run runs/s2q/query-tower-seed1 \
        --run runs/s2q/query-tower-seed2 \
        --target "DL19 pool=stores/dl19/test" --target "SciFact test=stores/scifact/test" \
        --work runs/qt-transfer-seeds --out docs/results/scale2_squad_query_tower_transfer.json
    python scripts/experiments/qt_transfer_seeds.py --render \
        docs/results/scale2_squad_query_tower_transfer.json

Each target writes its re-embedded stores and run files under ``WORK/<n>/`` (``<n>``: the
target's position).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ARM = "query-tower"
METRICS = ("ndcg@10", "mrr@10", "recall@100")
MARGIN = -0.01  # nDCG@10
RULE_SOURCE = "bench/results/trainingdata/README.md, section D"


def verdict(ci_low: float, ci_high: float, margin: float = MARGIN) -> str:
    """Section D's reading of a paired 95% CI of (tower - cosine), checked in this order:
    ``better`` (lower bound above 0); ``non-inferior`` (lower bound above ``margin``), or
    ``non-inferior, worse`` when the upper bound is below 0 too (a loss smaller than the
    margin, yet a loss); ``inferior`` (upper bound below 0, lower bound at or below the
    margin); else ``not shown`` (the CI reaches past the margin and above 0). Strict
    inequalities throughout."""
    if ci_low > 0:
        return "better"
    if ci_low > margin:
        return "non-inferior" if ci_high >= 0 else "non-inferior, worse"
    if ci_high < 0:
        return "inferior"
    return "not shown"


def _cell(t: dict[str, float]) -> str:
    return f"{t['delta']:+.4f} ({t['ci_low']:+.4f} .. {t['ci_high']:+.4f}) | {t['p']:.4f}"


def render(doc: dict[str, Any]) -> str:
    """The page's table (nDCG@10; per target the seed mean, with the seeds' standard deviation,
    then each seed), then each target's cost line and the run's peak RSS."""
    seeds = " / ".join(str(s) for s in doc["seeds"])
    lines = [
        f"nDCG@10, towers of seeds {seeds} (each trained on {doc['n_train_queries']:,} SQuAD "
        "train questions); the mean row averages each query's metric over the seeds (in "
        "brackets: the standard deviation of the seeds' means):",
        "",
        "| target | queries | passages | frozen cosine | tower | tower - cosine (95% CI) | p "
        "| section D |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["targets"]:
        std = f" ({t['seed_std']['ndcg@10']:.4f})"
        rows = [("mean", t["mean"], std)]
        rows += [(f"seed {s}", t["per_seed"][str(s)], "") for s in doc["seeds"]]
        for label, r, extra in rows:
            test = r["vs_cosine"]["ndcg@10"]
            lines.append(
                f"| {t['name']}, {label} | {t['n_queries']:,} | {t['n_passages']:,} "
                f"| {t['cosine']['ndcg@10']:.4f} | {r['systems']['ndcg@10']:.4f}{extra} "
                f"| {_cell(test)} | {verdict(test['ci_low'], test['ci_high'])} |"
            )
    lines.append("")
    for t in doc["targets"]:
        cost = t["cost"]
        lines.append(
            f"- {t['name']}: building its {len(doc['seeds'])} re-embedded stores (loading each "
            f"tower, encoding the {t['n_queries']:,} queries, copying the passage vectors) took "
            f"{cost['reembed_cpu_seconds']:.1f} CPU-s, the evaluation "
            f"{cost['evaluate_cpu_seconds']:.1f} CPU-s."
        )
    lines.append(
        f"- Peak RSS of the whole run (one process): {doc['peak_rss_mib'] / 1024:.1f} GiB."
    )
    return "\n".join(lines)


def _target(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--target {spec!r}: expected NAME=STORE_SPLIT")
    return name, Path(path)


def run_targets(
    runs: list[Path], targets: list[tuple[str, Path]], work: Path, permutations: int
) -> dict[str, Any]:
    """Re-embed every target's queries with every run's tower and compare (see the module
    docstring); returns the results document."""
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.pipeline.finetune import (
        TunedStoreSystem,
        cost_clock,
        cost_since,
        paired_summary,
        reembed_split,
    )
    from treerank.search.faiss_index import peak_rss_mib
    from treerank.store import EmbeddingStore
    from treerank.training.finetune import FINETUNE_JSON

    infos = [json.loads((r / FINETUNE_JSON).read_text(encoding="utf-8")) for r in runs]
    for run, info in zip(runs, infos, strict=True):
        if info["config"]["family"] != ARM:
            raise SystemExit(f"error: {run} is a {info['config']['family']} run, not {ARM}")
    seeds = [int(i["config"]["seed"]) for i in infos]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"error: two runs share a seed: {seeds}")
    trained = {int(i["summary"]["rows_trained"]) for i in infos}
    if len(trained) != 1:
        raise SystemExit(f"error: the runs trained on different numbers of questions: {trained}")
    if any(i["trained_on"] != infos[0]["trained_on"] for i in infos):
        raise SystemExit("error: the runs were trained on different stores (trained_on)")
    settings = EvaluationSettings(n_permutations=permutations, baseline="cosine")
    out: list[dict[str, Any]] = []
    for n, (name, split) in enumerate(targets):
        parent = EmbeddingStore.open(split)
        t0 = cost_clock()
        systems: dict[str, Any] = {"cosine": "cosine"}
        group: dict[str, int] = {}
        for run, seed in zip(runs, seeds, strict=True):
            tuned = reembed_split(run, parent, work / str(n) / f"seed{seed}", overwrite=True)
            systems[f"{ARM}@seed{seed}"] = TunedStoreSystem(tuned, f"{ARM}@seed{seed}")
            group[f"{ARM}@seed{seed}"] = seed
        reembed = cost_since(t0)
        t1 = cost_clock()
        comp = compare_systems(
            parent,
            systems,
            settings=settings,
            out_dir=work / str(n) / "eval",
            seed_groups={ARM: group},
        )
        evaluate = cost_since(t1)
        if comp.failed:
            raise SystemExit(f"error: {name}: systems failed: {comp.failed}")
        tests = comp.tests["cosine"]

        def row(system: str, tests: Any = tests, comp: Any = comp) -> dict[str, Any]:
            return {
                "systems": {m: float(comp.results[system].mean[m]) for m in METRICS},
                "vs_cosine": {
                    m: v for m, v in paired_summary(tests[system]).items() if m in METRICS
                },
            }

        out.append(
            {
                "name": name,
                "store": str(split),
                "n_queries": int(parent.n_queries),
                "n_passages": int(parent.n_passages),
                # zero-shot: no query or passage of this collection was trained on
                "seen_unseen": {"n_seen": 0, "n_unseen": int(parent.n_queries)},
                "cosine": {m: float(comp.results["cosine"].mean[m]) for m in METRICS},
                "mean": row(ARM),
                "seed_std": {m: float(v) for m, v in comp.seed_spread[ARM]["std"].items()},
                "per_seed": {str(s): row(f"{ARM}@seed{s}") for s in seeds},
                "run_files": str(work / str(n) / "eval"),
                "cost": {
                    "reembed_cpu_seconds": reembed["cpu_seconds"],
                    "reembed_wall_seconds": reembed["wall_seconds"],
                    "evaluate_cpu_seconds": evaluate["cpu_seconds"],
                    "evaluate_wall_seconds": evaluate["wall_seconds"],
                },
            }
        )
    return {
        "issue": 35,
        "what": "zero-shot transfer of several seeds' tuned query towers, seed mean and each seed",
        "runs": [str(r) for r in runs],
        "seeds": seeds,
        "trained_on": infos[0]["trained_on"],
        "n_train_queries": trained.pop(),
        "rule": {"metric": "ndcg@10", "margin": MARGIN, "source": RULE_SOURCE},
        "evaluation": {"n_permutations": permutations, "seed": settings.seed, "ci": 0.95},
        "targets": out,
        "peak_rss_mib": round(peak_rss_mib(), 1),  # the process's high-water mark, all targets
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", type=Path, help="print the table of a results JSON and exit")
    ap.add_argument(
        "--run", type=Path, action="append", default=[], help="a query-tower run (repeat)"
    )
    ap.add_argument(
        "--target",
        type=_target,
        action="append",
        default=[],
        metavar="NAME=STORE/SPLIT",
        help="a label and a store split of the towers' encoder (repeat), e.g. "
        "'DL19 pool=stores/dl19/test'",
    )
    ap.add_argument("--work", type=Path, help="folder for the re-embedded stores and run files")
    ap.add_argument("--out", type=Path, help="the results JSON")
    ap.add_argument("--permutations", type=int, default=10_000, help="randomization-test draws")
    args = ap.parse_args(argv)
    if args.render is not None:
        print(render(json.loads(args.render.read_text(encoding="utf-8"))))
        return 0
    if not args.run or not args.target or args.work is None or args.out is None:
        ap.error("--run, --target, --work and --out are needed (or --render JSON)")
    for path in [*args.run, *(p for _, p in args.target)]:
        if not path.is_dir():
            ap.error(f"{path}: no such folder")
    from treerank.training.finetune import FINETUNE_JSON

    for run in args.run:
        if not (run / FINETUNE_JSON).is_file():
            ap.error(f"{run}: no {FINETUNE_JSON} (not a finished `treerank finetune` run)")
    from treerank.atomic import atomic_write_json

    doc = run_targets(args.run, args.target, args.work, args.permutations)
    atomic_write_json(args.out, doc, indent=1)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
