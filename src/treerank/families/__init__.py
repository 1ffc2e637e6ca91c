"""The one table of model families: what each family is, how it trains and how it searches.

A family entry (:class:`ModelFamily`) names, as ``"module:attribute"`` strings imported lazily
(so that listing names costs nothing and this module imports no higher layer) or as objects:

* ``model``: the model class (a :class:`~treerank.models.checkpoint.CheckpointMixin`; its
  ``model_type`` is the family name, written in every checkpoint);
* ``config``: ``parse(mapping, where) -> TrainConfig`` (``treerank.training.config``), the
  strict parser of the family's ``model / data / trainer / validation`` config (None: the
  family is not trainable, e.g. ``cosine``);
* ``trainer``: ``train(store, config: TrainConfig, *, train_rows, validate, log, progress,
  device) -> TrainOutput`` (``treerank.training.trainer.TrainFunction``; ``device`` is always
  passed): trainers return the model and its log, they never write files;
* ``mines_negatives``: the trainer draws hard negatives from the ``data`` section
  (``SamplerConfig``), so the pipeline mines BM25 negatives into the store first when needed;
* ``system``: ``make(model, name, *, device) -> System``
  (``treerank.search.systems.SystemHook``; ``device`` is always passed) for families that do
  their own retrieval (the forest's inverted lists); None means a dense family, searched by
  exact inner product of its ``encode_queries`` / ``encode_passages``
  (``treerank.search.systems.DenseSystem``);
* ``report``: ``report(systems: {name: System}) -> {"stats": {name: dict}, "markdown": str}``,
  called with the family's systems after the evaluation, added to the report (optional);
* ``curves``: ``plot(records, summary, path, title) -> Path | None`` for the trained model's
  directory (None: ``treerank.training.history.plot_curves`` of the training log);
* ``modules``: the family's module map, ``(role, path under src/treerank)`` pairs; a role is
  one or more of :data:`MODULE_ROLES` joined by ``" + "``. It is what ``docs/families.md``
  renders (:mod:`treerank.families.family_map`): a family spread over packages is read from one
  page. Paths, not imports: nothing is imported through them;
* ``report_fields``: the keys of the family's training summary that the experiment report's
  training table shows after the generic ones (steps, best value, seconds, ...);
* ``cross_cpu``: a :class:`CrossCpu` for a family whose training sums floats in the CPU's
  reduction order, so that its published numbers move within a tolerance on another x86 CPU
  (None: they reproduce to the printed decimals), read by ``treerank.pipeline.published``;
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
from typing import Any, ClassVar

__all__ = [
    "FAMILIES",
    "CrossCpu",
    "MODULE_ROLES",
    "ModelFamily",
    "family",
    "family_names",
    "register_family",
    "resolve",
    "trainable_families",
]

Ref = str | Callable[..., Any] | type | None

MODULE_ROLES = (
    "model",
    "config",
    "data",
    "losses",
    "stages",
    "trainer",
    "index",
    "kernel",
    "diagnostics",
)
"""The roles of a family's modules in its map (``ModelFamily.modules``), in reading order."""

