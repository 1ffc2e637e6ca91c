"""treerank.config: YAML 1.2 numbers in the one loader, and every value type-checked with its key
path and expected type (issue 24 item 6, issue 22's `epochs: three`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from treerank.config import ConfigError, check_type, load_yaml, parse_yaml
from treerank.models.linear import LinearHead
from treerank.pipeline.sweep import parse_grid, parse_value
from treerank.training.config import parse_train_config
from treerank.training.trainer import TrainerConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-2", 0.01),
        ("5E3", 5000.0),
        ("-1e+3", -1000.0),
        ("+2.5e-1", 0.25),
        (".5", 0.5),
        ("1.", 1.0),
        ("1.5", 1.5),
        ("10", 10),
        ("1_000", 1000),
        (".inf", float("inf")),
        ("'1e-2'", "1e-2"),  # quoted stays a string
        ("e5", "e5"),
        ("1e", "1e"),
        ("1e-2x", "1e-2x"),
    ],
)
def test_yaml_numbers_follow_yaml_1_2(text: str, value: object) -> None:
    got = parse_yaml(f"v: {text}")["v"]
    assert got == value and type(got) is type(value)
    assert yaml.safe_load("v: 1e-2")["v"] == "1e-2"  # PyYAML's 1.1 rule, for the record


def test_load_yaml_and_grid_values_read_floats(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  weight_decay: 1e-2\n  lr: 3E-4\n  epochs: 2\n")
    doc = load_yaml(p)
    assert doc == {"trainer": {"weight_decay": 0.01, "lr": 0.0003, "epochs": 2}}
    assert parse_value("1e-2") == 0.01 and parse_value("1e-4") == 0.0001
    assert parse_grid(["models.x.trainer.weight_decay=1e-2,1e-4"]) == {
        "models.x.trainer.weight_decay": [0.01, 0.0001]
    }


def _parse(trainer: dict[str, object], model: dict[str, object] | None = None):
    return parse_train_config(
        {"trainer": trainer, "model": model or {}},
        model=LinearHead,
        data=["negatives"],
        trainer=TrainerConfig,
        where="exp.yaml: models.lin",
    )


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"epochs": "three"}, "models.lin.trainer.epochs: expected an integer, got 'three'"),
        ({"epochs": 2.5}, "models.lin.trainer.epochs: expected an integer, got 2.5"),
        ({"epochs": True}, "models.lin.trainer.epochs: expected an integer, got True"),
        ({"lr": "fast"}, "models.lin.trainer.lr: expected a number, got 'fast'"),
        ({"weight_decay": "1e-2x"}, "trainer.weight_decay: expected a number, got '1e-2x'"),
        ({"max_steps": "ten"}, "trainer.max_steps: expected an integer or null, got 'ten'"),
        ({"betas": [0.9]}, "trainer.betas: expected a list of 2 numbers, got \\[0.9\\]"),
        ({"negatives": 3}, "trainer.negatives: expected a string, got 3"),
    ],
)
def test_trainer_values_are_type_checked_with_key_path(trainer, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(trainer)


def test_good_values_pass_and_ints_are_numbers() -> None:
    cfg = _parse({"epochs": 3, "lr": 1, "weight_decay": 0.01, "betas": [0.9, 0.99]})
    assert cfg.trainer.epochs == 3 and cfg.trainer.lr == 1 and cfg.trainer.betas == (0.9, 0.99)


def test_check_type_unions_and_literals() -> None:
    from typing import Literal

    check_type(None, int | None, "w")
    check_type("all", Literal["batch", "all"], "w")
    with pytest.raises(ConfigError, match="w: expected one of 'batch', 'all', got 'some'"):
        check_type("some", Literal["batch", "all"], "w")


def test_shipped_head_config_with_epochs_three() -> None:
    # issue 22: `epochs: three` gave "'<' not supported between instances of 'str' and 'int'"
    from treerank.training.heads import parse_head_config

    cfg = load_yaml(REPO / "configs" / "heads" / "linear.yaml")
    assert parse_head_config(cfg, LinearHead).trainer.epochs >= 1  # the shipped file parses
    cfg["trainer"]["epochs"] = "three"
    with pytest.raises(
        ConfigError, match="config.trainer.epochs: expected an integer, got 'three'"
    ):
        parse_head_config(cfg, LinearHead)
    cfg["trainer"]["epochs"] = 2
    cfg["data"]["batch_size"] = "64"
    with pytest.raises(ConfigError, match="config.data.batch_size: expected an integer, got '64'"):
        parse_head_config(cfg, LinearHead)
    cfg["data"]["batch_size"] = 64
    cfg["model"]["temperature"] = "cold"
    with pytest.raises(ConfigError, match="config.model.temperature: expected a number, got"):
        parse_head_config(cfg, LinearHead)


def test_sweep_grid_values_are_checked_before_any_setting_runs(tmp_path: Path) -> None:
    from tests.pipeline.test_sweep import _tiny_experiment
    from treerank.pipeline.sweep import run_sweep

    exp = _tiny_experiment(tmp_path)
    out = tmp_path / "sweep"
    with pytest.raises(
        ConfigError,
        match=r"sweep setting \{'models.linear.trainer.epochs': 'three'\}: .*exp.yaml: "
        r"models.linear.trainer.epochs: expected an integer, got 'three'",
    ):
        run_sweep(exp, grid=["models.linear.trainer.epochs=1,three"], out=out)
    assert not out.exists()  # nothing ran, nothing was written
