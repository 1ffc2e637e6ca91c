"""``treerank finetune`` with ``family: cross-encoder`` on the 10-query MS MARCO sample (real
texts, a copy of the cached store as the ``train`` split): the trained model, its cost in
results.json, and the bad-input exits (before any training)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.config import ConfigError
from treerank.training.finetune_config import parse_finetune_config


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _doc(**trainer: Any) -> dict[str, Any]:
    return {
        "family": "cross-encoder",
        "seed": 3,
        "model": {"max_length": 64},
        "data": {"batch_size": 2, "n_hard": 2, "mine_depth": 10},
        "trainer": {"loss": "listwise", "max_steps": 2, "save_steps": 1, "lr": 5e-5, **trainer},
        "validation": {"fraction": 0},
    }


@pytest.fixture(scope="module")
def root(msmarco_store: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store root whose only split, ``train``, is the MS MARCO sample (mining writes a
    sidecar into it, so the cached store is copied)."""
    out = tmp_path_factory.mktemp("ce-root")
    shutil.copytree(Path(msmarco_store["validation"].path), out / "train")
    return out


def test_config_maps_every_section_onto_the_trainer_config() -> None:
    cfg = parse_finetune_config(_doc(precision="bf16"), "ce.yaml")
    ce = cfg.cross_encoder
    assert (ce.loss, ce.negatives, ce.batch_size, ce.max_length) == ("listwise", 2, 2, 64)
    assert (ce.max_steps, ce.save_steps, ce.seed, ce.precision) == (2, 1, 3, "bf16")
    assert ce.lr == 5e-5 and ce.base is None
    assert parse_finetune_config(cfg.to_dict()).cross_encoder == ce  # round trip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"trainer": {"mini_batch_size": 8}}, r"ce\.yaml\.trainer.*mini_batch_size"),
        ({"trainer": {"loss": "mnrl"}}, "loss 'mnrl' unknown"),
        ({"trainer": {"loss": "margin-mse"}}, r"ce\.yaml\.data\.teacher.*margin-mse"),
        ({"data": {"teacher": "ce:/x", "n_hard": 2}}, r"data\.teacher.*'listwise'"),
        ({"data": {"teacher": "/x"}}, "expected ce:<cross-encoder dir>"),
        ({"model": {"max_query_length": 64}}, r"ce\.yaml\.model.*max_query_length"),
    ],
)
def test_config_refuses_bad_keys_and_values(change: dict[str, Any], match: str) -> None:
    doc = _doc()
    for section, values in change.items():
        doc[section] = {**doc[section], **values}
    with pytest.raises(ConfigError, match=match):
        parse_finetune_config(doc, "ce.yaml")


def test_finetune_cross_encoder_writes_model_and_cost(root: Path, tmp_path: Path) -> None:
    cfg = _write(tmp_path / "ce.yaml", _doc())
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        ["finetune", str(cfg), "--store", str(root), "-o", str(out), "--eval-split", "absent"],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["family"] == "cross-encoder"
    t = doc["training"]
    assert (t["loss"], t["steps"]) == ("listwise", 2)
    assert t["pairs"] == 2 * 2 * (1 + 2)  # steps x groups per step x (positive + 2 negatives)
    cost = doc["cost"]["train"]
    assert cost["cpu_seconds"] > 0 and cost["peak_rss_mib"] > 100
    assert cost["pairs_per_cpu_second"] == pytest.approx(t["pairs"] / cost["cpu_seconds"], 1e-3)
    assert doc["cost"]["total"]["cpu_seconds"] >= cost["cpu_seconds"] - 1e-6
    assert (out / "model" / "config.json").is_file()
    assert doc["rerank_spec"] == f"rescore:bm25:depth=20,scorer=ce:{out / 'model'}"
    record = json.loads((out / "cross_encoder.json").read_text(encoding="utf-8"))
    assert record["fingerprint"] == doc["fingerprint"] and record["config"]["seed"] == 3
    assert "pairs per CPU-s" in res.output and "rescore:bm25:depth=20" in res.output
    # the mined negatives were written once into the train split's sidecar and are reused
    assert any(p.name.startswith("bm25_negatives") for p in (root / "train" / "arrays").iterdir())
    # a second run into the same folder without --resume is refused (exit 2), nothing lost
    again = CliRunner().invoke(app, ["finetune", str(cfg), "--store", str(root), "-o", str(out)])
    assert again.exit_code == 2 and "resume" in again.output
    assert json.loads((out / "results.json").read_text(encoding="utf-8")) == doc


def test_finetune_cross_encoder_bad_input_exits_2_before_training(
    root: Path, tmp_path: Path
) -> None:
    bad = _write(tmp_path / "bad.yaml", {**_doc(), "trainer": {"loss": "margin-mse"}})
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["finetune", str(bad), "--store", str(root), "-o", str(out)])
    assert res.exit_code == 2 and "teacher" in res.output
    good = _write(tmp_path / "ce.yaml", _doc())
    res = CliRunner().invoke(
        app, ["finetune", str(good), "--store", str(root), "-o", str(out), "--device", "tpu"]
    )
    assert res.exit_code == 2 and "--device tpu" in res.output
    res = CliRunner().invoke(app, ["finetune", str(good), "--store", str(tmp_path), "-o", str(out)])
    assert res.exit_code == 2 and "no finished store split" in res.output
    assert not out.exists()


def test_finetune_cross_encoder_resume_is_bit_identical(root: Path, tmp_path: Path) -> None:
    cfg = _write(tmp_path / "ce.yaml", _doc())
    out = tmp_path / "run"
    args = ["finetune", str(cfg), "--store", str(root), "-o", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    full = json.loads((out / "results.json").read_text(encoding="utf-8"))
    # as if stopped after the first checkpoint: the second one never written
    shutil.rmtree(out / "checkpoints" / "checkpoint-2")
    res = CliRunner().invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    again = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert again["training"]["resumed_from"] == "checkpoint-1"
    assert again["fingerprint"] == full["fingerprint"]  # the same weights, bit for bit
    assert again["training"]["steps"] == 2
