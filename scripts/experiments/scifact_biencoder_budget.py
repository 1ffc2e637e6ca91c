"""Issue 35's SciFact `biencoder` target at its budget (about 30 CPU-min on a quiet core): the
fine-tuned encoders against their untrained twin (frozen cosine) and against the best
frozen-vector model of the same data (the main job's `linear-sources` head), on all 300 test
claims and on the seen / unseen parts.

Usage (docs/finetune.md, "SciFact `biencoder` at the issue's budget"):

    treerank finetune configs/finetune/scifact_biencoder_budget.yaml --store stores/scifact \
        -o runs/ft-scifact-bi-budget
    treerank finetune configs/finetune/scifact_biencoder_budget_hard.yaml --store stores/scifact \
        -o runs/ft-scifact-bi-budget-hard
    treerank run configs/scifact_linear_sources.yaml
    python scripts/experiments/scifact_biencoder_budget.py --store stores/scifact \
        --head runs/scifact-linear-sources/models/scifact/linear-sources/checkpoint \
        --run runs/ft-scifact-bi-budget --run runs/ft-scifact-bi-budget-hard \
        --out docs/results/scifact_biencoder_vs_linear_sources.json

Every system is scored by ``treerank.evaluation.compare.compare_systems`` on the frozen
evaluation split (a fine-tuned run's re-embedded split through ``TunedStoreSystem``), against
all of the split's passages; the paired tests (randomization test, 10,000 permutations, and
a bootstrap 95% CI over the claims) compare each run with cosine and with the head. "Seen":
a relevant abstract of the claim is a relevant abstract of a training claim
(``seen_positive_mask``). The verdict against the head is the transfer table's rule
(``qt_transfer_seeds.verdict``: better, non-inferior at margin -0.01, non-inferior but worse,
inferior, not shown). Each run after the first is also paired against the first (``vs_first``:
the runs differ in more than one setting, so this is a description, not an ablation).
:func:`render` gives the page's table; ``tests/test_finetune_doc.py`` checks the page holds it.

Refused before any work (exit 2): a run folder without ``results.json`` or its re-embedded
evaluation split, a store without the train or evaluation split, a head folder without a
checkpoint, and two runs with one folder name or a run named like a reference system.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

METRICS = ("ndcg@10", "mrr@10", "recall@100")
HEAD = "linear-sources"
PARTS = ("all", "seen", "unseen")
RESERVED = ("cosine", "bm25", HEAD)


def _verdict_rule() -> Any:
    """``qt_transfer_seeds.verdict``: one CI rule for every comparison against a reference."""
    path = Path(__file__).with_name("qt_transfer_seeds.py")
    spec = importlib.util.spec_from_file_location("qt_transfer_seeds", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.verdict


def _cell(t: Any) -> dict[str, Any]:
    return {
        "delta": t.delta,
        "p": t.p_randomization,
        "ci_low": t.ci_low,
        "ci_high": t.ci_high,
        "wins": t.wins,
        "losses": t.losses,
    }


def _ci(c: dict[str, Any]) -> str:
    return f"{c['delta']:+.4f} ({c['ci_low']:+.4f} .. {c['ci_high']:+.4f})"


def render(doc: dict[str, Any]) -> str:
    """The page's Markdown: nDCG@10 of cosine, the head and every run on each part, each run
    against cosine and against the head (delta, 95% CI, p, verdict), then each run's cost."""
    runs = [r["name"] for r in doc["runs"]]
    head = doc["head"]["name"]
    lines = [
        f"| nDCG@10 | claims | frozen cosine | `{head}` | "
        + " | ".join(f"`{r}`" for r in runs)
        + " |",
        "|---|---:|---:|---:|" + "---:|" * len(runs),
    ]
    for part in PARTS:
        row = doc["parts"][part]
        lines.append(
            f"| {part} | {row['n']} | {row['cosine']:.4f} | {row[head]:.4f} | "
            + " | ".join(f"{row['runs'][r]['mean']:.4f}" for r in runs)
            + " |"
        )
    lines += [
        "",
        "| run | claims | - cosine (95% CI) | p | - `" + head + "` (95% CI) | p | "
        "wins / losses vs the head | verdict vs the head |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for r in runs:
        for part in PARTS:
            c = doc["parts"][part]["runs"][r]
            vc, vh = c["vs_cosine"], c["vs_head"]
            lines.append(
                f"| `{r}` | {part} | {_ci(vc)} | {vc['p']:.4f} | {_ci(vh)} | {vh['p']:.4f} "
                f"| {vh['wins']} / {vh['losses']} | {c['verdict_vs_head']} |"
            )
    lines += [
        "",
        "| run | epochs | hard negatives | steps | trainer CPU-s | wall s | peak RSS GiB "
        "| tokens | re-embed CPU-s | total CPU-min |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        t, c = r["cost"]["train"], r["cost"]
        lines.append(
            f"| `{r['name']}` | {r['epochs']} | {r['hard_negatives']} | {r['steps']} "
            f"| {t['cpu_seconds']:.0f} | {t['wall_seconds']:.0f} "
            f"| {t['peak_rss_mib'] / 1024:.1f} | {t['tokens']:,} "
            f"| {c['reembed_cpu_seconds']:.0f} | {c['total_cpu_seconds'] / 60:.1f} |"
        )
    first = runs[0]
    later = [r for r in runs[1:] if "vs_first" in doc["parts"]["all"]["runs"][r]]
    if later:
        lines += [
            "",
            f"| run | claims | - `{first}` (95% CI) | p | wins / losses |",
            "|---|---|---|---:|---:|",
        ]
        for r in later:
            for part in PARTS:
                v = doc["parts"][part]["runs"][r]["vs_first"]
                lines.append(
                    f"| `{r}` | {part} | {_ci(v)} | {v['p']:.4f} | {v['wins']} / {v['losses']} |"
                )
    return "\n".join(lines)


def _refusal(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot be scored, or ``None``: checked before any work."""
    for run in args.run:
        for need in (run / "results.json", run / "stores" / args.eval_split / "meta.json"):
            if not need.is_file():
                return f"{run}: {need} missing (a finished finetune run?)"
    names = [run.name for run in args.run]
    for name in names:
        if names.count(name) > 1:
            return f"two runs are named {name!r} (their folders' names key the systems)"
        if name in RESERVED:
            return f"a run is named {name!r}, the name of a reference system"
    for split in (args.train_split, args.eval_split):
        if not (args.store / split / "meta.json").is_file():
            return f"{args.store / split}: no store split (meta.json missing)"
    if not (args.head / "config.json").is_file():
        return f"{args.head}: not a checkpoint folder (config.json missing)"
    return None


def _run_record(run: Path) -> dict[str, Any]:
    """A finished fine-tune's name, schedule and cost from its ``results.json``."""
    res = json.loads((run / "results.json").read_text(encoding="utf-8"))
    cfg, cost = res["config"], res["cost"]
    train = cost["train"]
    reembed = float(cost["reembed"]["cpu_seconds"])
    return {
        "name": run.name,
        "run": str(run),
        "family": cfg["family"],
        "seed": int(cfg["seed"]),
        "epochs": cfg["data"]["epochs"],
        "hard_negatives": cfg["data"]["hard_negatives"],
        "lr": cfg["trainer"]["lr"],
        "steps": int(res["training"]["steps"]),
        "cost": {
            "train": {
                "cpu_seconds": float(train["cpu_seconds"]),
                "wall_seconds": float(train["wall_seconds"]),
                "peak_rss_mib": float(train["peak_rss_mib"]),
                "tokens": int(train["tokens"]),
                "threads": train.get("threads"),
            },
            "reembed_cpu_seconds": reembed,
            "total_cpu_seconds": float(cost["total"]["cpu_seconds"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="the frozen store root")
    ap.add_argument("--head", type=Path, required=True, help="the linear-sources checkpoint")
    ap.add_argument("--run", type=Path, action="append", required=True, help="a finetune run")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="test")
    ap.add_argument("--permutations", type=int, default=10_000)
    args = ap.parse_args(argv)
    refusal = _refusal(args)  # before any work
    if refusal is not None:
        print(f"error: {refusal}")
        return 2
    from treerank.atomic import atomic_write_json
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.overlap import seen_positive_mask
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.evaluation.significance import compare_paired
    from treerank.pipeline.finetune import TunedStoreSystem
    from treerank.store.embedding_store import EmbeddingStore

    verdict = _verdict_rule()
    runs = [_run_record(r) for r in args.run]
    systems: dict[str, Any] = {"cosine": "cosine", "bm25": "bm25", HEAD: f"ckpt:{args.head}"}
    for rec, run in zip(runs, args.run, strict=True):
        tuned = EmbeddingStore.open(run / "stores" / args.eval_split)
        systems[rec["name"]] = TunedStoreSystem(tuned, rec["name"], "cosine")
    frozen = EmbeddingStore.open(args.store / args.eval_split)
    train = EmbeddingStore.open(args.store / args.train_split)
    settings = EvaluationSettings().with_(baseline="cosine", n_permutations=args.permutations)
    comp = compare_systems(frozen, systems, settings=settings, train_store=train)
    if comp.failed:
        print(f"error: systems failed: {comp.failed}")
        return 1
    res = comp.results
    seen = seen_positive_mask(frozen, train)
    parts: dict[str, Any] = {}
    for part, mask in (("all", None), ("seen", seen), ("unseen", ~seen)):

        def pq(name: str, mask: Any = mask) -> dict[str, Any]:
            return {
                m: (v if mask is None else v[mask])
                for m, v in res[name].per_query.items()
                if m in METRICS
            }

        n = args.permutations
        row: dict[str, Any] = {
            "n": int(len(pq("cosine")["ndcg@10"])),
            "cosine": float(pq("cosine")["ndcg@10"].mean()),
            "bm25": float(pq("bm25")["ndcg@10"].mean()),
            HEAD: float(pq(HEAD)["ndcg@10"].mean()),
            "head_vs_cosine": _cell(
                compare_paired(pq(HEAD), pq("cosine"), METRICS, n, n)["ndcg@10"]
            ),
            "runs": {},
        }
        for rec in runs:
            r = rec["name"]
            vc = _cell(compare_paired(pq(r), pq("cosine"), METRICS, n, n)["ndcg@10"])
            vh = _cell(compare_paired(pq(r), pq(HEAD), METRICS, n, n)["ndcg@10"])
            row["runs"][r] = {
                "mean": float(pq(r)["ndcg@10"].mean()),
                "vs_cosine": vc,
                "vs_head": vh,
                "verdict_vs_head": verdict(vh["ci_low"], vh["ci_high"]),
            }
            if r != runs[0]["name"]:
                vf = compare_paired(pq(r), pq(runs[0]["name"]), METRICS, n, n)["ndcg@10"]
                row["runs"][r]["vs_first"] = _cell(vf)
        parts[part] = row
    doc = {
        "issue": 35,
        "what": "SciFact biencoder at the issue's budget against frozen cosine and linear-sources",
        "store": str(args.store),
        "eval_split": args.eval_split,
        "head": {"name": HEAD, "checkpoint": str(args.head)},
        "runs": runs,
        "systems": {n: {m: float(r.mean[m]) for m in METRICS} for n, r in res.items()},
        "parts": parts,
        "leaks": comp.leaks,  # the head's training queries against the evaluated ones
        "n_permutations": args.permutations,
    }
    atomic_write_json(args.out, doc, indent=1)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
