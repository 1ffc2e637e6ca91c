"""One default per setting (issue 33): each family's built-in defaults and its shipped YAML are
the same record, so ``{family: X}`` in a run, ``treerank train --model X`` (no ``--config``)
and ``treerank train --config configs/.../X.yaml`` train the same model."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from treerank.config import load_yaml
from treerank.families import family
from treerank.pipeline.config import load_experiment

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = {
    "linear": CONFIGS / "heads" / "linear.yaml",
    "mlp": CONFIGS / "heads" / "mlp.yaml",
    "drt": CONFIGS / "drt" / "default.yaml",
    "forest": CONFIGS / "forest" / "default.yaml",
}


def _model_defaults(name: str) -> dict[str, Any]:
    """The model constructor's defaults (a dense family's ``model`` section is passed to it)."""
    fam = family(name)
    cls = fam.model
    if name == "drt":
        from treerank.models.drt import DRTConfig

        cls = DRTConfig
    out: dict[str, Any] = {}
    for c in reversed(cls.__mro__):  # a head passes **kwargs on to its base class
        if "__init__" in vars(c):
            for k, p in inspect.signature(vars(c)["__init__"]).parameters.items():
                if p.default is not inspect.Parameter.empty and k != "dim":
                    out[k] = p.default
    return out


def _resolved(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    out = family(name).resolved_config(cfg, "test")
    if name == "forest":  # its sections are key lists: every value is in "resolved"
        out = {k: out[k] for k in ("seed", "resolved", "validation")}
    else:
        out["model"] = {**_model_defaults(name), **out["model"]}
    return yaml.safe_load(yaml.safe_dump(out))  # tuples as lists


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_yaml_is_the_builtin_defaults(name: str) -> None:
    shipped = _resolved(name, load_yaml(SHIPPED[name]))
    builtin = _resolved(name, {})
    diff = {
        f"{sec}.{k}": (builtin.get(sec, {}).get(k), v)
        for sec, part in shipped.items()
        if isinstance(part, dict)
        for k, v in part.items()
        if builtin.get(sec, {}).get(k) != v
    }
    assert not diff, f"{SHIPPED[name]} differs from the built-in defaults: {diff}"
    assert shipped == builtin


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_run_train_and_config_resolve_alike(name: str, tmp_path: Path) -> None:
    exp = {
        "name": "x",
        "output_dir": str(tmp_path / "runs"),
        "datasets": [
            {"name": "d", "store": str(tmp_path), "dim": 4}
            | {"eval_split": "test", "train_split": "train"}
        ],
        "systems": ["cosine"],
        "evaluate": {"k": 10, "baselines": ["cosine"], "metrics": ["ndcg@10"]},
        "models": {"m": {"family": name}},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    (spec,) = load_experiment(tmp_path / "exp.yaml").models.values()
    in_run = family(name).resolved_config(spec.config, "run")
    cli = family(name).resolved_config({}, "train --model")
    assert in_run == cli
    assert _resolved(name, load_yaml(SHIPPED[name])) == _resolved(name, spec.config)
    if name in ("linear", "mlp"):
        assert cli["trainer"]["epochs"] == 30  # the value configs/mybeir.yaml points at
