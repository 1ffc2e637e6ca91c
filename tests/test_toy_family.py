"""A model family registered from this file alone runs through train, evaluate and run.

The toy family is a seeded random projection head (``R`` of shape ``(d, d')``, same projection
for queries and passages, no training at all): what a new family needs is its own code plus one
``register_family`` entry; no treerank module is edited.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from treerank.config import ConfigError
from treerank.evaluation.settings import EvaluationSettings
from treerank.families import ModelFamily, load_model, register_family, unregister_family
from treerank.models.checkpoint import CheckpointMixin
from treerank.training.config import TrainConfig, parse_train_config
from treerank.training.trainer import TrainOutput


class RandomProjection(CheckpointMixin):
    """``x -> x R`` with ``R ~ N(0, 1/d')`` drawn from ``seed``; score = inner product."""

    model_type = "toy-rp"

    def __init__(self, dim: int, out_dim: int = 8, seed: int = 0) -> None:
        self.dim, self.out_dim, self.seed = int(dim), int(out_dim), int(seed)
        gen = torch.Generator().manual_seed(self.seed)
        self.weight = torch.randn(self.dim, self.out_dim, generator=gen) / self.out_dim**0.5
        self.name = "toy-rp"
        self.extra: dict[str, Any] = {}

    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32) @ self.weight.numpy()

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        return self.encode_queries(x)

    def checkpoint_config(self) -> dict[str, Any]:
        return {"dim": self.dim, "out_dim": self.out_dim, "seed": self.seed}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    @classmethod
    def from_checkpoint_parts(
        cls, config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> RandomProjection:
        model = cls(**config)
        model.weight = state["weight"].clone()
        return model


def parse_config(cfg: Any, where: str = "config") -> TrainConfig:
    return parse_train_config(cfg, model=("out_dim",), data=(), trainer=(), where=where)


def train(
    store: Any, config: Any, *, train_rows=None, validate=None, log=None, progress=True, device=None
):
    # a trainer always gets the device (TrainFunction); this one computes nothing on tensors
    cfg = parse_config(config)
    model = RandomProjection(int(store.dim), seed=cfg.seed, **cfg.model)
    metrics = dict(validate(model)) if validate is not None else {}
    if log is not None:
        log.write("eval", step=0, **metrics)
    return TrainOutput(model, {"heldout": metrics}, list(log.records) if log else [])


@pytest.fixture
def toy_family():
    entry = register_family(
        ModelFamily("toy-rp", RandomProjection, "random projection", parse_config, train)
    )
    yield entry
    unregister_family("toy-rp")


def test_toy_family_trains_evaluates_and_runs(toy_family, tmp_path: Path) -> None:
    from tests.pipeline.test_training import write_store
    from treerank.evaluation.compare import compare_systems
    from treerank.tasks.train import train_model

    store = write_store(tmp_path / "stores" / "toy" / "train")
    cfg = {"seed": 3, "model": {"out_dim": 6}, "validation": {"fraction": 0.25, "k": 20}}
    res = train_model("toy-rp", store, cfg, tmp_path / "rp", progress=False)
    model = load_model(tmp_path / "rp", store.encoder_fingerprint)
    assert isinstance(model, RandomProjection) and model.out_dim == 6 and model.seed == 3
    torch.testing.assert_close(model.weight, res.model.weight, rtol=0, atol=0)
    assert (tmp_path / "rp" / "training_log.jsonl").is_file()
    assert 0.0 <= res.summary["heldout"]["ndcg@10"] <= 1.0
    # ckpt: evaluates it like any dense model: same ranking as the projection done by hand
    comp = compare_systems(
        store,
        {"cosine": "cosine", "rp": f"ckpt:{tmp_path / 'rp'}"},
        settings=EvaluationSettings(baseline="cosine", k=10, metrics=("mrr@10", "ndcg@10")),
    )
    q, p = model.encode_queries(store.queries), model.encode_passages(store.passages)
    top1 = np.argmax(q @ p.T, axis=1)
    assert comp.runs["rp"].ids[:, 0].tolist() == top1.tolist()
    # strict config through the family's parser
    with pytest.raises(
        ConfigError, match=r"config.model: unknown key\(s\) width; allowed: out_dim"
    ):
        train_model("toy-rp", store, {"model": {"width": 3}}, tmp_path / "x", progress=False)
    # the CLI offers it and trains it
    from treerank.cli.main import app

    r = CliRunner().invoke(
        app,
        ["train", "--model", "toy-rp", "--store", str(store.path), "--out", str(tmp_path / "c")],
    )
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "c" / "config.json").read_text())["model_type"] == "toy-rp"


def test_toy_family_runs_in_an_experiment_twice_under_two_names(toy_family, tmp_path: Path) -> None:
    import yaml

    from tests.pipeline.test_training import write_store
    from treerank.pipeline.config import load_experiment
    from treerank.pipeline.experiment import run_experiment

    write_store(tmp_path / "stores" / "train", seed=0)
    write_store(tmp_path / "stores" / "test", seed=1)
    exp = {
        "name": "toy",
        "datasets": [
            {"name": "toy", "store": "stores", "train_split": "train", "eval_split": "test"}
        ],
        "systems": ["cosine", "bm25"],
        "evaluate": {"k": 20, "baselines": ["cosine"], "metrics": ["mrr@10", "ndcg@10"]},
        "models": {
            "rp-a": {"family": "toy-rp", "seed": 1, "model": {"out_dim": 4}},
            "rp-b": {"family": "toy-rp", "seed": 2, "model": {"out_dim": 4}},
        },
        "diagnose": {"model": None},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    res = run_experiment(
        load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "out"),
        log=lambda s: None,
        progress=False,
    )
    names = [r.name for r in res.stages]
    assert "train:toy:rp-a" in names and "train:toy:rp-b" in names
    assert all(r.skipped for r in res.stages if r.name.startswith("diagnose:"))
    systems = json.loads(res.report_json.read_text())["datasets"]["toy"]["comparison"]["systems"]
    assert set(systems) == {"cosine", "bm25", "rp-a", "rp-b"}
    a = load_model(tmp_path / "out" / "models" / "toy" / "rp-a" / "checkpoint")
    b = load_model(tmp_path / "out" / "models" / "toy" / "rp-b" / "checkpoint")
    assert (a.seed, b.seed) == (1, 2) and not torch.equal(a.weight, b.weight)
