"""The family table's resolved configs (part of the pipeline's train-stage key)."""

import dataclasses

import pytest

from treerank.families import family
from treerank.forest.config import ForestTrainConfig
from treerank.training.holdout import ValidationConfig


def test_resolved_config_holds_defaults_the_yaml_does_not_name() -> None:
    full = family("linear").resolved_config({"trainer": {"lr": 0.01}})
    assert full["trainer"]["lr"] == 0.01
    assert full["validation"]["group_by_passage"] is True  # a default, not in the YAML
    assert full["data"]["batch_size"] == family("linear").resolved_config({})["data"]["batch_size"]


def test_a_changed_default_changes_the_resolved_config(monkeypatch: pytest.MonkeyPatch) -> None:
    before = family("mlp").resolved_config({})
    fields = {f.name: f for f in dataclasses.fields(ValidationConfig)}
    monkeypatch.setattr(fields["group_by_passage"], "default", False)
    patched = dataclasses.make_dataclass(
        "ValidationConfig",
        [(f.name, f.type, f) for f in fields.values()],
    )
    monkeypatch.setattr("treerank.training.config.ValidationConfig", patched)
    after = family("mlp").resolved_config({})
    assert before["validation"]["group_by_passage"] is True
    assert after["validation"]["group_by_passage"] is False


def test_key_list_families_resolve_through_their_defaults_hook() -> None:
    out = family("forest").resolved_config({"model": {"n_models": 3}})
    assert out["model"] == {"n_models": 3}  # the sections keep what the YAML says
    resolved = out["resolved"]
    # every field, but ``repartition`` only when set (forest_resolved_defaults: stage keys kept)
    fields = set(ForestTrainConfig().flat())
    assert set(resolved) == fields - {"repartition"}
    assert resolved["n_models"] == 3
    assert resolved["n_classes"] == ForestTrainConfig().model.n_classes
