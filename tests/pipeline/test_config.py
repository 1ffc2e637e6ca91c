from pathlib import Path

import pytest

from treerank.pipeline.config import ConfigError, deep_merge, load_experiment

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def _base(tmp_path: Path, extra: str = "") -> Path:
    return _write(
        tmp_path,
        f"""
name: t
datasets:
  - name: scifact
    path: {SAMPLES / "scifact" / "scifact.zip"}
    format: scifact
    train_split: train
    eval_split: test
models:
  linear: {{epochs: 5}}
  forest: {{n_models: 64}}
diagnose: {{model: linear}}
quick:
  models:
    forest: {{n_models: 4}}
{extra}
""",
    )


def test_quick_profile_merges_over_full(tmp_path: Path) -> None:
    full = load_experiment(_base(tmp_path))
    quick = load_experiment(_base(tmp_path), quick=True)
    assert full.models == {"linear": {"epochs": 5}, "forest": {"n_models": 64}}
    assert quick.models == {"linear": {"epochs": 5}, "forest": {"n_models": 4}}
    assert full.output_dir == Path("runs/t")
    assert full.datasets[0].path == (SAMPLES / "scifact" / "scifact.zip").resolve()


def test_unknown_key_is_named_with_file(tmp_path: Path) -> None:
    p = _base(tmp_path, "evaluate: {k: 100, topk: 5}")
    with pytest.raises(ConfigError, match=r"exp\.yaml: unknown key\(s\) topk in evaluate"):
        load_experiment(p)


def test_unknown_model_and_missing_path(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        f"datasets: [{{name: a, path: {SAMPLES}, format: scifact, eval_split: test}}]\n"
        "models: {colbert: {}}\n",
    )
    with pytest.raises(ConfigError, match="models.colbert is not a trainable model"):
        load_experiment(p)
    p = _write(
        tmp_path, "datasets: [{name: a, path: nowhere.zip, format: scifact, eval_split: t}]\n"
    )
    with pytest.raises(FileNotFoundError, match=r"datasets\[0\]\.path .*nowhere\.zip"):
        load_experiment(p)


def test_deep_merge_does_not_mutate() -> None:
    a = {"x": {"y": 1, "z": 2}, "w": [1]}
    b = {"x": {"y": 5}, "w": [2]}
    assert deep_merge(a, b) == {"x": {"y": 5, "z": 2}, "w": [2]}
    assert a == {"x": {"y": 1, "z": 2}, "w": [1]}


def test_quick_profile_gets_its_own_output_dir(tmp_path: Path) -> None:
    assert load_experiment(_base(tmp_path), quick=True).output_dir == Path("runs/t-quick")
    assert load_experiment(_base(tmp_path), quick=True, output_dir="x").output_dir == Path("x")
