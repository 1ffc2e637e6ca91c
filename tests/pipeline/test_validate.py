"""`treerank run` validates the whole experiment before any stage writes anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.pipeline.config import ConfigError, load_experiment
from treerank.pipeline.experiment import run_experiment
from treerank.pipeline.validate import validate_experiment


def _cfg(tmp_path: Path, **over) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    raw = {
        "name": "t",
        "datasets": [{"name": "d", "path": str(data), "format": "beir", "eval_split": "test"}],
        "systems": ["bm25", "cosine"],
        "diagnose": {"model": None},
        **over,
    }
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_every_problem_is_listed_with_its_key_path(tmp_path: Path) -> None:
    path = _cfg(
        tmp_path,
        systems=["bm52", "cosine", "rrf:bm25"],
        evaluate={"k": 100, "metrics": ["ndcg@10", "ndcg@ten", "recall@1000"]},
    )
    with pytest.raises(ConfigError) as info:
        validate_experiment(load_experiment(path))
    msg = str(info.value)
    assert msg.startswith(f"{path.resolve()}: 3 problems found before running anything:")
    assert "  - evaluate.metrics[1]: bad metric 'ndcg@ten'" in msg
    assert "  - systems[0]: unknown system kind 'bm52'; did you mean 'bm25'? known: cosine" in msg
    assert "  - systems[2]: bad system spec 'rrf:bm25': fusion needs two systems" in msg


def test_metric_deeper_than_k_is_named(tmp_path: Path) -> None:
    path = _cfg(tmp_path, evaluate={"k": 100, "metrics": ["ndcg@10", "recall@1000"]})
    with pytest.raises(ConfigError, match=r"evaluate.k: recall@1000 cannot be measured"):
        validate_experiment(load_experiment(path))


def test_misspelt_baseline_is_named(tmp_path: Path) -> None:
    path = _cfg(tmp_path, evaluate={"baselines": ["cosine", "bm52"]})
    with pytest.raises(ConfigError, match=r"evaluate.baselines\[1\]: unknown system kind 'bm52'"):
        validate_experiment(load_experiment(path))


def test_cli_typo_exits_2_before_any_stage_writes(tmp_path: Path) -> None:
    path = _cfg(tmp_path, systems=["bm52"])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "systems[0]: unknown system kind 'bm52'; did you mean 'bm25'?" in res.output
    assert not out.exists()
    with pytest.raises(ConfigError):
        run_experiment(load_experiment(path, output_dir=out), log=lambda _: None)
    assert not out.exists()


def test_models_without_any_train_split_are_an_error(tmp_path: Path) -> None:
    path = _cfg(tmp_path, models={"linear": {"family": "linear", "seed": 0}})
    with pytest.raises(ConfigError, match="models: linear would train on nothing: no dataset has"):
        validate_experiment(load_experiment(path))


def test_model_sections_are_checked_at_load_and_their_metrics_here(tmp_path: Path) -> None:
    split = {"train_split": "train"}
    data = tmp_path / "data"
    data.mkdir()
    ds = [{"name": "d", "path": str(data), "format": "beir", "eval_split": "test", **split}]
    typo = _cfg(
        tmp_path,
        datasets=ds,
        models={"lin": {"family": "linear", "trainer": {"learning_rate": 0.1}}},
    )
    with pytest.raises(ConfigError, match=r"models.lin.trainer: unknown key\(s\) learning_rate"):
        load_experiment(typo)
    bad = _cfg(
        tmp_path,
        datasets=ds,
        models={
            "lin": {
                "family": "linear",
                "trainer": {"early_stopping_metric": "bogus@10"},
                "validation": {"metrics": ["mrr@10", "bogus@10"]},
            }
        },
    )
    with pytest.raises(ConfigError) as info:
        validate_experiment(load_experiment(bad))
    assert "  - models.lin.validation.metrics[1]: bad metric 'bogus@10'" in str(info.value)
    assert "  - models.lin.trainer.early_stopping_metric: bad metric 'bogus@10'" in str(info.value)
