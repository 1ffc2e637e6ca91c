"""The one table of model families: what each family is, how it trains and how it searches.

The ``families`` layer sits above ``models``, ``training`` and ``search`` (docs/DESIGN.md,
"Layers"): a family entry (:class:`ModelFamily`) holds the family's objects themselves, imported
directly, never by name:

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

:data:`FAMILIES` maps each name to a :class:`FamilyEntry`: the name, whether the family trains
(the ``--model`` choices, known without importing anything) and ``load()``, a function that
imports the family's modules and returns its :class:`ModelFamily` (so that listing names costs
no torch / numba import at CLI start-up); :func:`family` loads an entry once.

**One registration point for checkpoints.** This table is the only one a family is registered
in. Every checkpoint load above it goes through :data:`CHECKPOINTS` (a
:class:`~treerank.search.systems.CheckpointLoader` built on :func:`model_class` and
:func:`own_system`) or :func:`load_model`; the layers below receive that loader by injection
(``BuildContext(checkpoints=CHECKPOINTS)`` for ``ckpt:`` systems, ``classes=model_class`` for
``treerank.models.registry.load_model``), so no caller imports this module for its side effects
and nothing is written into a lower table. Without it a lower layer knows only its own (dense)
families and refuses any other class with an error naming the class and the checkpoint. The
curves hook is handed to ``save_trained_model`` by the pipeline. ``tests/models/
test_families.py`` checks that the lower default agrees with this table for the families it
knows. See docs/DESIGN.md, "How to add a model family".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from treerank.models.registry import load_model as _load_checkpoint_model
from treerank.names import unknown_name
from treerank.search.systems import CheckpointLoader, CheckpointSystemMaker

__all__ = [
    "CHECKPOINTS",
    "FAMILIES",
    "CrossCpu",
    "MODULE_ROLES",
    "FamilyEntry",
    "ModelFamily",
    "all_families",
    "family",
    "family_names",
    "load_model",
    "model_class",
    "own_system",
    "register_family",
    "trainable_families",
    "unregister_family",
]

ConfigParser = Callable[[Any, str], Any]
"""``parse(mapping, where) -> TrainConfig``."""
Trainer = Callable[..., Any]
"""``train(store, config, *, train_rows, validate, log, progress) -> TrainOutput``."""
SystemMaker = Callable[..., Any]
"""``make(model, name, *, device=...) -> System`` (a family with its own retrieval)."""
ReportHook = Callable[[dict[str, Any]], dict[str, Any]]
"""``report({name: System}) -> {"stats": {name: dict}, "markdown": str}``."""
CurvesHook = Callable[[list[dict[str, Any]], dict[str, Any], Path, str], "Path | None"]
"""``plot(records, summary, path, title) -> Path | None``."""
DefaultsHook = Callable[[Any, str], Any]
"""``resolve(config: TrainConfig, where) -> dataclass | dict``."""

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
    model: type
    description: str = ""
    config: ConfigParser | None = None
    trainer: Trainer | None = None
    mines_negatives: bool = False
    system: SystemMaker | None = None
    report: ReportHook | None = None
    curves: CurvesHook | None = None
    defaults: DefaultsHook | None = None
    modules: tuple[tuple[str, str], ...] = ()
    report_fields: tuple[str, ...] = ()
    cross_cpu: CrossCpu | None = None

    @property
    def trainable(self) -> bool:
        return self.trainer is not None

    @property
    def dense(self) -> bool:
        """Searched by inner product of ``encode_queries`` / ``encode_passages``."""
        return self.system is None

    def parse_config(self, cfg: Any, where: str = "config") -> Any:
        """The family's parsed :class:`~treerank.training.config.TrainConfig`.

        Raises:
            ConfigError: the family is not trainable, or the config is bad (names the key).
        """
        if self.config is None:
            from treerank.config import ConfigError  # YAML: not imported at CLI start-up

            raise ConfigError(f"{where}: the {self.name!r} family is not trainable")
        return self.config(cfg, where)

    def resolved_config(self, cfg: Any, where: str = "config") -> dict[str, Any]:
        """The parsed config with every default filled in, as plain JSON types.

        Raises:
            ConfigError: as :meth:`parse_config`.
        """
        parsed = self.parse_config(cfg, where)
        out: dict[str, Any] = parsed.to_dict()
        if self.defaults is not None:
            full = self.defaults(parsed, where)
            out["resolved"] = (
                dataclasses.asdict(full)
                if dataclasses.is_dataclass(full) and not isinstance(full, type)
                else dict(full)
            )
        return out

    def train_function(self) -> Trainer:
        """The family's trainer.

        Raises:
            KeyError: the family is not trainable.
        """
        if self.trainer is None:
            raise KeyError(f"the {self.name!r} family is not trainable")
        return self.trainer


@dataclass(frozen=True)
class FamilyEntry:
    """One row of :data:`FAMILIES`: what is known without importing the family's modules."""

    name: str
    trainable: bool
    load: Callable[[], ModelFamily]
    """Imports the family's modules and returns its :class:`ModelFamily` (called once)."""


