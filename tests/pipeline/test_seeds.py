"""`seeds: [...]` in an experiment: one training per seed, per-seed metrics, mean and std, and a
paired test on the per-query metrics averaged over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.pipeline.tiny_beir import write_tiny_beir
from treerank.pipeline.config import ConfigError, load_experiment
from treerank.pipeline.experiment import run_experiment

LINEAR = {
    "family": "linear",
    "seeds": [0, 1, 2],
    "data": {"batch_size": 4, "hard_negatives": "none", "drop_last": False},
    "trainer": {"epochs": 3, "lr": 0.05, "threads": 1},
    "validation": {"fraction": 0.25, "k": 8, "metrics": ["ndcg@10"]},
}


def _experiment(tmp_path: Path, **model_over: object) -> Path:
    data = write_tiny_beir(tmp_path / "beir")
    raw = {
        "name": "seeds",
        "datasets": [
            {
                "name": "tiny",
                "path": str(data),
                "format": "beir",
                "train_split": "train",
                "eval_split": "test",
            }
        ],
        "systems": ["bm25", "cosine"],
        "evaluate": {"k": 10, "baselines": ["cosine"], "metrics": ["mrr@10", "ndcg@10"]},
        "diagnose": {"model": None},
        "models": {"linear": {**LINEAR, **model_over}},
    }
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_seeds_config_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models.linear.seeds: repeated seed"):
        load_experiment(_experiment(tmp_path, seeds=[0, 0]))
    with pytest.raises(ConfigError, match="give seed .* or seeds"):
        load_experiment(_experiment(tmp_path / "b", seed=3))
    spec = load_experiment(_experiment(tmp_path / "c")).models["linear"]
    assert {n: c["seed"] for n, c in spec.runs().items()} == {
        "linear@seed0": 0,
        "linear@seed1": 1,
        "linear@seed2": 2,
    }


def test_seed_variance_in_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_experiment(
        load_experiment(_experiment(tmp_path), output_dir=out), progress=False, log=lambda _: None
    )
    names = [r.name for r in res.stages]
    assert [n for n in names if n.startswith("train:")] == [
        "train:tiny:linear@seed0",
        "train:tiny:linear@seed1",
        "train:tiny:linear@seed2",
    ]
    # every seed trained with its own seed
    for s in range(3):
        cfg = yaml.safe_load(
            (out / "models" / "tiny" / f"linear@seed{s}" / "config.yaml").read_text()
        )
        assert cfg["seed"] == s
    report = json.loads(res.report_json.read_text())
    comp = report["datasets"]["tiny"]["comparison"]
    spread = comp["seed_spread"]["linear"]
    per_seed = [comp["systems"][f"linear@seed{s}"]["mean"]["ndcg@10"] for s in range(3)]
    assert spread["per_seed"]["ndcg@10"] == pytest.approx(per_seed)
    assert spread["mean"]["ndcg@10"] == pytest.approx(np.mean(per_seed))
    assert spread["std"]["ndcg@10"] == pytest.approx(np.std(per_seed, ddof=1))
    # the model's row is the per-query average over seeds, and its test is on that average
    rows = [
        json.loads(x) for x in (out / "eval" / "tiny" / "per_query.jsonl").read_text().splitlines()
    ]
    by = {(r["system"], r["query_id"]): r["ndcg@10"] for r in rows}
    qids = sorted({r["query_id"] for r in rows})
    for q in qids:
        assert by[("linear", q)] == pytest.approx(
            np.mean([by[(f"linear@seed{s}", q)] for s in range(3)])
        )
    delta = np.mean([by[("linear", q)] - by[("cosine", q)] for q in qids])
    assert comp["tests"]["cosine"]["linear"]["ndcg@10"]["delta"] == pytest.approx(delta)
    md = res.report_md.read_text()
    assert "### Training-seed variance" in md
    assert (
        f"| `linear` | ndcg@10 | {per_seed[0]:.4f} | {per_seed[1]:.4f} | {per_seed[2]:.4f} |" in md
    )
