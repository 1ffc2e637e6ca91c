"""`treerank sweep`: grid parsing, key paths, the table, and a 2x2 sweep equal to four runs."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from treerank.pipeline.config import ConfigError, load_experiment
from treerank.pipeline.experiment import run_experiment
from treerank.pipeline.sweep import (
    Setting,
    parse_grid,
    read_per_query,
    run_sweep,
    set_path,
    settings_of,
    sweep_table,
    table_markdown,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "configs" / "sample.yaml"


def test_parse_grid_and_settings() -> None:
    g = parse_grid(["models.drt.trainer.lambda_dec=0,0.1", "models.drt.model.k=4,6", "x=null,a"])
    assert g == {
        "models.drt.trainer.lambda_dec": [0, 0.1],
        "models.drt.model.k": [4, 6],
        "x": [None, "a"],
    }
    s = settings_of({"a.b": [0, 0.1], "c": [4, 6]})
    assert [x.values for x in s] == [
        {"a.b": 0, "c": 4},
        {"a.b": 0, "c": 6},
        {"a.b": 0.1, "c": 4},
        {"a.b": 0.1, "c": 6},
    ]
    assert s[3].slug == "s03-b=0.1-c=6"
    for bad in (["a"], ["a="], ["a=1", "a=2"]):
        with pytest.raises(ValueError):
            parse_grid(bad)


def test_half_fraction_design() -> None:
    """2^(4-1) with I = ABCD: 8 of 16 settings, each with an even count of second levels;
    every key and every pair of keys is balanced (each level pair appears twice)."""
    grid = {"a": [0, 1], "b": [0, 1], "c": ["x", "y"], "d": [32, 128]}
    s = settings_of(grid, "half")
    codes = [tuple(grid[k].index(x.values[k]) for k in grid) for x in s]
    assert codes == [
        (0, 0, 0, 0),
        (0, 0, 1, 1),
        (0, 1, 0, 1),
        (0, 1, 1, 0),
        (1, 0, 0, 1),
        (1, 0, 1, 0),
        (1, 1, 0, 0),
        (1, 1, 1, 1),
    ]
    assert s[1].slug == "s03-a=0-b=0-c=y-d=128"  # names keep the full product's index
    for i in range(4):
        for j in range(i + 1, 4):
            pairs = [(c[i], c[j]) for c in codes]
            assert sorted(pairs) == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]
    with pytest.raises(ValueError, match="exactly two values per key; a has 3"):
        settings_of({"a": [0, 1, 2], "b": [0, 1], "c": [0, 1]}, "half")
    with pytest.raises(ValueError, match="unknown sweep design"):
        settings_of(grid, "quarter")
    with pytest.raises(ValueError, match="at least 3 keys"):
        settings_of({"a": [0, 1], "b": [0, 1]}, "half")
    from treerank.pipeline.sweep import _design_note

    assert "I = ABCD" in _design_note("half", list(grid)) and _design_note("full", ["a"]) == ""


def test_set_path() -> None:
    raw = {"models": {"drt": {"loss": {"lambda_dec": 0.1}}}, "datasets": [{"limit": 5}]}
    set_path(raw, "models.drt.loss.lambda_dec", 0)
    set_path(raw, "datasets.0.limit", 9)
    set_path(raw, "models.drt.loss.new_key", 1)  # the leaf may be new (validation decides)
    assert raw["models"]["drt"]["loss"] == {"lambda_dec": 0, "new_key": 1}
    assert raw["datasets"][0]["limit"] == 9
    with pytest.raises(ConfigError, match="no key 'mlp'"):
        set_path(raw, "models.mlp.seed", 1)
    with pytest.raises(ConfigError, match="index"):
        set_path(raw, "datasets.3.limit", 1)


def test_sweep_table_against_the_reference_setting() -> None:
    s = [Setting({"k": 4}, "a"), Setting({"k": 6}, "b")]
    pq = {
        "a": {"ds": {"drt": {"ndcg@10": np.array([0.2, 0.4, np.nan, 0.6])}}},
        "b": {"ds": {"drt": {"ndcg@10": np.array([0.3, 0.6, 0.5, 0.6])}}},
    }
    rows = sweep_table(s, s[0], pq, ["ndcg@10"])
    ref, other = rows[0]["ndcg@10"], rows[1]["ndcg@10"]
    assert ref["mean"] == pytest.approx(0.4) and ref["delta"] is None and ref["n"] == 3
    assert ref["ci_low"] <= 0.4 <= ref["ci_high"]
    assert other["mean"] == pytest.approx(0.5)
    assert other["delta"] == pytest.approx((0.1 + 0.2 + 0.0) / 3)  # pairs with NaN dropped
    assert 0 < other["p"] <= 1
    md = table_markdown(rows, ["k"], ["ndcg@10"])
    assert "| 4 | ds | drt | 0.4000 [" in md and "| ref |" in md and "+0.1000 (" in md


def _tiny_experiment(tmp_path: Path) -> Path:
    """A linear head on 20 SciFact queries / 120 passages per split, trained for a few steps."""
    raw = yaml.safe_load(SAMPLE.read_text())
    raw.pop("quick", None)
    ds = raw["datasets"][0]
    ds.update(path=str((SAMPLE.parent / ds["path"]).resolve()), limit=20, max_passages=120)
    raw["datasets"] = [ds]
    lin = raw["models"]["linear"]
    lin.pop("seeds", None)  # the grid below sweeps the single `seed`
    lin["trainer"].update(epochs=1, max_steps=2, eval_every=None)
    lin["validation"].update(fraction=0.0)
    raw["models"] = {"linear": lin}
    raw.pop("finetune", None)  # the main job's query tower: not what this sweep is about
    raw["systems"] = ["cosine"]
    raw["evaluate"].update(k=50, baselines=["cosine"], metrics=["mrr@10", "ndcg@10"])
    raw["diagnose"] = {"model": None}
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.slow
def test_2x2_sweep_table_equals_four_separate_runs(tmp_path: Path) -> None:
    exp = _tiny_experiment(tmp_path)
    grid = ["models.linear.trainer.max_steps=1,2", "models.linear.seed=0,1"]
    res = run_sweep(exp, grid, out=tmp_path / "sweep", progress=False, log=lambda s: None)
    assert len(res.settings) == 4 and res.reference is res.settings[0]
    # incremental: both splits were embedded once for the four settings; the rest re-runs
    ran = [r.name for recs in res.stages.values() for r in recs if not r.reused]
    assert ran.count("embed:scifact:train") == 1 and ran.count("embed:scifact:test") == 1
    assert ran.count("train:scifact:linear") == 4

    # four separate `treerank run`s of the same settings give the same table
    per_query = {}
    for s in res.settings:
        raw = yaml.safe_load(exp.read_text())
        for k, v in s.values.items():
            set_path(raw, k, v)
        p = tmp_path / f"{s.slug}.yaml"
        p.write_text(yaml.safe_dump(raw))
        one = run_experiment(
            load_experiment(p, output_dir=tmp_path / "runs" / s.slug),
            progress=False,
            log=lambda x: None,
        )
        per_query[s.slug] = {
            ds: read_per_query(Path(o.eval_dir), ["mrr@10", "ndcg@10"])
            for ds, o in one.datasets.items()
        }
    separate = sweep_table(res.settings, res.settings[0], per_query, ["mrr@10", "ndcg@10"])
    assert separate == res.rows
    means = {r["setting"]: r["ndcg@10"]["mean"] for r in res.rows if r["system"] == "linear"}
    assert len(means) == 4

    doc = json.loads(res.files["json"].read_text())
    assert doc["keys"] == ["models.linear.trainer.max_steps", "models.linear.seed"]
    assert (tmp_path / "sweep" / "plots" / "models.linear.seed.png").exists()
    assert "| ref |" in res.files["table"].read_text()

    # a second sweep reuses every stage
    again = run_sweep(exp, grid, out=tmp_path / "sweep", progress=False, log=lambda s: None)
    assert all(r.reused or r.skipped for recs in again.stages.values() for r in recs)
    assert again.rows == res.rows


def test_drt_ablation_config_every_setting_validates(tmp_path: Path) -> None:
    from treerank.pipeline.sweep import _absolute_paths, split_sweep_section

    src = REPO / "configs" / "sweeps" / "drt_ablation_scifact.yaml"
    raw, sec = split_sweep_section(yaml.safe_load(src.read_text()), src)
    _absolute_paths(raw, src.parent)
    settings = settings_of(sec["grid"])
    assert len(settings) == 12 and sec["reference"] in [s.values for s in settings]
    for s in settings:
        one = yaml.safe_load(yaml.safe_dump(raw))
        for k, v in s.values.items():
            set_path(one, k, v)
        p = tmp_path / f"{s.slug}.yaml"
        p.write_text(yaml.safe_dump(one))
        cfg = load_experiment(p)
        drt = cfg.models["drt"].config
        assert (drt["trainer"]["lambda_dec"], drt["model"]["slot_dropout"], drt["model"]["k"]) == (
            s.values["models.drt.trainer.lambda_dec"],
            s.values["models.drt.model.slot_dropout"],
            s.values["models.drt.model.k"],
        )


def test_relative_store_roots_resolve_against_the_sweep_file(tmp_path: Path) -> None:
    """Each setting's YAML is written under the sweep's folder, so a relative `store:` (like
    `path:`) is made absolute against the sweep file first."""
    from treerank.pipeline.sweep import _absolute_paths

    raw = {"datasets": [{"name": "a", "store": "../stores/a"}, {"name": "b", "path": "b.zip"}]}
    _absolute_paths(raw, tmp_path / "configs")
    assert raw["datasets"][0]["store"] == str((tmp_path / "stores" / "a").resolve())
    assert raw["datasets"][1]["path"] == str((tmp_path / "configs" / "b.zip").resolve())


def test_sample_store_variant_differs_only_in_its_dataset() -> None:
    """The variant that reads the main job's SciFact store runs the shipped grid unchanged."""
    base = yaml.safe_load((REPO / "configs/sweeps/drt_ablation_scifact.yaml").read_text())
    var = yaml.safe_load(
        (REPO / "configs/sweeps/drt_ablation_scifact_sample_store.yaml").read_text()
    )
    assert var["datasets"] == [
        {
            "name": "scifact",
            "store": "../../runs/sample/stores/scifact",
            "train_split": "train",
            "eval_split": "test",
        }
    ]
    same = ("sweep", "encoder", "systems", "evaluate", "diagnose", "models", "quick")
    assert {k: var[k] for k in same} == {k: base[k] for k in same}
