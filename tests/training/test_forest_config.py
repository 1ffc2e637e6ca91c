"""The forest's one typed config (issue 31 item 7): a frozen record per YAML section, ``Literal``
choices checked with their key path, a typed ``trainer.repartition`` record, and the flat
resolved config (the train-stage key) unchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest

from treerank.config import ConfigError
from treerank.forest.config import (
    FOREST_SECTION_TYPES,
    FOREST_SECTIONS,
    ForestDataSection,
    ForestModelSection,
    ForestTrainConfig,
    ForestTrainerSection,
    Repartition,
    forest_resolved_defaults,
    forest_train_config,
    parse_forest_config,
)


def test_the_config_mirrors_the_yaml_sections() -> None:
    assert [f.name for f in dataclasses.fields(ForestTrainConfig)] == [
        "seed",
        "model",
        "data",
        "trainer",
    ]
    assert set(FOREST_SECTIONS) == {"model", "data", "trainer"}
    for record in (ForestModelSection, ForestDataSection, ForestTrainerSection, Repartition):
        assert dataclasses.fields(record)  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record(), dataclasses.fields(record)[0].name, 1)  # type: ignore[arg-type]
    raw = {
        "seed": 4,
        "model": {"n_models": 3, "hidden": [8], "scoring": "count"},
        "data": {"hard_negatives": 2},
        "trainer": {"joint_mode": "alternate", "repartition": {"rounds": 1}},
    }
    cfg = forest_train_config(parse_forest_config(raw, "f.yaml"), "f.yaml")
    assert cfg.seed == 4
    assert cfg.model == ForestModelSection(n_models=3, hidden=(8,), scoring="count")
    assert cfg.data == ForestDataSection(hard_negatives=2)
    assert cfg.trainer.joint_mode == "alternate"
    assert cfg.trainer.repartition == Repartition(rounds=1, steps=20, lr=0.05)
    assert cfg.search().scoring == "count" and cfg.forest_config(5).hidden == (8,)


@pytest.mark.parametrize(
    ("sec", "key", "value", "choices"),
    [
        ("trainer", "joint_mode", "both", "'joint', 'alternate'"),
        ("trainer", "uniformity", "kl", "'entropy', 'gini'"),
        ("trainer", "init", "zero", "'random', 'twin'"),
        ("model", "twin", "pca", "'random', 'sign', 'kmeans'"),
        ("model", "scoring", "bm25", "'shipped', 'count', 'soft', 'query-prob'"),
    ],
)
def test_a_bad_choice_names_its_key_path_and_the_choices(sec, key, value, choices) -> None:
    with pytest.raises(ConfigError) as err:
        parse_forest_config({sec: {key: value}}, "f.yaml")
    assert str(err.value) == f"f.yaml.{sec}.{key}: expected one of {choices}, got {value!r}"


def test_the_section_records_type_every_key() -> None:
    for sec, record in FOREST_SECTION_TYPES.items():
        assert FOREST_SECTIONS[sec] == tuple(f.name for f in dataclasses.fields(record))
    with pytest.raises(ConfigError, match=r"f\.yaml: trainer\.repartition\.rounds: must be >= 1"):
        parse_forest_config({"trainer": {"repartition": {"rounds": 0}}}, "f.yaml")


def test_the_resolved_config_stays_flat_and_json() -> None:
    """The train-stage key reads the flat resolved config: every section key once, as JSON
    types (``hidden`` a list, ``repartition`` its filled-in mapping, only when set)."""
    plain = forest_resolved_defaults(parse_forest_config({"model": {"hidden": [4, 2]}}))
    assert plain["hidden"] == [4, 2] and "repartition" not in plain
    assert set(plain) == {"seed", *(k for keys in FOREST_SECTIONS.values() for k in keys)} - {
        "repartition"
    }
    assert plain["n_models"] == 64 and plain["steps_passage"] == 60 and plain["seed"] == 0
    json.dumps(plain)
    rp = forest_resolved_defaults(
        parse_forest_config({"trainer": {"repartition": {"steps": 3, "lr": 1}}})
    )
    assert rp["repartition"] == {"rounds": 2, "steps": 3, "lr": 1}
    # flat keys round-trip, and replace changes one key of its section
    cfg = ForestTrainConfig.from_dict(plain)
    assert cfg.flat() == {**plain, "repartition": None}
    assert cfg.replace(dropout=0.5).trainer.dropout == 0.5 and cfg.trainer.dropout == 0.2
    with pytest.raises(TypeError, match="unknown key 'n_trees'"):
        ForestTrainConfig.of(n_trees=3)
