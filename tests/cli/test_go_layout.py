"""Stores written by the original Go ``cmd/embed`` tool (no sidecars, 3840 dims, label tables
``queries_passage_ids.bin`` / ``queries_is_selected.bin``): train, evaluate, diagnose and run
work on them through --dim (``dim:`` in an experiment's dataset)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from treerank.cli.main import app

DIM = 3840


def write_go_store(root: Path, nq: int = 48, npas: int = 160, k: int = 4, seed: int = 0) -> Path:
    """A Go-layout split: vectors not unit length, MS MARCO-like candidates (1 selected + 3 not).

    Queries are noisy copies of their selected passage, so cosine finds it (a real signal).
    """
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((npas, DIM)).astype("<f4") * rng.uniform(0.5, 2.0, (npas, 1))
    gold = rng.choice(npas, size=nq, replace=False)
    q = p[gold] + 0.8 * rng.standard_normal((nq, DIM)).astype("<f4") * np.abs(p[gold]).mean()
    cand = np.stack([gold, *[rng.integers(0, npas, nq) for _ in range(k - 1)]], 1).astype("<i4")
    sel = np.zeros((nq, k), np.uint8)
    sel[:, 0] = 1
    root.mkdir(parents=True)
    q.astype("<f4").tofile(root / "queries.bin")
    p.astype("<f4").tofile(root / "passages.bin")
    cand.tofile(root / "queries_passage_ids.bin")
    sel.tofile(root / "queries_is_selected.bin")
    return root


@pytest.fixture(scope="module")
def go_store(tmp_path_factory) -> Path:
    return write_go_store(tmp_path_factory.mktemp("go") / "dev")


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_go_store_trains_evaluates_and_diagnoses_with_dim(go_store: Path, tmp_path: Path) -> None:
    cfg = {
        "seed": 0,
        "data": {"batch_size": 16, "n_hard": 1},
        "trainer": {"epochs": 2, "log_every": 1, "threads": 1},
        "validation": {"fraction": 0.25, "k": 20},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = _invoke(
        "train",
        "-m",
        "linear",
        "-s",
        go_store,
        "-c",
        tmp_path / "c.yaml",
        "-o",
        tmp_path / "ck",
        "--no-progress",
    )
    assert r.exit_code == 2 and "dim=3840" in r.output  # without --dim: says what to pass
    r = _invoke(
        "train",
        "-m",
        "linear",
        "-s",
        go_store,
        "-c",
        tmp_path / "c.yaml",
        "-o",
        tmp_path / "ck",
        "--dim",
        DIM,
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert doc["dim"] == DIM and doc["model_type"] == "linear"
    r = _invoke(
        "evaluate",
        "-s",
        go_store,
        "--dim",
        DIM,
        "--system",
        "cosine",
        "--system",
        f"ckpt:{tmp_path / 'ck'}",
        "--baseline",
        "cosine",
        "--out",
        tmp_path / "ev",
    )
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["systems"]["cosine"]["mean"]["mrr@10"] > 0.9  # the signal is real
    r = _invoke(
        "diagnose",
        tmp_path / "ck",
        "-s",
        go_store,
        "--dim",
        DIM,
        "-o",
        tmp_path / "d",
        "--no-plots",
        "--k",
        50,
    )
    assert r.exit_code == 0, r.output
    diag = json.loads((tmp_path / "d" / "diagnostics.json").read_text())
    # the diagnostics' cosine baseline is the cosine system on this non-normalised store
    assert diag["baseline"]["mean"]["mrr@10"] == pytest.approx(
        res["systems"]["cosine"]["mean"]["mrr@10"], abs=1e-9
    )


def test_go_store_runs_as_an_experiment_dataset(tmp_path: Path) -> None:
    root = tmp_path / "go"
    write_go_store(root / "train", nq=64, seed=1)
    write_go_store(root / "dev", seed=2)
    exp = {
        "name": "go",
        "datasets": [
            {
                "name": "go",
                "store": str(root),
                "dim": DIM,
                "train_split": "train",
                "eval_split": "dev",
            }
        ],
        "systems": ["cosine"],
        "evaluate": {"k": 50, "baselines": ["cosine"], "metrics": ["mrr@10", "ndcg@10"]},
        "models": {
            "lin": {
                "family": "linear",
                "data": {"batch_size": 16},
                "trainer": {"epochs": 2, "threads": 1},
                "validation": {"fraction": 0.25, "k": 20, "metrics": ["mrr@10", "ndcg@10"]},
            }
        },
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    r = _invoke("run", tmp_path / "exp.yaml", "--out", tmp_path / "out", "--no-progress")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    systems = report["datasets"]["go"]["comparison"]["systems"]
    assert set(systems) == {"cosine", "lin"} and systems["cosine"]["mean"]["mrr@10"] > 0.9
    assert (tmp_path / "out" / "diagnose" / "go" / "diagnostics.json").is_file()
    assert not (root / "dev" / "stage.json").exists()  # the given store is only read