_HEAD_TRAINING = (
    ("data", "training/sampler.py"),
    ("losses", "training/losses.py"),
    ("trainer", "training/trainer.py"),
)


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
class CrossCpu:
    """How a family's published numbers reproduce on another x86 CPU (``ModelFamily.cross_cpu``).

    Determinism holds per machine; a family whose training sums floats in the CPU's reduction
    order (BLAS / SIMD widths differ) can make other choices on another CPU, and every metric
    of its systems moves.
    """

    tolerance: float
    """Absolute tolerance on every metric mean of the family's systems (the unit of a metric)."""
    why: str
    """Why, as the reproduction note says it (a clause: "the forest's ... order")."""


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
    modules: tuple[tuple[str, str], ...] = ()
    report_fields: tuple[str, ...] = ()
    cross_cpu: CrossCpu | None = None

    FIELD_LAYERS: ClassVar[dict[str, str]] = {
        "model": "models",
        "config": "training",
        "trainer": "training",
        "defaults": "training",
        "curves": "training",
        "system": "search",
        "report": "search",
    }
    """The highest layer (docs/DESIGN.md) a ``"module:attr"`` reference of each field may name:
    the layer whose code resolves it (``load_model`` resolves ``model``; the training side
    ``config`` / ``trainer`` / ``defaults`` / ``curves``; ``ckpt:`` systems and the report
    ``system`` / ``report``). ``tests/test_layers.py`` checks every registered family."""

    PACKAGE_LAYERS: ClassVar[tuple[str, ...]] = ("forest",)
    """Layers that are one family's own package, above ``search`` (``treerank.forest``): any
    field may name them, resolved lazily, until the table moves up into a ``families`` layer
    above them (issue 31 item 1)."""

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
        modules=(("model", "models/cosine.py"),),
    ),
    ModelFamily(
        "linear",
        "treerank.models.linear:LinearHead",
        "linear projection heads (W = I + Delta), InfoNCE",
        config="treerank.training.heads:parse_linear_config",
        trainer="treerank.training.heads:train_linear",
        mines_negatives=True,
        modules=(
            ("model", "models/linear.py"),
            ("model", "models/head.py"),
            ("config + trainer", "training/heads.py"),
            *_HEAD_TRAINING,
        ),
    ),
    ModelFamily(
        "mlp",
        "treerank.models.mlp:MLPHead",
        "residual MLP heads, InfoNCE",
        config="treerank.training.heads:parse_mlp_config",
        trainer="treerank.training.heads:train_mlp",
        mines_negatives=True,
        modules=(
            ("model", "models/mlp.py"),
            ("model", "models/head.py"),
            ("config + trainer", "training/heads.py"),
            *_HEAD_TRAINING,
        ),
    ),
    ModelFamily(
        "drt",
        "treerank.models.drt:DRTHead",
        "decomposed relevance tensors (k slots + query attention)",
        config="treerank.training.drt:parse_drt_config",
        trainer="treerank.training.drt:train_drt",
        mines_negatives=True,
        modules=(
            ("model", "models/drt.py"),
            ("config + trainer", "training/drt.py"),
            *_HEAD_TRAINING,
        ),
    ),
    ModelFamily(
        "forest",
        "treerank.forest.model:Forest",
        "TreeRank forest: M query/passage classifier pairs, retrieval by matching classes",
        config="treerank.forest.trainer:parse_forest_config",
        trainer="treerank.forest.trainer:train_forest",
        system="treerank.forest.index:ForestSystem",
        report="treerank.forest.index:forest_report",
        curves="treerank.forest.trainer:plot_forest_curves",
        defaults="treerank.forest.config:forest_resolved_defaults",
        report_fields=(
            "n_models",
            "n_train_queries",
            "query_class_entropy_mean",
            "max_entropy",
            "not_retrievable_fraction_train",
            "final_train_match_rate_mean",
        ),
        # observed (issue 21): the sample's forest at nDCG@10 0.4891 vs 0.4932 and its unseen
        # part 0.0920 vs 0.0952 on two CPUs, while every other system matched to the decimals
        cross_cpu=CrossCpu(
            0.01,
            "the forest's class assignments and training sum floats in the CPU's reduction order",
        ),
        modules=(
            ("model", "forest/model.py"),
            ("config", "forest/config.py"),
            ("data", "forest/data.py"),
            ("losses", "forest/losses.py"),
            ("stages", "forest/stages.py"),
            ("trainer", "forest/trainer.py"),
            ("trainer", "forest/repartition.py"),
            ("index", "forest/index.py"),
            ("kernel", "forest/kernel.py"),
            ("kernel", "forest/torch_kernel.py"),
            ("kernel", "forest/capacity.py"),
            ("diagnostics", "forest/diagnostics.py"),
            ("diagnostics", "forest/not_retrievable.py"),
        ),
    ),
):
    register_family(_entry)
