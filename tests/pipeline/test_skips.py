"""A baselines-only experiment runs, and says which stages it skipped and why."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import run_experiment

DOCS = [
    ("d1", "cats purr when they are content"),
    ("d2", "dogs bark loudly at night"),
    ("d3", "fish swim in the cold river"),
    ("d4", "stock markets fell sharply today"),
]
QRELS = [("q1", "d1"), ("q2", "d2"), ("q3", "d3")]
QUERIES = {"q1": "why do cats purr", "q2": "barking dogs", "q3": "where do fish swim"}


def test_baselines_only_experiment_reports_skipped_stages(tmp_path: Path) -> None:
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in DOCS)
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in QUERIES.items())
    )
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in QRELS)
    )
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "datasets": [
                    {"name": "tiny", "path": str(root), "format": "beir", "eval_split": "test"}
                ],
                "systems": ["bm25", "cosine"],
                "evaluate": {"k": 10, "metrics": ["mrr@10"]},
                "diagnose": {"model": None},
            }
        )
    )
    lines: list[str] = []
    res = run_experiment(
        load_experiment(cfg, output_dir=tmp_path / "out"), progress=False, log=lines.append
    )
    assert [(r.name, r.status) for r in res.stages] == [
        ("embed:tiny:test", "ran"),
        ("evaluate:tiny", "ran"),
        ("diagnose:tiny", "skipped: no diagnose.model given"),
    ]
    assert "[skip]  diagnose:tiny  (no diagnose.model given)" in lines
    md = res.report_md.read_text()
    assert "| `diagnose:tiny` | — | skipped: no diagnose.model given |" in md
    assert "Seen / unseen split: skipped (this dataset has no train split" in md
    doc = json.loads(res.report_json.read_text())
    assert doc["stages"][-1]["skipped"] == "no diagnose.model given"
    assert doc["datasets"]["tiny"]["comparison"]["systems"]["bm25"]["mean"]["mrr@10"] == 1.0
    # the command line says the same, after the tables (every stage reused this time)
    from typer.testing import CliRunner

    from treerank.cli.main import app

    cli = CliRunner().invoke(
        app, ["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]
    )
    assert cli.exit_code == 0, cli.output
    assert "Skipped (nothing to do):\n- diagnose:tiny: no diagnose.model given" in cli.output
    assert "Summary:\n- tiny (3 queries evaluated against every passage of the split)" in cli.output
