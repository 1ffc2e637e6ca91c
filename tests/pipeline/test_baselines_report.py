"""`treerank run` reports the honest baselines: BM25+RM3, tuned/adaptive fusion, the lexical gap."""

import json
from pathlib import Path

import pytest
import yaml

from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import run_experiment

REPO = Path(__file__).resolve().parents[2]
SCIFACT = REPO / "data" / "samples" / "scifact" / "scifact.zip"

SYSTEMS = [
    "bm25",
    "bm25+rm3",
    "cosine",
    "rrf:bm25+cosine",
    "tuned-fusion:bm25+cosine:queries=all",
    "adaptive-fusion:bm25+cosine:method=rrf,queries=all,grid=5",
]


def baselines_config(tmp_path: Path, limit: int = 60, max_passages: int = 400) -> Path:
    """A baselines-only experiment on a small real SciFact slice (train + test)."""
    raw = {
        "name": "baselines",
        "datasets": [
            {
                "name": "scifact",
                "path": str(SCIFACT),
                "format": "scifact",
                "train_split": "train",
                "eval_split": "test",
                "limit": limit,
                "max_passages": max_passages,
            }
        ],
        "systems": SYSTEMS,
        "models": {},
        "evaluate": {
            "k": 100,
            "baselines": ["bm25", "cosine"],
            "metrics": ["mrr@10", "ndcg@10", "recall@100"],
        },
        "diagnose": {"model": None},
    }
    p = tmp_path / "baselines.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


@pytest.mark.slow
def test_run_reports_rm3_tuned_fusion_and_lexical_gap(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_experiment(
        load_experiment(baselines_config(tmp_path), output_dir=out),
        log=lambda s: None,
        progress=False,
    )
    report = json.loads(res.report_json.read_text())
    sci = report["datasets"]["scifact"]
    assert set(sci["comparison"]["systems"]) == set(SYSTEMS)
    # the tuned weights were chosen on the train split and are reported with their curves
    tuning = sci["comparison"]["tuning"]
    assert set(tuning) == {SYSTEMS[4], SYSTEMS[5]}
    for t in tuning.values():
        assert t["tuned_on"]["split"] == "train" and t["tuned_on"]["n_queries"] > 0
        assert max(t["curve"].values()) == pytest.approx(t["tuned_metric"])
    # lexical gap: every evaluated query bucketed (or counted as having no term), every system
    gap = sci["lexical_gap"]
    n_eval = sci["comparison"]["systems"]["bm25"]["n_evaluated"]
    assert sum(b["n"] for b in gap["buckets"]) + gap["n_no_coverage"] == n_eval
    assert set(gap["buckets"][0]["systems"]) == set(SYSTEMS)
    md = res.report_md.read_text()
    assert "### Lexical gap" in md and "then frozen" in md and "bm25+rm3" in md
    assert (out / "eval" / "scifact" / "plots" / "lexical_gap.png").exists()
    assert (out / "eval" / "scifact" / "plots" / "fusion_tuning.png").exists()


def test_baselines_config_loads_and_every_spec_builds() -> None:
    from treerank.search import fusion_tuning  # noqa: F401  (registers the tuned kinds)
    from treerank.search.specs import build_system

    cfg = load_experiment(REPO / "configs" / "baselines.yaml")
    assert [d.name for d in cfg.datasets] == ["scifact", "squad", "dl19"]
    assert cfg.models == {}
    for ds in cfg.datasets:
        for spec in ds.systems if ds.systems is not None else cfg.systems:
            assert build_system(spec).name == spec
