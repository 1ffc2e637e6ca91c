"""The DRT seed's Scale-2 comparison over several training seeds (pairs of `treerank finetune`
runs: one `biencoder` and one `drt-e2e` run per seed, equal budget and data; or, with
``--arms query-tower drt-query-tower``, the query-side variant's pairs of
scripts/scale2_query_side.py).

Usage (docs/finetune.md, "Scale 2"):

    python scripts/finetune_scale2_seeds.py --store stores/scifact \
        --pair runs/ft-scifact-bi-s2 runs/ft-scifact-drt-e2e \
        --pair runs/s2-bi-seed1 runs/s2-drt-seed1 --pair runs/s2-bi-seed2 runs/s2-drt-seed2 \
        --out docs/results/scale2_scifact_seeds.json

Each run's re-embedded evaluation store is scored (the DRT arm's runs by their heads,
``ckpt:RUN/drt_head``); ``treerank.evaluation.compare.compare_systems`` averages each arm's
per-query metrics over its seeds (``seed_groups``), tests both means against frozen cosine,
and this script tests the drt-e2e mean against the bi-encoder mean (paired randomization
test and bootstrap 95% CI over the queries), on all queries and on the seen / unseen parts (a
relevant passage cited by a training query or not; an empty part is left out). The DRT arm's
encoder without its heads (cosine over its own vectors, ``<DRT arm>-encoder``) is tested
against frozen cosine and against the heads: where a loss sits. The
per-seed means and their spread are in ``seed_spread``. :func:`render` gives the page's table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BI_ARM, DRT_ARM = "biencoder", "drt-e2e"
METRICS = ("ndcg@10", "mrr@10", "recall@100")


def _cell(t: Any) -> dict[str, float]:
    return {"delta": t.delta, "p": t.p_randomization, "ci_low": t.ci_low, "ci_high": t.ci_high}


def render(doc: dict[str, Any]) -> str:
    """The page's Markdown: nDCG@10 per seed and the mean over seeds, the DRT arm minus the
    cosine arm (``doc["arms"]``, default biencoder and drt-e2e)."""
    m = "ndcg@10"
    sp = doc["seed_spread"]
    BI, DRT = doc.get("arms", (BI_ARM, DRT_ARM))
    lines = [
        f"nDCG@10 on all {doc['parts']['all']['n']} evaluation queries, per training seed:",
        "",
        f"| seed | frozen cosine | {BI} | {DRT} (heads) | {DRT} - {BI} |",
        "|---|---|---|---|---|",
    ]
    cos = doc["systems"]["cosine"][m]
    for i, seed in enumerate(sp[BI]["seeds"]):
        b, d = sp[BI]["per_seed"][m][i], sp[DRT]["per_seed"][m][i]
        lines.append(f"| {seed} | {cos:.4f} | {b:.4f} | {d:.4f} | {d - b:+.4f} |")
    lines += [
        "",
        f"Mean over the {len(sp[BI]['seeds'])} seeds (per-query metrics averaged over seeds, "
        "paired over the queries; std over the seeds' means):",
        "",
        f"| nDCG@10 | queries | frozen cosine | {BI} (std) | {DRT} (std) "
        f"| {DRT} - {BI} (95% CI) | p | {BI} - cosine (95% CI) | p |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for part in _parts(doc):
        row = doc["parts"][part]
        t, c = row["drt_vs_bi"], row["bi_vs_cosine"]
        std = tuple(
            f" ({sp[a]['std'][m]:.4f})" if part == "all" and sp[a]["std"][m] is not None else ""
            for a in (BI, DRT)
        )
        lines.append(
            f"| {part} | {row['n']} | {row['cosine']:.4f} | {row[BI]:.4f}{std[0]} "
            f"| {row[DRT]:.4f}{std[1]} | {_cell_text(t)} | {_cell_text(c)} |"
        )
    if "drt_encoder" in doc["parts"]["all"]:
        lines += _render_drt_encoder(doc, DRT)
    if doc.get("cka"):
        lines += _render_cka(doc["cka"], BI, DRT)
    if doc.get("cost"):
        lines += _render_costs(doc["cost"])
    return "\n".join(lines)


def run_costs(pairs: list[list[Path]]) -> list[dict[str, Any]]:
    """Each run's training cost from its ``finetune.json`` (``summary.cost``: CPU-s, wall-s,
    peak RSS MiB, tokens, threads), its training loss (the trainer's mean over the run, and
    the last logged record: the mean over the last ``logging_steps`` steps; the DRT arms' loss
    includes ``lambda_dec`` x slot decorrelation) and, where ``scripts/scale2_query_side.py``
    wrote one, its ``cost.json``'s re-embedding of the evaluation split; with the training-set
    counts (``training_queries`` in the run's batch plan, ``rows_trained`` = steps x batch).

    Raises:
        FileNotFoundError: a run without ``finetune.json`` (not a finished fine-tune).
    """
    from treerank.training.finetune import FINETUNE_JSON

    rows = []
    for pair in pairs:
        for run in pair:
            ft = json.loads((Path(run) / FINETUNE_JSON).read_text(encoding="utf-8"))
            extra = Path(run) / "cost.json"
            reembed = None
            if extra.is_file():
                reembed = json.loads(extra.read_text(encoding="utf-8")).get("reembed_eval_split")
            rows.append(
                {
                    "run": str(run),
                    "family": ft["config"]["family"],
                    "seed": int(ft["config"]["seed"]),
                    "steps": int(ft["summary"]["steps"]),
                    "training_queries": ft["summary"].get("training_queries"),
                    "rows_trained": ft["summary"].get("rows_trained"),
                    "train": ft["summary"]["cost"],
                    "train_loss": ft["summary"].get("train_loss"),
                    "last_log": (ft["summary"].get("log") or [None])[-1],
                    "reembed_eval_split": reembed,
                }
            )
    return rows


def _render_costs(costs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Cost and loss per run (this process only; CPU-s at the run's thread count, peak RSS; "
        "training loss: the mean over the run and the last logged value, the mean over the "
        "last logging window; a DRT arm's loss includes its slot-decorrelation term):",
        "",
        "| run | family | seed | steps | train CPU-s | wall s | peak RSS GiB | re-embed CPU-s "
        "| mean loss | last logged loss (step) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in costs:
        t, r, last = c["train"], c["reembed_eval_split"], c.get("last_log")
        mean = c.get("train_loss")
        last_text = "-" if not last else f"{last['loss']:.4f} ({last['step']})"
        lines.append(
            f"| `{Path(c['run']).name}` | {c['family']} | {c['seed']} | {c['steps']} "
            f"| {t['cpu_seconds']:.0f} | {t['wall_seconds']:.0f} | {t['peak_rss_mib'] / 1024:.1f} "
            f"| {'-' if r is None else format(r['cpu_seconds'], '.0f')} "
            f"| {'-' if mean is None else format(mean, '.4f')} "
            f"| {last_text} |"
        )
    return lines


def _parts(doc: dict[str, Any]) -> list[str]:
    """The parts a table shows: all, seen, unseen; without a seen part (e.g. SQuAD dev, whose
    paragraphs no training question has) the unseen part is all the queries, and is left out."""
    parts = [p for p in ("all", "seen", "unseen") if p in doc["parts"]]
    return parts if "seen" in parts else ["all"]


def _cell_text(c: dict[str, float]) -> str:
    return f"{c['delta']:+.4f} ({c['ci_low']:+.4f} .. {c['ci_high']:+.4f}) | {c['p']:.4f}"


def _render_drt_encoder(doc: dict[str, Any], drt: str) -> list[str]:
    """The DRT arm's encoder without its heads (cosine over its own vectors) against frozen
    cosine, and the heads against that encoder: where a loss sits (the seed's "drift, not
    damage" question)."""
    sp = doc["seed_spread"].get(f"{drt}-encoder")
    lines = [
        "",
        f"The {drt} arm's encoder without its heads (cosine over its own vectors), per-query "
        "metrics averaged over the seeds as above:",
        "",
        f"| nDCG@10 | queries | frozen cosine | {drt} encoder, cosine (std) "
        "| encoder - cosine (95% CI) | p | heads - encoder (95% CI) | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for part in _parts(doc):
        row = doc["parts"][part]
        sd = sp["std"]["ndcg@10"] if sp else None
        std = f" ({sd:.4f})" if part == "all" and sd is not None else ""
        lines.append(
            f"| {part} | {row['n']} | {row['cosine']:.4f} | {row['drt_encoder']:.4f}{std} "
            f"| {_cell_text(row['drt_encoder_vs_cosine'])} "
            f"| {_cell_text(row['drt_vs_drt_encoder'])} |"
        )
    return lines


def _render_cka(cka: list[dict[str, Any]], bi: str, drt: str) -> list[str]:
    """The CKA table: per seed (``a / b / c``) for raw vectors and concatenated slots, the
    mean over seeds for each slot."""
    seeds = " / ".join(str(c["seed"]) for c in cka)
    lines = [
        "",
        f"CKA table (linear CKA on the evaluation split's items, seeds {seeds}; slots: the "
        f"{drt} heads applied to both vector sets):",
        "",
        "| comparison | passages | queries |",
        "|---|---|---|",
    ]

    def per_seed(side: str, key: str, sub: str | None = None) -> str:
        vals = [c[side][key] if sub is None else c[side][key][sub] for c in cka]
        return " / ".join(f"{v:.4f}" for v in vals)

    for key, what in (
        ("raw_bi_vs_drt", f"raw vectors, {bi} vs {drt} encoder"),
        ("raw_frozen_vs_bi", f"raw vectors, frozen vs {bi}"),
        ("raw_frozen_vs_drt", f"raw vectors, frozen vs {drt} encoder"),
    ):
        lines.append(f"| {what} | {per_seed('passages', key)} | {per_seed('queries', key)} |")
    for key, what in (("slots_bi_vs_drt", bi), ("slots_frozen_vs_drt", "frozen")):
        lines.append(
            f"| concatenated slots, {what} vs {drt} vectors "
            f"| {per_seed('passages', key, 'concatenated')} "
            f"| {per_seed('queries', key, 'concatenated')} |"
        )
        means = {
            side: [
                sum(c[side][key]["slots"][i] for c in cka) / len(cka)
                for i in range(len(cka[0][side][key]["slots"]))
            ]
            for side in ("passages", "queries")
        }
        lines.append(
            f"| each slot (mean over seeds), {what} vs {drt} vectors | "
            + " / ".join(f"{x:.4f}" for x in means["passages"])
            + " | "
            + " / ".join(f"{x:.4f}" for x in means["queries"])
            + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="the frozen store root")
    ap.add_argument(
        "--pair", nargs=2, action="append", type=Path, required=True, metavar=("BI", "DRT")
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="test")
    ap.add_argument("--permutations", type=int, default=10_000)
    ap.add_argument(
        "--arms",
        nargs=2,
        default=[BI_ARM, DRT_ARM],
        metavar=("COSINE_ARM", "DRT_ARM"),
        help="the pair's families: biencoder drt-e2e, or query-tower drt-query-tower",
    )
    args = ap.parse_args(argv)
    BI, DRT = args.arms

    from treerank.atomic import atomic_write_json
    from treerank.diagnostics.drift import scale2_cka_table
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.overlap import seen_positive_mask
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.evaluation.significance import compare_paired
    from treerank.models.registry import load_model
    from treerank.pipeline.finetune import TunedStoreSystem
    from treerank.store.embedding_store import EmbeddingStore
    from treerank.training.finetune import DRT_HEAD_DIR, FINETUNE_JSON

    systems: dict[str, Any] = {"cosine": "cosine"}
    tuned: dict[int, dict[str, Any]] = {}  # seed -> arm -> (run, re-embedded store)
    ENC = f"{DRT}-encoder"  # the DRT arm's own encoder scored by cosine: the heads taken off
    groups: dict[str, dict[str, int]] = {BI: {}, DRT: {}, ENC: {}}
    configs: dict[str, Any] = {}
    for bi_run, drt_run in args.pair:
        for arm, run in ((BI, bi_run), (DRT, drt_run)):
            need = run / "stores" / args.eval_split / "meta.json"
            if not need.is_file():
                print(f"error: {run}: {need} missing (a finished finetune run?)")
                return 2
            ft = json.loads((run / FINETUNE_JSON).read_text(encoding="utf-8"))
            if ft["config"]["family"] != arm:
                print(f"error: {run} is a {ft['config']['family']} run, expected {arm}")
                return 2
            seed = int(ft["config"]["seed"])
            cfg = {k: v for k, v in ft["config"].items() if k != "seed"}  # and the trainer's:
            cfg["trainer"] = {k: v for k, v in cfg["trainer"].items() if k != "seed"}
            configs.setdefault(arm, cfg)
            if cfg != configs[arm]:
                print(
                    f"error: {run}: its config differs from the other {arm} runs' beyond the seed"
                )
                return 2
            name = f"{arm}@seed{seed}"
            store = EmbeddingStore.open(run / "stores" / args.eval_split)
            tuned.setdefault(seed, {})[arm] = (run, store)
            inner = f"ckpt:{run / DRT_HEAD_DIR}" if arm == DRT else "cosine"
            systems[name] = TunedStoreSystem(store, name, inner)
            groups[arm][name] = seed
            if arm == DRT:
                enc = f"{ENC}@seed{seed}"
                systems[enc] = TunedStoreSystem(store, enc, "cosine")
                groups[ENC][enc] = seed
    if sorted(groups[BI].values()) != sorted(groups[DRT].values()):
        print(f"error: the arms' seeds differ: {groups}")
        return 2
    frozen = EmbeddingStore.open(args.store / args.eval_split)
    train = EmbeddingStore.open(args.store / args.train_split)
    settings = EvaluationSettings().with_(baseline="cosine", n_permutations=args.permutations)
    comp = compare_systems(
        frozen, systems, settings=settings, train_store=train, seed_groups=groups
    )
    if comp.failed:
        print(f"error: systems failed: {comp.failed}")
        return 1
    seen = seen_positive_mask(frozen, train)
    parts: dict[str, Any] = {}
    res = comp.results
    for part, mask in (("all", None), ("seen", seen), ("unseen", ~seen)):
        if mask is not None and not mask.any():
            continue  # e.g. SQuAD dev: no question's paragraph is a training question's

        def pq(name: str, mask: Any = mask) -> dict[str, Any]:
            return {
                m: (v if mask is None else v[mask])
                for m, v in res[name].per_query.items()
                if m in METRICS
            }

        t = compare_paired(pq(DRT), pq(BI), METRICS, args.permutations, args.permutations, 0)
        c = compare_paired(pq(BI), pq("cosine"), METRICS, args.permutations, args.permutations)
        e = compare_paired(pq(ENC), pq("cosine"), METRICS, args.permutations, args.permutations)
        h = compare_paired(pq(DRT), pq(ENC), METRICS, args.permutations, args.permutations)
        parts[part] = {
            "n": int(len(next(iter(pq("cosine").values())))),
            "cosine": float(pq("cosine")["ndcg@10"].mean()),
            BI: float(pq(BI)["ndcg@10"].mean()),
            DRT: float(pq(DRT)["ndcg@10"].mean()),
            "drt_vs_bi": _cell(t["ndcg@10"]),
            "bi_vs_cosine": _cell(c["ndcg@10"]),
            "drt_vs_bi_all_metrics": {m: _cell(x) for m, x in t.items()},
            "drt_encoder": float(pq(ENC)["ndcg@10"].mean()),
            "drt_encoder_vs_cosine": _cell(e["ndcg@10"]),
            "drt_vs_drt_encoder": _cell(h["ndcg@10"]),
        }
    cka = []  # the seed's CKA table of each pair, on the evaluation split's items
    for seed in sorted(tuned):
        drt_run, drt_store = tuned[seed][DRT]
        head = load_model(
            drt_run / DRT_HEAD_DIR, expected_fingerprint=drt_store.encoder_fingerprint
        )
        cka.append({"seed": seed, **scale2_cka_table(head, frozen, tuned[seed][BI][1], drt_store)})
    doc = {
        "arms": [BI, DRT],
        "cka": cka,
        "pairs": [[str(b), str(d)] for b, d in args.pair],
        "cost": run_costs(args.pair),
        "store": str(args.store),
        "eval_split": args.eval_split,
        "configs": configs,
        "systems": {n: {m: float(r.mean[m]) for m in METRICS} for n, r in res.items()},
        "seed_spread": {arm: comp.seed_spread[arm] for arm in (BI, DRT, ENC)},
        "parts": parts,
        "n_permutations": args.permutations,
    }
    atomic_write_json(args.out, doc, indent=1)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
