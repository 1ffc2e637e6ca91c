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
    """Each family imports its parts directly; the family table's checkpoint loader says the
    same as the family, and the models layer's own default table agrees for the families it
    knows (the dense ones whose classes live below the family table)."""
    from treerank.families import CHECKPOINTS, all_families, model_class, own_system
    from treerank.forest.index import ForestSystem
    from treerank.models.registry import MODEL_CLASSES
    from treerank.models.registry import model_class as lower_model_class
    from treerank.search.systems import DENSE_CHECKPOINTS
    from treerank.training.heads import train_linear

    fams = all_families()
    assert list(fams) == ["cosine", "linear", "mlp", "drt", "forest"]
    for name, fam in fams.items():
        for field in dataclasses.fields(fam):
            assert not isinstance(getattr(fam, field.name), str) or field.name in (
                "name",
                "description",
            ), (name, field.name)
        assert model_class(name) is fam.model and CHECKPOINTS.classes(name) is fam.model, name
        assert own_system(name) is fam.system is CHECKPOINTS.own_system(name), name
        if name in MODEL_CLASSES:
            assert lower_model_class(name) is fam.model and fam.dense, name
            assert DENSE_CHECKPOINTS.own_system(name) is None, name
        assert fam.model.own_retrieval is (fam.system is not None), name
        assert fam.model.trained is fam.trainable, name
    assert fams["forest"].system is ForestSystem and fams["linear"].trainer is train_linear
    assert fams["cosine"].trainable is False and fams["forest"].dense is False
    assert set(fams) - set(MODEL_CLASSES) == {"forest"}  # above the models layer


def test_listing_families_imports_none_of_their_modules() -> None:
    """Listing the families loads none of their own modules (model classes, trainers, the
    forest); the family table imports the light lower modules its checkpoint loader is built
    on (load_model, the ckpt: systems)."""
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


def test_register_family_is_the_one_registration_and_unregister_clears_it() -> None:
    """A registered family loads through the family table's loader; no lower table changes."""
    from treerank.families import (
        CHECKPOINTS,
        FAMILIES,
        ModelFamily,
        family,
        model_class,
        own_system,
        register_family,
        unregister_family,
    )
    from treerank.models.registry import MODEL_CLASSES

    class Toy:
        model_type = "toy-own"

    def make(model: object, name: str) -> object:
        return model

    lower = dict(MODEL_CLASSES)
    register_family(ModelFamily("toy-own", Toy, system=make))
    try:
        assert family("toy-own").model is Toy and model_class("toy-own") is Toy
        assert own_system("toy-own") is make and CHECKPOINTS.own_system("toy-own") is make
        assert MODEL_CLASSES == lower  # nothing written below the family table
        assert "toy-own" not in [n for n, e in FAMILIES.items() if e.trainable]
        with pytest.raises(ValueError, match="already registered"):
            register_family(ModelFamily("toy-own", Toy))
    finally:
        unregister_family("toy-own")
    assert "toy-own" not in FAMILIES and MODEL_CLASSES == lower
    for lookup in (family, model_class, own_system):
        with pytest.raises(KeyError, match="unknown model family"):
            lookup("toy-own")
