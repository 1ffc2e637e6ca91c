"""Transfer table: every model trained on one dataset is a system on every other one; the
table reads the comparisons' means and paired tests (hand-built outcomes)."""

from __future__ import annotations

from pathlib import Path

from treerank.pipeline.config import (
    DatasetConfig,
    DiagnoseConfig,
    EncoderConfig,
    EvaluateConfig,
    ExperimentConfig,
)
from treerank.pipeline.experiment import DatasetOutcome
from treerank.pipeline.identity import RunId
from treerank.pipeline.runs import systems_for
from treerank.pipeline.transfer import transfer_rows, transfer_tables


def _test(delta: float, p: float) -> dict:
    return {"delta": delta, "p_randomization": p}


def _outcomes() -> dict[str, DatasetOutcome]:
    a = DatasetOutcome("squad", "dev", Path("a"), runs=[RunId("linear", "squad")])
    a.comparison = {
        "systems": {
            "cosine": {"mean": {"ndcg@10": 0.6874}},
            "bm25": {"mean": {"ndcg@10": 0.8217}},
            "linear": {"mean": {"ndcg@10": 0.70}},
        },
        "tests": {
            "cosine": {"linear": {"ndcg@10": _test(0.0126, 0.001)}},
            "bm25": {"linear": {"ndcg@10": _test(-0.1217, 0.0001)}},
        },
    }
    a.overlap = {
        "parts": {"unseen": {"linear": {"ndcg@10": {"mean": 0.69, "delta": 0.01, "p": 0.2}}}}
    }
    b = DatasetOutcome("scifact", "test", Path("b"))
    b.comparison = {
        "systems": {"linear@squad": {"mean": {"ndcg@10": 0.64}}},
        "tests": {"cosine": {"linear@squad": {"ndcg@10": _test(-0.005, 0.4)}}},
    }
    return {"squad": a, "scifact": b}


def test_transfer_table_cells():
    outs = _outcomes()
    assert transfer_rows(outs) == [RunId("linear", "squad")]
    md = transfer_tables(outs, ["ndcg@10"], ["cosine", "bm25"])
    lines = md.splitlines()
    assert lines[0] == "#### ndcg@10"
    assert lines[2] == "| model | trained on | squad | scifact |"
    row = lines[4]
    assert row.startswith("| linear | squad | 0.7000 (+0.013* vs cosine; -0.122* vs bm25)")
    assert "unseen 0.6900, +0.010 vs cosine, p = 0.2" in row
    assert row.endswith("| 0.6400 (-0.005 vs cosine) |")


def test_systems_for_adds_models_trained_elsewhere():
    ds = [
        DatasetConfig("squad", Path("x"), "beir", "dev", "train"),
        DatasetConfig("scifact", Path("y"), "scifact", "test", "train"),
    ]

    def cfg(transfer: bool) -> ExperimentConfig:
        return ExperimentConfig(
            "t",
            Path("t.yaml"),
            Path("out"),
            EncoderConfig(),
            ds,
            {},
            ["cosine"],
            EvaluateConfig(),
            DiagnoseConfig(),
            {},
            transfer,
        )

    runs = [RunId("linear", "squad"), RunId("mlp", "squad", 1)]
    out = Path("out")

    def specs(transfer: bool, d: DatasetConfig) -> dict[str, str]:
        return {s.name: s.build_node(out).render() for s in systems_for(cfg(transfer), d, runs)}

    with_t = specs(True, ds[1])
    assert with_t["linear@squad"] == f"ckpt:{out / 'models' / 'squad' / 'linear' / 'checkpoint'}"
    assert with_t["mlp@seed1@squad"].endswith("models/squad/mlp@seed1/checkpoint")
    assert "linear@squad" not in specs(False, ds[1])
    assert specs(True, ds[0])["linear"] == with_t["linear@squad"]
    assert set(specs(False, ds[1])) == {"cosine", "bm25"}  # baselines added once


def test_transfer_key_parses(tmp_path, scifact_zip):
    import pytest

    from treerank.pipeline.config import ConfigError, load_experiment

    body = (
        f"name: t\ndatasets:\n  - {{name: s, path: {scifact_zip}, format: scifact, "
        "eval_split: test}\n"
    )
    (tmp_path / "a.yaml").write_text(body + "transfer: true\n")
    assert load_experiment(tmp_path / "a.yaml").transfer is True
    (tmp_path / "b.yaml").write_text(body)
    assert load_experiment(tmp_path / "b.yaml").transfer is False
    (tmp_path / "c.yaml").write_text(body + "transfer: 3\n")
    with pytest.raises(ConfigError, match="transfer"):
        load_experiment(tmp_path / "c.yaml")


def test_dataset_models_list(tmp_path, scifact_zip):
    import pytest

    from treerank.pipeline.config import ConfigError, load_experiment

    head = "models:\n  a: {family: linear}\n  b: {family: mlp}\n"
    ds = (
        f"datasets:\n  - {{name: s, path: {scifact_zip}, format: scifact, eval_split: test, "
        "train_split: train, models: [MODELS]}\n"
    )
    (tmp_path / "a.yaml").write_text(head + ds.replace("MODELS", "b"))
    assert load_experiment(tmp_path / "a.yaml").datasets[0].models == ["b"]
    (tmp_path / "b.yaml").write_text(head + ds.replace("MODELS", "c"))
    with pytest.raises(ConfigError, match=r"datasets\[0\].models names \['c'\]"):
        load_experiment(tmp_path / "b.yaml")
