"""docs/finetune.md reports the numbers of every docs/results/finetune_*.json (a rerun that
changes a JSON must change the page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = sorted((REPO / "docs" / "results").glob("finetune_*.json"))


def _script(name: str, path: Path):
    """The module of a script file (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_there_is_a_finetune_result() -> None:
    assert any(p.name == "finetune_scifact_query_tower.json" for p in RESULTS)


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_finetune_page_quotes_the_result_json(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    name = f"finetune-{doc['family']}"
    quoted = [
        f"{doc['systems']['cosine']['ndcg@10']:.4f}",
        f"{doc['systems'][name]['ndcg@10']:.4f}",
        f"{doc['paired_vs_cosine']['ndcg@10']['delta']:+.4f}",
        f"{doc['paired_vs_cosine']['ndcg@10']['p']:.4f}",
        f"{doc['drift'][doc['eval_split']]['cka_queries']:.4f}",
        f"{doc['drift'][doc['eval_split']]['overlap_at_k']:.4f}",
        f"{doc['cost']['train']['cpu_seconds']:.0f}",
    ]
    for part in ("seen", "unseen"):  # a part with no query (SQuAD dev: no seen one) has no mean
        row = doc["seen_unseen"]["parts"][part]
        if row["cosine"]["ndcg@10"]["mean"] is not None:
            quoted += [
                f"{row['cosine']['ndcg@10']['mean']:.4f}",
                f"{row[name]['ndcg@10']['mean']:.4f}",
            ]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/finetune.md lacks {missing} from {path.name}"


TRANSFERS = sorted((REPO / "docs" / "results").glob("transfer_*.json"))


def test_there_is_a_transfer_result() -> None:
    assert any(p.name == "transfer_squad_query_tower_scifact.json" for p in TRANSFERS)


@pytest.mark.parametrize("path", TRANSFERS, ids=[p.stem for p in TRANSFERS])
def test_finetune_page_quotes_the_transfer_json(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    paired = doc["paired_vs_cosine"]["ndcg@10"]
    quoted = [f"{doc['systems'][s]['ndcg@10']:.4f}" for s in doc["systems"]]
    quoted += [f"{paired[k]:+.4f}" for k in ("delta", "ci_low", "ci_high")]
    quoted += [f"{paired['p']:.4f}", f"{doc['n_queries']:,}", f"{doc['n_passages']:,}"]
    quoted += [f"{doc['n_train_queries']:,}", f"{doc['cost']['reembed']['cpu_seconds']:.1f}"]
    quoted += [f"{doc['cost']['evaluate']['cpu_seconds']:.1f}"]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/finetune.md lacks {missing} from {path.name}"


DISTILL_QT = REPO / "docs" / "results" / "distill_scifact_qt.json"


def test_finetune_page_quotes_the_query_tower_distillation_tables() -> None:
    """The page holds the tables ``scripts/experiments/distill_qt_report.py`` renders from
    docs/results/distill_scifact_qt.json, line for line."""
    from tests.bench_module import missing_table_lines

    missing = missing_table_lines("distill_qt_report", DISTILL_QT, REPO / "docs" / "finetune.md")
    assert not missing, f"docs/finetune.md lacks {missing} from {DISTILL_QT.name}"


@pytest.mark.parametrize(
    ("bench_name", "result"),
    [
        ("bench_finetune_memory", "finetune_memory.json"),
        ("bench_finetune_ddp", "finetune_ddp.json"),
    ],
)
def test_finetune_page_quotes_the_benchmark(bench_name: str, result: str) -> None:
    """The page holds the bench's own render of its committed result, line for line."""
    from tests.bench_module import load_bench

    bench = load_bench(bench_name)
    doc = json.loads((REPO / "bench" / "results" / result).read_text("utf-8"))
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    missing = [ln for ln in bench.render(doc).splitlines() if ln and ln not in text]
    assert not missing, f"docs/finetune.md lacks {missing} from {result}"


def test_finetune_page_quotes_the_full_budget_scale2_tables() -> None:
    """The Scale-2 section holds ``scripts/finetune_scale2.py``'s render of the full-budget run,
    line for line."""
    mod = _script("finetune_scale2", REPO / "scripts" / "finetune_scale2.py")
    results = REPO / "docs" / "results"
    drt = json.loads((results / "finetune_scifact_drt_e2e_full.json").read_text("utf-8"))
    bi = json.loads(
        (results / "finetune_scifact_drt_e2e_full_biencoder_arm.json").read_text("utf-8")
    )
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    missing = [ln for ln in mod.render(drt, bi).splitlines() if ln and ln not in text]
    assert not missing, f"docs/finetune.md lacks {missing}"


@pytest.mark.parametrize(
    "results",
    ["scale2_scifact_seeds.json", "scale2_squad_query_side.json"],
)
def test_finetune_page_quotes_the_three_seed_scale2_table(results: str) -> None:
    """The Scale-2 section holds ``scripts/finetune_scale2_seeds.py``'s render of each
    three-seed comparison (SciFact's biencoder / drt-e2e pair, SQuAD's query-side pair),
    line for line."""
    mod = _script("finetune_scale2_seeds", REPO / "scripts" / "finetune_scale2_seeds.py")
    doc = json.loads((REPO / "docs" / "results" / results).read_text("utf-8"))
    cosine_arm = doc.get("arms", ["biencoder"])[0]
    assert len(doc["seed_spread"][cosine_arm]["seeds"]) == 3
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    missing = [ln for ln in mod.render(doc).splitlines() if ln and ln not in text]
    assert not missing, f"docs/finetune.md lacks {missing}"


QT_TRANSFER_SEEDS = REPO / "scripts" / "experiments" / "qt_transfer_seeds.py"
SEED_TRANSFER = REPO / "docs" / "results" / "scale2_squad_query_tower_transfer.json"


def test_transfer_verdicts_follow_section_d() -> None:
    """Section D's reading of a paired 95% CI of (tower - cosine) nDCG@10, margin -0.01, in
    order: the lower bound above 0 is better, above the margin non-inferior (or "non-inferior,
    worse" with the upper bound below 0); an upper bound below 0 otherwise is inferior;
    anything else is not shown (boundaries are strict)."""
    mod = _script("qt_transfer_seeds", QT_TRANSFER_SEEDS)
    assert mod.verdict(0.001, 0.02) == "better"
    assert mod.verdict(0.0, 0.02) == "non-inferior"
    assert mod.verdict(-0.0099, 0.005) == "non-inferior"
    assert mod.verdict(-0.0099, 0.0) == "non-inferior"
    assert mod.verdict(-0.008, -0.001) == "non-inferior, worse"
    assert mod.verdict(-0.01, 0.005) == "not shown"
    assert mod.verdict(-0.03, -0.001) == "inferior"
    assert mod.verdict(-0.03, 0.0) == "not shown"


def test_transfer_table_renders_the_mean_then_each_seed() -> None:
    mod = _script("qt_transfer_seeds", QT_TRANSFER_SEEDS)

    def row(ndcg: float, lo: float, hi: float) -> dict:
        test = {"delta": ndcg - 0.5, "ci_low": lo, "ci_high": hi, "p": 0.04}
        return {"systems": {"ndcg@10": ndcg}, "vs_cosine": {"ndcg@10": test}}

    target = {
        "name": "DL19 pool",
        "n_queries": 43,
        "n_passages": 14580,
        "cosine": {"ndcg@10": 0.5},
        "mean": row(0.51, -0.002, 0.022),
        "seed_std": {"ndcg@10": 0.02},
        "per_seed": {"0": row(0.52, 0.001, 0.04), "4": row(0.48, -0.04, -0.001)},
        "cost": {"reembed_cpu_seconds": 12.34, "evaluate_cpu_seconds": 5.0},
    }
    doc = {"seeds": [0, 4], "n_train_queries": 12800, "targets": [target], "peak_rss_mib": 2150}
    lines = mod.render(doc).splitlines()
    assert lines[0].startswith("nDCG@10, towers of seeds 0 / 4 (each trained on 12,800 SQuAD")
    assert lines[4:7] == [
        "| DL19 pool, mean | 43 | 14,580 | 0.5000 | 0.5100 (0.0200) | +0.0100 (-0.0020 .. +0.0220) "
        "| 0.0400 | non-inferior |",
        "| DL19 pool, seed 0 | 43 | 14,580 | 0.5000 | 0.5200 | +0.0200 (+0.0010 .. +0.0400) "
        "| 0.0400 | better |",
        "| DL19 pool, seed 4 | 43 | 14,580 | 0.5000 | 0.4800 | -0.0200 (-0.0400 .. -0.0010) "
        "| 0.0400 | inferior |",
    ]
    assert lines[-2:] == [
        "- DL19 pool: building its 2 re-embedded stores (loading each tower, encoding the 43 "
        "queries, copying the passage vectors) took 12.3 CPU-s, the evaluation 5.0 CPU-s.",
        "- Peak RSS of the whole run (one process): 2.1 GiB.",
    ]


def test_finetune_page_quotes_the_seed_transfer_table() -> None:
    """The transfer section holds ``qt_transfer_seeds.py``'s render of the three seeds' towers
    on DL19 and SciFact, line for line, and the JSON holds both targets and three seeds."""
    mod = _script("qt_transfer_seeds", QT_TRANSFER_SEEDS)
    doc = json.loads(SEED_TRANSFER.read_text(encoding="utf-8"))
    assert [t["name"] for t in doc["targets"]] == ["DL19 pool", "SciFact test"]
    assert doc["seeds"] == [0, 1, 2]
    assert all(sorted(t["per_seed"]) == ["0", "1", "2"] for t in doc["targets"])
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    missing = [ln for ln in mod.render(doc).splitlines() if ln and ln not in text]
    assert not missing, f"docs/finetune.md lacks {missing}"
    # the bullets under the table quote the JSON too
    dl19, scifact = (
        [t["per_seed"][str(s)]["vs_cosine"]["ndcg@10"] for s in doc["seeds"]]
        for t in doc["targets"]
    )
    mean = doc["targets"][1]["mean"]["vs_cosine"]["ndcg@10"]
    deltas = sorted(t["delta"] for t in dl19)
    quoted = [
        f"({deltas[-1]:.4f} to {deltas[0]:.4f}",
        f"reach {max(t['ci_low'] for t in dl19):.3f} to {min(t['ci_low'] for t in dl19):.3f}",
        f"bounds {min(t['ci_high'] for t in dl19):+.3f} to {max(t['ci_high'] for t in dl19):+.3f}",
        f"({mean['delta']:+.4f}, lower bound {mean['ci_low']:.4f})",
        f"(lower bounds {scifact[1]['ci_low']:.4f}\n  and {scifact[2]['ci_low']:.5f},",
        f"spread by\n  {doc['targets'][1]['seed_std']['ndcg@10']:.4f}, more than the "
        f"{mean['ci_low'] - mod.MARGIN:.4f} between",
    ]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/finetune.md's transfer bullets lack {missing}"


BI_BUDGET = REPO / "docs" / "results" / "scifact_biencoder_vs_linear_sources.json"
BI_BUDGET_SCRIPT = REPO / "scripts" / "experiments" / "scifact_biencoder_budget.py"


def test_finetune_page_quotes_the_budget_biencoder_table() -> None:
    """The budget section holds ``scifact_biencoder_budget.py``'s render line for line: both
    budget runs against frozen cosine and the main job's ``linear-sources`` on all 300 claims
    and their seen / unseen parts, with each run's cost."""
    mod = _script("scifact_biencoder_budget", BI_BUDGET_SCRIPT)
    doc = json.loads(BI_BUDGET.read_text(encoding="utf-8"))
    assert [r["family"] for r in doc["runs"]] == ["biencoder", "biencoder"]
    assert {p: doc["parts"][p]["n"] for p in mod.PARTS} == {"all": 300, "seen": 196, "unseen": 104}
    text = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    missing = [ln for ln in mod.render(doc).splitlines() if ln and ln not in text]
    assert not missing, f"docs/finetune.md lacks {missing}"


def test_budget_verdicts_are_the_transfer_rule() -> None:
    """Every verdict against the head in the JSON is ``qt_transfer_seeds.verdict`` of its CI."""
    rule = _script("qt_transfer_seeds", QT_TRANSFER_SEEDS).verdict
    doc = json.loads(BI_BUDGET.read_text(encoding="utf-8"))
    for part in doc["parts"].values():
        for run in part["runs"].values():
            vh = run["vs_head"]
            assert run["verdict_vs_head"] == rule(vh["ci_low"], vh["ci_high"])


def test_budget_script_refuses_an_unfinished_run_before_any_work(tmp_path: Path, capsys) -> None:
    mod = _script("scifact_biencoder_budget", BI_BUDGET_SCRIPT)
    (tmp_path / "run").mkdir()
    out = tmp_path / "out.json"
    argv = ["--store", str(tmp_path), "--head", str(tmp_path), "--run", str(tmp_path / "run")]
    assert mod.main([*argv, "--out", str(out)]) == 2
    assert "results.json missing (a finished finetune run?)" in capsys.readouterr().out
    assert not out.exists()


def test_budget_script_refuses_runs_that_would_share_a_system_name(tmp_path: Path, capsys) -> None:
    """Systems are keyed by the run folder's name: two folders named alike, or a run named
    like a reference system, would overwrite each other's rows, so they are refused."""
    mod = _script("scifact_biencoder_budget", BI_BUDGET_SCRIPT)
    runs = [tmp_path / "a" / "x", tmp_path / "b" / "x", tmp_path / "c" / "bm25"]
    for run in runs:
        (run / "stores" / "test").mkdir(parents=True)
        (run / "results.json").write_text("{}")
        (run / "stores" / "test" / "meta.json").write_text("{}")
    out = str(tmp_path / "out.json")
    head = ["--store", str(tmp_path), "--head", str(tmp_path), "--out", out]
    assert mod.main([*head, "--run", str(runs[0]), "--run", str(runs[1])]) == 2
    assert "two runs are named 'x'" in capsys.readouterr().out
    assert mod.main([*head, "--run", str(runs[0]), "--run", str(runs[2])]) == 2
    assert "a run is named 'bm25', the name of a reference system" in capsys.readouterr().out
    assert mod.main([*head, "--run", str(runs[0])]) == 2  # the store has no split
    assert "no store split (meta.json missing)" in capsys.readouterr().out
