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


def test_every_entry_holds_objects_and_the_lower_tables_agree() -> None:
    """Each family imports its parts directly; ``load_model``'s class table and the ``ckpt:``
    own-retrieval table (layers below the family table) say the same as the family."""
    from treerank.families import all_families
    from treerank.forest.index import ForestSystem
    from treerank.models.registry import model_class
    from treerank.search.systems import checkpoint_system
    from treerank.training.heads import train_linear

    fams = all_families()
    assert list(fams) == ["cosine", "linear", "mlp", "drt", "forest"]
    for name, fam in fams.items():
        for field in dataclasses.fields(fam):
            assert not isinstance(getattr(fam, field.name), str) or field.name in (
                "name",
                "description",
            ), (name, field.name)
        assert model_class(name) is fam.model, name
        assert checkpoint_system(name) is fam.system, name
        assert fam.model.own_retrieval is (fam.system is not None), name
        assert fam.model.trained is fam.trainable, name
    assert fams["forest"].system is ForestSystem and fams["linear"].trainer is train_linear
    assert fams["cosine"].trainable is False and fams["forest"].dense is False


def test_listing_families_imports_none_of_their_modules() -> None:
    """Listing the families loads none of their own modules (model classes, trainers, the
    forest); the family table loads the light lower tables it fills (load_model's model classes,
    the ckpt: own retrievals)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from treerank.families import family_names, trainable_families\n"
        "print(family_names(), trainable_families())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('treerank.training', "
        "'treerank.forest', 'treerank.models.linear', 'treerank.models.mlp', "
        "'treerank.models.drt', 'numba'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == (
        "['cosine', 'linear', 'mlp', 'drt', 'forest'] ['linear', 'mlp', 'drt', 'forest']"
    )
    assert out[1] == "[]"


def test_register_family_fills_the_lower_tables_and_unregister_clears_them() -> None:
    from treerank.families import (
        FAMILIES,
        ModelFamily,
        family,
        register_family,
        unregister_family,
    )
    from treerank.models.registry import MODEL_CLASSES, model_class
    from treerank.search.systems import checkpoint_system

    class Toy:
        model_type = "toy-own"

    def make(model: object, name: str) -> object:
        return model

    register_family(ModelFamily("toy-own", Toy, system=make))
    try:
        assert family("toy-own").model is Toy and model_class("toy-own") is Toy
        assert checkpoint_system("toy-own") is make
        assert "toy-own" not in [n for n, e in FAMILIES.items() if e.trainable]
        with pytest.raises(ValueError, match="already registered"):
            register_family(ModelFamily("toy-own", Toy))
    finally:
        unregister_family("toy-own")
    assert "toy-own" not in FAMILIES and "toy-own" not in MODEL_CLASSES
    assert checkpoint_system("toy-own") is None
    with pytest.raises(KeyError, match="unknown model family"):
        family("toy-own")
