"""Every config value of every trainable family is type-checked before any work (issue 33): a
value of the wrong type raises ``ConfigError`` naming the key path and the expected type (the
forest's ``n_models: "16"`` and ``steps_passage: 30.5`` included)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from treerank.config import ConfigError, _matches, allowed_keys, type_hints
from treerank.families import family, trainable_families
from treerank.forest.config import FOREST_SECTION_TYPES
from treerank.training.holdout import ValidationConfig

CANDIDATES: list[Any] = [{"bad": 1}, "bad", 3.5, [1], True]


def _bad_value(annotation: Any) -> Any:
    for v in CANDIDATES:
        if _matches(v, annotation) is False:
            return v
    return None


def _typed_keys(name: str) -> list[tuple[str, str, Any]]:
    """(section, key, annotation) of every typed value of family ``name``'s config."""
    fam = family(name)
    parsed = fam.parse_config({}, "x")
    out: list[tuple[str, str, Any]] = []
    if name.startswith("forest"):
        for sec, record in FOREST_SECTION_TYPES.items():
            out += [(sec, k, a) for k, a in type_hints(record).items()]
    else:
        cls = fam.model
        if name == "drt":
            from treerank.models.drt import DRTConfig

            cls = DRTConfig
        hints = type_hints(cls)
        out += [("model", k, hints[k]) for k in allowed_keys(cls) if k in hints and k != "dim"]
        for sec in ("data", "trainer"):
            part = getattr(parsed, sec)
            if dataclasses.is_dataclass(part):
                out += [(sec, k, a) for k, a in type_hints(type(part)).items() if k != "seed"]
    out += [("validation", k, a) for k, a in type_hints(ValidationConfig).items()]
    return out


FAMILIES = [f for f in trainable_families() if f in {"linear", "mlp", "drt", "forest"}]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_value_of_the_wrong_type_names_its_key(name: str) -> None:
    checked = 0
    for sec, key, annotation in _typed_keys(name):
        bad = _bad_value(annotation)
        if bad is None:
            continue
        with pytest.raises(ConfigError) as err:
            family(name).parse_config({sec: {key: bad}}, "exp.yaml: models.m")
        assert f"exp.yaml: models.m.{sec}.{key}: expected " in str(err.value), (sec, key, err)
        checked += 1
    assert checked >= 20


def test_the_trials_forest_values() -> None:
    with pytest.raises(
        ConfigError, match=r"f\.yaml\.model\.n_models: expected an integer, got '16'"
    ):
        family("forest").parse_config({"model": {"n_models": "16"}}, "f.yaml")
    with pytest.raises(
        ConfigError, match=r"f\.yaml\.trainer\.steps_passage: expected an integer, got 30\.5"
    ):
        family("forest").parse_config({"trainer": {"steps_passage": 30.5}}, "f.yaml")
    with pytest.raises(ConfigError, match=r"hidden: expected a list of integers, got \[64, 'a'\]"):
        family("forest").parse_config({"model": {"hidden": [64, "a"]}}, "f.yaml")