FAMILIES: dict[str, FamilyEntry] = {}
"""Family name -> entry, in registration order."""


def _check_name(name: str, replace: bool) -> None:
    if not name or ":" in name:
        raise ValueError(f"bad family name {name!r}")
    if name in FAMILIES and not replace:
        raise ValueError(f"model family {name!r} is already registered")


def register_family(entry: ModelFamily, *, replace: bool = False) -> ModelFamily:
    """Add a family to :data:`FAMILIES` (the one table entry a new family needs: its
    checkpoints then load through :data:`CHECKPOINTS` / :func:`load_model` like any other).

    Args:
        entry: the family.
        replace: allow replacing an existing entry of the same name (tests, plugins).

    Raises:
        ValueError: the name is taken (and ``replace`` is false), or empty / contains ``:``.
    """
    _check_name(entry.name, replace)
    FAMILIES[entry.name] = FamilyEntry(entry.name, entry.trainable, lambda: entry)
    _load.cache_clear()
    return entry


def unregister_family(name: str) -> None:
    """Remove a family registered by :func:`register_family` (tests, plugins); an unknown name
    is a no-op."""
    if FAMILIES.pop(name, None) is not None:
        _load.cache_clear()


@cache
def _load(entry: FamilyEntry) -> ModelFamily:
    """Loaded once per entry (a replaced entry, e.g. a test's, loads afresh)."""
    name = entry.name
    fam = entry.load()
    if fam.name != name or fam.trainable != entry.trainable:
        raise ValueError(
            f"family {name!r}: its loader returned {fam.name!r} (trainable {fam.trainable}), "
            f"the table says trainable {entry.trainable}"
        )
    return fam


def family(name: str) -> ModelFamily:
    """The family called ``name`` (its modules imported on first use).

    Raises:
        KeyError: unknown family (the message suggests the closest name and lists the known
            ones).
    """
    if name not in FAMILIES:
        raise KeyError(unknown_name("model family", name, FAMILIES))
    return _load(FAMILIES[name])


def all_families() -> dict[str, ModelFamily]:
    """Every registered family, loaded (imports every family's modules)."""
    return {name: family(name) for name in FAMILIES}


def family_names() -> list[str]:
    """Every registered family name, in registration order."""
    return list(FAMILIES)


def trainable_families() -> list[str]:
    """Names of the families that have a trainer (the ``--model`` choices)."""
    return [n for n, f in FAMILIES.items() if f.trainable]


# ----------------------------------------------------------------------------- built-in families
# One function per family imports its modules inside, so that the table costs no torch / numba
# import until a family is used.


def _cosine() -> ModelFamily:
    from treerank.models.cosine import CosineScorer

    return ModelFamily(
        "cosine",
        CosineScorer,
        "cosine of the frozen embeddings (no training)",
        modules=(("model", "models/cosine.py"),),
    )


