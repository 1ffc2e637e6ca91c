"""Assemble docs/results/distill_scifact_qt.json from a run of configs/distill_scifact_qt.yaml.

Usage: distill_qt_report.py EVAL_DIR OUT.json [CE_RUN]

CE_RUN (optional) is the cross-encoder teacher's ``treerank finetune`` folder: its training
steps, loss and cost go into the JSON beside the teacher stages' wall time.

EVAL_DIR is the run's evaluation stage directory (``results.json``, ``per_query.jsonl``,
``runs/*.trec``). The paired tests the issue asks for are made here on the per-query values the
run wrote (treerank's randomization test and bootstrap CI): each distilled query tower against
its binary-label twin ``qt-labels``, on all test claims and on the seen / unseen parts (a
relevant abstract cited by a training claim or not; the evaluate stage's rule,
``treerank.evaluation.overlap.seen_positive_mask``). Every reported mean is recomputed with
ir_measures on the run file and the store's source qrels (``qrels.tsv``) and must agree to 1e-6.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ir_measures
import numpy as np

from treerank.atomic import atomic_write_json
from treerank.evaluation.overlap import seen_positive_mask
from treerank.evaluation.significance import compare_paired
from treerank.names import file_name
from treerank.store import EmbeddingStore

TWIN = "qt-labels"
MEASURES = {
    "ndcg@10": ir_measures.nDCG @ 10,
    "mrr@10": ir_measures.RR @ 10,
    "recall@100": ir_measures.R @ 100,
}
KEYS = ("mean_system", "mean_baseline", "delta", "p_randomization", "ci_low", "ci_high")


def _cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next(
        (ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name:")),
        "?",
    )


def main(eval_dir: Path, out: Path, ce_run: Path | None = None) -> None:
    res = json.loads((eval_dir / "results.json").read_text(encoding="utf-8"))
    sys.path.insert(0, str(Path(__file__).parent))
    from distill_squad_report import per_query  # the same reader as the heads' report

    pq = per_query(eval_dir, MEASURES)
    systems = {s: r["mean"] for s, r in res["systems"].items()}
    test = EmbeddingStore.open(res["settings"]["store"])
    train = EmbeddingStore.open(res["settings"]["train_store"])
    qrels_src = test.source_qrels()
    assert qrels_src is not None, f"{test.path}: no qrels.tsv"
    qrels = [ir_measures.Qrel(q, d, int(g)) for q, d, g in qrels_src]
    checked = {}
    for s in systems:  # every mean equals ir_measures on the run file and the source's qrels
        run = list(ir_measures.read_trec_run(str(eval_dir / "runs" / f"{file_name(s)}.trec")))
        agg = ir_measures.calc_aggregate(list(MEASURES.values()), qrels, run)
        for m, meas in MEASURES.items():
            diff = abs(agg[meas] - systems[s][m])
            assert diff < 1e-6, f"{s} {m}: treerank {systems[s][m]} vs ir_measures {agg[meas]}"
        checked[s] = {m: round(float(agg[meas]), 6) for m, meas in MEASURES.items()}
    run_dir = eval_dir.parents[1]
    training = {}
    for st in sorted((run_dir / "finetune").glob("*/*/stage.json")):
        rec = json.loads(st.read_text(encoding="utf-8"))
        summ = rec["summary"]["summary"]
        training[st.parent.name] = {
            "steps": summ["steps"],
            "train_loss": round(summ["train_loss"], 4),
            "training_queries": summ["training_queries"],
            "sources": summ.get("sources"),
            "cpu_seconds": summ["cost"]["cpu_seconds"],
            "peak_rss_mib": summ["cost"]["peak_rss_mib"],
        }
    distilled = [name for name in training if name != TWIN]  # the towers with a teacher
    teacher: dict[str, Any] = {}
    for st in sorted((run_dir / "teacher").glob("*/*/stage.json")):
        rec = json.loads(st.read_text(encoding="utf-8"))
        teacher.setdefault("stages", {})[rec["summary"]["system"]] = {"seconds": rec["seconds"]}
    if ce_run is not None and (ce_run / "results.json").is_file():
        ce = json.loads((ce_run / "results.json").read_text(encoding="utf-8"))["training"]
        keep = ("loss", "steps", "groups", "pairs", "train_loss", "precision", "cost")
        teacher["cross_encoder"] = {"folder": str(ce_run), **{k: ce.get(k) for k in keep}}
    seen = seen_positive_mask(test, train)
    parts = {"all": np.ones_like(seen), "seen": seen, "unseen": ~seen}
    paired: dict[str, Any] = {}
    for s in distilled:
        for part, mask in parts.items():
            t = compare_paired(
                {m: v[mask] for m, v in pq[s].items()},
                {m: v[mask] for m, v in pq[TWIN].items()},
                list(MEASURES),
            )
            paired.setdefault(f"{s} vs {TWIN}", {})[part] = {
                m: {k: getattr(v, k) for k in (*KEYS, "wins", "losses", "n")} for m, v in t.items()
            }
    vs_cos: dict[str, Any] = {}
    for part, mask in parts.items():
        for s in (TWIN, *distilled):
            t = compare_paired(
                {m: v[mask] for m, v in pq[s].items()},
                {m: v[mask] for m, v in pq["cosine"].items()},
                ["ndcg@10"],
            )["ndcg@10"]
            vs_cos.setdefault(s, {})[part] = {k: getattr(t, k) for k in KEYS}
    reranks = {  # a teacher system's own ranking of the test claims, against BM25
        name: {k: t["ndcg@10"][k] for k in ("delta", "ci_low", "ci_high", "p_randomization")}
        for name, t in res.get("tests", {}).get("bm25", {}).items()
        if name in teacher.get("stages", {}) and "ndcg@10" in t
    }
    if reranks:
        teacher["rerank_vs_bm25"] = reranks
    timing = run_dir.parent / f"{run_dir.name}.time"  # /usr/bin/time -v of the last `treerank run`
    doc: dict[str, Any] = {
        "issue": 32,
        "what": "SciFact query towers (all-MiniLM-L6-v2, 200 steps of 32 claims, softmax over "
        "all 5,183 abstracts) trained on binary labels alone or on labels + a teacher's top 20 "
        "(BM25 as a listwise or a graded MarginMSE teacher; a SciFact cross-encoder reranking "
        "BM25 as a MarginMSE teacher); all 300 test claims against all 5,183 abstracts",
        "commands": [
            "bash scripts/sample.sh",
            "treerank run configs/distill_scifact_qt.yaml",
            "python scripts/experiments/distill_qt_report.py runs/distill-scifact-qt/eval/scifact "
            "docs/results/distill_scifact_qt.json",
        ],
        "cpu": _cpu(),
        "n_queries": int(seen.size),
        "n_seen": int(seen.sum()),
        "n_unseen": int((~seen).sum()),
        "systems": systems,
        "ir_measures": checked,
        "vs_cosine": vs_cos,
        "paired": paired,
        "training": training,
        "teacher": teacher,
    }
    if timing.is_file():
        from ce_squad_report import _time_file  # the same parse as the cross-encoder report

        doc["cost_command"] = _time_file(timing)
    atomic_write_json(out, doc, indent=1)
    print(table(doc))


def table(doc: dict[str, Any]) -> str:
    """The page's tables: nDCG@10 of every tower on all / seen / unseen claims with its delta to
    frozen cosine, then each distilled tower against its binary-label twin, then the cost."""
    n = {"all": doc["n_queries"], "seen": doc["n_seen"], "unseen": doc["n_unseen"]}
    lines = ["| system (all claims) | nDCG@10 | MRR@10 | R@100 |", "|---|---:|---:|---:|"]
    for name, m in doc["systems"].items():
        lines.append(f"| {name} | {m['ndcg@10']:.4f} | {m['mrr@10']:.4f} | {m['recall@100']:.4f} |")
    lines.append("")
    towers = [TWIN, *(s for s in doc["vs_cosine"] if s != TWIN)]
    lines += ["| nDCG@10 | claims | frozen cosine | " + " | ".join(towers) + " |"]
    lines.append("|---|---:|---:|" + "---:|" * len(towers))
    for part in ("all", "seen", "unseen"):
        cells = [f"{doc['vs_cosine'][TWIN][part]['mean_baseline']:.4f}"]
        for s in towers:
            t = doc["vs_cosine"][s][part]
            cells.append(
                f"{t['mean_system']:.4f} ({t['delta']:+.4f}, {t['ci_low']:+.4f} .. "
                f"{t['ci_high']:+.4f}, p {t['p_randomization']:.4f})"
            )
        lines.append(f"| {part} | {n[part]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| comparison (nDCG@10) | part | distilled | labels | delta (95% CI) | p | wins / losses |",
    ]
    lines.append("|---|---|---:|---:|---|---:|---:|")
    for name, by in doc["paired"].items():
        for part, ms in by.items():
            t = ms["ndcg@10"]
            lines.append(
                f"| {name} | {part} | {t['mean_system']:.4f} | {t['mean_baseline']:.4f} | "
                f"{t['delta']:+.4f} ({t['ci_low']:+.4f} .. {t['ci_high']:+.4f}) | "
                f"{t['p_randomization']:.4f} | {t['wins']} / {t['losses']} |"
            )
    lines += [
        "",
        "| tower | steps | training rows per source | train loss | CPU-s | peak RSS MiB |",
    ]
    lines.append("|---|---:|---|---:|---:|---:|")
    for name, t in doc["training"].items():
        src = t["sources"] or {"labels": {"pairs": t["training_queries"], "mode": "sample"}}
        rows = ", ".join(f"{v['mode']} {v['pairs']}" for v in src.values())
        lines.append(
            f"| {name} | {t['steps']} | {rows} | {t['train_loss']:.4f} | "
            f"{t['cpu_seconds']:.0f} | {t['peak_rss_mib']:.0f} |"
        )
    teacher = doc.get("teacher", {})
    if teacher.get("stages"):
        ce = teacher.get("cross_encoder") or {}
        lines += ["", "| teacher | its training | ranking the training claims (wall s) |"]
        lines.append("|---|---|---:|")
        for system, st in teacher["stages"].items():
            trained = "none"
            if "scorer=ce:" in system and ce:
                c = ce["cost"]
                trained = (
                    f"{ce['steps']} steps, {ce['pairs']:,} pairs, loss {ce['train_loss']:.4f}, "
                    f"{c['cpu_seconds']:.0f} CPU-s, {c['peak_rss_mib']:.0f} MiB"
                )
            lines.append(f"| `{system}` | {trained} | {st['seconds']:.0f} |")
        for system, t in teacher.get("rerank_vs_bm25", {}).items():
            lines.append(
                f"\n`{system}` on the test claims, nDCG@10 against BM25's: {t['delta']:+.4f} "
                f"(95% CI {t['ci_low']:+.4f} .. {t['ci_high']:+.4f}, p {t['p_randomization']:.4f})"
            )
    cost = doc.get("cost_command")
    if cost:
        lines.append(
            f"\nThe last `treerank run` (`/usr/bin/time -v`): {cost['wall_clock']} wall, "
            f"{cost['cpu_seconds']:,.0f} CPU-s, {cost['peak_rss_mib']:,.0f} MiB peak RSS."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) == 4 else None)
