"""The one table of model families: what each family is, how it trains and how it searches.

A family entry (:class:`ModelFamily`) names, as ``"module:attribute"`` strings imported lazily
(so that listing names costs nothing and this module imports no higher layer) or as objects:

* ``model``: the model class (a :class:`~treerank.models.checkpoint.CheckpointMixin`; its
  ``model_type`` is the family name, written in every checkpoint);
* ``config``: ``parse(mapping, where) -> TrainConfig`` (``treerank.training.config``), the
  strict parser of the family's ``model / data / trainer / validation`` config (None: the
  family is not trainable, e.g. ``cosine``);
* ``trainer``: ``train(store, config: TrainConfig, *, train_rows, validate, log, progress)
  -> TrainOutput`` (``treerank.training.trainer.TrainFunction``): trainers return the model and
  its log, they never write files;
* ``mines_negatives``: the trainer draws hard negatives from the ``data`` section
  (``SamplerConfig``), so the pipeline mines BM25 negatives into the store first when needed;
* ``system``: ``make(model, name) -> System`` for families that do their own retrieval (the
  forest's inverted lists); None means a dense family, searched by exact inner product of its
  ``encode_queries`` / ``encode_passages`` (``treerank.search.systems.DenseSystem``);
* ``report``: ``report(systems: {name: System}) -> {"stats": {name: dict}, "markdown": str}``,
  called with the family's systems after the evaluation, added to the report (optional);
* ``curves``: ``plot(records, summary, path, title) -> Path | None`` for the trained model's
  directory (None: ``treerank.training.history.plot_curves`` of the training log);
* ``defaults``: ``resolve(config: TrainConfig, where) -> dataclass | dict``, the config with
  every default filled in, for families whose sections are key lists (None: the parsed
  ``TrainConfig.to_dict()`` is complete); it is part of the pipeline's train-stage key, so a
  changed default re-trains instead of reusing a model trained under the old one.

Registry, config validation, ``--model`` choices, the pipeline's train stage, ``ckpt:`` systems
and the report all read :data:`FAMILIES`; :func:`register_family` adds an entry from anywhere
(a plugin, a test). See docs/DESIGN.md, "How to add a model family".
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FAMILIES",
    "ModelFamily",
    "family",
    "family_names",
    "register_family",
    "resolve",
    "trainable_families",
]

Ref = str | Callable[..., Any] | type | None


def resolve(ref: Ref) -> Any:
    """The object of a ``"module:attribute"`` reference (objects are returned as they are).

    Raises:
        ImportError / AttributeError: the module or attribute does not exist.
    """
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class ModelFamily:
    """One model family (see the module docstring for each field)."""

    name: str
    model: Ref
    description: str = ""
    config: Ref = None
    trainer: Ref = None
    mines_negatives: bool = False
    system: Ref = None
    report: Ref = None
    curves: Ref = None
    defaults: Ref = None

    @property
    def trainable(self) -> bool:
        return self.trainer is not None

    @property
    def dense(self) -> bool:
        """Searched by inner product of ``encode_queries`` / ``encode_passages``."""
        return self.system is None

    def model_class(self) -> Any:
        return resolve(self.model)

    def parse_config(self, cfg: Any, where: str = "config") -> Any:
        """The family's parsed :class:`~treerank.training.config.TrainConfig`.

        Raises:
            ConfigError: the family is not trainable, or the config is bad (names the key).
        """
        if self.config is None:
            from treerank.config import ConfigError

            raise ConfigError(f"{where}: the {self.name!r} family is not trainable")
        return resolve(self.config)(cfg, where)

    def resolved_config(self, cfg: Any, where: str = "config") -> dict[str, Any]:
        """The parsed config with every default filled in, as plain JSON types.

        Raises:
            ConfigError: as :meth:`parse_config`.
        """
        parsed = self.parse_config(cfg, where)
        out: dict[str, Any] = parsed.to_dict()
        if self.defaults is not None:
            full = resolve(self.defaults)(parsed, where)
            out["resolved"] = (
                dataclasses.asdict(full)
                if dataclasses.is_dataclass(full) and not isinstance(full, type)
                else dict(full)
            )
        return out

    def train_function(self) -> Any:
        if self.trainer is None:
            raise KeyError(f"the {self.name!r} family is not trainable")
        return resolve(self.trainer)


FAMILIES: dict[str, ModelFamily] = {}


def register_family(entry: ModelFamily, *, replace: bool = False) -> ModelFamily:
    """Add a family to :data:`FAMILIES` (the one table entry a new family needs).

    Args:
        entry: the family.
        replace: allow replacing an existing entry of the same name (tests, plugins).

    Raises:
        ValueError: the name is taken (and ``replace`` is false), or empty / contains ``:``.
    """
    if not entry.name or ":" in entry.name:
        raise ValueError(f"bad family name {entry.name!r}")
    if entry.name in FAMILIES and not replace:
        raise ValueError(f"model family {entry.name!r} is already registered")
    FAMILIES[entry.name] = entry
    return entry


def family(name: str) -> ModelFamily:
    """The family called ``name``.

    Raises:
        KeyError: unknown family (the message suggests the closest name and lists the known
            ones).
    """
    try:
        return FAMILIES[name]
    except KeyError:
        from treerank.names import unknown_name

        raise KeyError(unknown_name("model family", name, FAMILIES)) from None


def family_names() -> list[str]:
    """Every registered family name, in registration order."""
    return list(FAMILIES)


def trainable_families() -> list[str]:
    """Names of the families that have a trainer (the ``--model`` choices)."""
    return [n for n, f in FAMILIES.items() if f.trainable]


# ----------------------------------------------------------------------------- built-in families
for _entry in (
    ModelFamily(
        "cosine",
        "treerank.models.cosine:CosineScorer",
        "cosine of the frozen embeddings (no training)",
    ),
    ModelFamily(
        "linear",
        "treerank.models.linear:LinearHead",
        "linear projection heads (W = I + Delta), InfoNCE",
        config="treerank.training.heads:parse_linear_config",
        trainer="treerank.training.heads:train_linear",
        mines_negatives=True,
    ),
    ModelFamily(
        "mlp",
        "treerank.models.mlp:MLPHead",
        "residual MLP heads, InfoNCE",
        config="treerank.training.heads:parse_mlp_config",
        trainer="treerank.training.heads:train_mlp",
        mines_negatives=True,
    ),
    ModelFamily(
        "drt",
        "treerank.models.drt:DRTHead",
        "decomposed relevance tensors (k slots + query attention)",
        config="treerank.training.drt:parse_drt_config",
        trainer="treerank.training.drt:train_drt",
        mines_negatives=True,
    ),
    ModelFamily(
        "forest",
        "treerank.models.forest:Forest",
        "TreeRank forest: M query/passage classifier pairs, retrieval by matching classes",
        config="treerank.training.forest:parse_forest_config",
        trainer="treerank.training.forest:train_forest",
        system="treerank.search.forest_index:ForestSystem",
        report="treerank.search.forest_index:forest_report",
        curves="treerank.training.forest:plot_forest_curves",
        defaults="treerank.training.forest_config:forest_resolved_defaults",
    ),
):
    register_family(_entry)