def _two_tower_head(
    name: str, model: type, description: str, config: ConfigParser, trainer: Trainer
) -> ModelFamily:
    """A head family of ``training/heads.py`` (linear, mlp): InfoNCE with mined negatives."""
    return ModelFamily(
        name,
        model,
        description,
        config=config,
        trainer=trainer,
        mines_negatives=True,
        modules=(
            ("model", f"models/{name}.py"),
            ("model", "models/head.py"),
            ("config + trainer", "training/heads.py"),
            *_HEAD_TRAINING,
        ),
    )


def _linear() -> ModelFamily:
    from treerank.models.linear import LinearHead
    from treerank.training.heads import parse_linear_config, train_linear

    return _two_tower_head(
        "linear",
        LinearHead,
        "linear projection heads (W = I + Delta), InfoNCE",
        parse_linear_config,
        train_linear,
    )


def _mlp() -> ModelFamily:
    from treerank.models.mlp import MLPHead
    from treerank.training.heads import parse_mlp_config, train_mlp

    return _two_tower_head(
        "mlp", MLPHead, "residual MLP heads, InfoNCE", parse_mlp_config, train_mlp
    )


def _drt() -> ModelFamily:
    from treerank.models.drt import DRTHead
    from treerank.training.drt import parse_drt_config, train_drt

    return ModelFamily(
        "drt",
        DRTHead,
        "decomposed relevance tensors (k slots + query attention)",
        config=parse_drt_config,
        trainer=train_drt,
        mines_negatives=True,
        modules=(
            ("model", "models/drt.py"),
            ("config + trainer", "training/drt.py"),
            *_HEAD_TRAINING,
        ),
    )


def _forest() -> ModelFamily:
    from treerank.forest.config import forest_resolved_defaults
    from treerank.forest.index import ForestSystem, forest_report
    from treerank.forest.model import Forest
    from treerank.forest.trainer import parse_forest_config, plot_forest_curves, train_forest

    return ModelFamily(
        "forest",
        Forest,
        "TreeRank forest: M query/passage classifier pairs, retrieval by matching classes",
        config=parse_forest_config,
        trainer=train_forest,
        system=ForestSystem,
        report=forest_report,
        curves=plot_forest_curves,
        defaults=forest_resolved_defaults,
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
    )


for _name, _trainable, _loader in (
    ("cosine", False, _cosine),
    ("linear", True, _linear),
    ("mlp", True, _mlp),
    ("drt", True, _drt),
    ("forest", True, _forest),
):
    FAMILIES[_name] = FamilyEntry(_name, _trainable, _loader)


# ----------------------------------------------------------------------------- checkpoints
def model_class(model_type: str) -> type:
    """The model class of the family ``model_type`` (a checkpoint's ``model_type``).

    Raises:
        KeyError: unknown family (the message suggests the closest name).
    """
    return family(model_type).model


def own_system(model_type: str) -> CheckpointSystemMaker | None:
    """The own retrieval of the family ``model_type`` (None: a dense family).

    Raises:
        KeyError: unknown family.
    """
    return family(model_type).system


CHECKPOINTS = CheckpointLoader(model_class, own_system)
"""The checkpoint loader that knows every registered family: what every checkpoint load above
this layer uses (``BuildContext(checkpoints=CHECKPOINTS)``, ``CHECKPOINTS.load(path)``)."""


def load_model(
    path: str | Path,
    expected_fingerprint: str | None = None,
    expected_precision: str | None = None,
) -> Any:
    """Load any checkpoint directory of a registered family into its model object.

    Args:
        path: the checkpoint directory.
        expected_fingerprint / expected_precision: the scored store's encoder fingerprint and
            vector precision (``None`` skips a check; see
            :func:`treerank.models.checkpoint.load_checkpoint`).

    Raises:
        UnknownModelClassError: no registered family has the checkpoint's ``model_type`` (the
            message names the class and ``path``).
        FileNotFoundError, ValueError, EncoderMismatchError, PrecisionMixError: see
            ``load_checkpoint``.
    """
    return _load_checkpoint_model(
        path, expected_fingerprint, expected_precision, classes=model_class
    )
