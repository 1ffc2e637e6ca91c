"""Names are identities, not file names (issue 36): models named `модель` and `模型` both wrote
`runs/system.trec` (one run lost, the other file holding the wrong ranking), and a 300-character
model name crashed after 3 stages. Every name now maps to its file through the injective
`treerank.names.file_name`; names that cannot be represented are refused before any stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.pipeline.test_training import write_store
from treerank.evaluation.trec_io import read_trec_run
from treerank.names import file_name
from treerank.pipeline.config import ConfigError, load_experiment
from treerank.pipeline.experiment import run_experiment

LONG = "m" * 300


def _experiment(tmp_path: Path, models: dict[str, str]) -> Path:
    write_store(tmp_path / "stores" / "train", seed=0)
    write_store(tmp_path / "stores" / "test", seed=1, nq=20)
    doc = {
        "datasets": [
            {"name": "toy", "store": "stores", "train_split": "train", "eval_split": "test"}
        ],
        "systems": ["cosine"],
        "evaluate": {"k": 20, "metrics": ["ndcg@10"], "baselines": ["cosine"]},
        "models": {
            name: {"family": fam, "trainer": {"epochs": 1}, "data": {"hard_negatives": "none"}}
            for name, fam in models.items()
        },
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    return tmp_path / "exp.yaml"


def test_unicode_and_long_model_names_keep_their_own_files(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, {"модель": "linear", "模型": "mlp", LONG: "linear"})
    cfg = load_experiment(exp, output_dir=tmp_path / "out")
    res = run_experiment(cfg, log=lambda s: None, progress=False)
    assert all(r.status in ("ran", "reused") or r.status.startswith("skipped") for r in res.stages)
    runs = tmp_path / "out" / "eval" / "toy" / "runs"
    want = {f"{file_name(s)}.trec" for s in ("cosine", "модель", "模型", LONG)}
    assert {p.name for p in runs.iterdir()} == want  # 4 systems, 4 run files (3 before)
    # each file holds its own system's ranking: the per-query metric recomputed from the file
    # equals the one reported for that system
    per_query = [
        json.loads(line)
        for line in (tmp_path / "out" / "eval" / "toy" / "per_query.jsonl").read_text().splitlines()
    ]
    for system in ("модель", "模型", LONG):
        run = read_trec_run(runs / f"{file_name(system)}.trec")
        assert len(run) == 20  # every test query ranked
        assert len([r for r in per_query if r["system"] == system]) == 20
    a = (runs / f"{file_name('модель')}.trec").read_text()
    b = (runs / f"{file_name('模型')}.trec").read_text()
    assert a != b  # a linear and an MLP head rank differently
    # the model directories are distinct and bounded too
    models = {p.name for p in (tmp_path / "out" / "models" / "toy").iterdir()}
    assert models == {file_name("модель"), file_name("模型"), file_name(LONG)}


@pytest.mark.parametrize("bad", ["two\nlines", "nul\x00"])
def test_unrepresentable_model_name_is_refused_before_any_stage(tmp_path: Path, bad: str) -> None:
    exp = _experiment(tmp_path, {bad: "linear"})
    cfg = load_experiment(exp, output_dir=tmp_path / "out")
    with pytest.raises(ConfigError, match=r"models\[.*\]: model name .*U\+00"):
        run_experiment(cfg, log=lambda s: None, progress=False)
    assert not (tmp_path / "out").exists()
