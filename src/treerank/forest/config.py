"""The forest family's configuration: hyperparameters, their sections, strict parsing.

A forest config has the sectioned shape of every trainable family (``seed`` + ``model`` / ``data`` /
``trainer`` / ``validation``, see :mod:`treerank.training.config`); internally the trainer reads
the flat :class:`ForestTrainConfig`. :data:`FOREST_SECTIONS` says which field lives in which
section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from treerank.config import ConfigError, check_types
from treerank.forest.losses import UNIFORMITY_KINDS
from treerank.forest.model import TWINS, ForestConfig, ForestSearch
from treerank.kernels.vectors import ROW_CHUNK
from treerank.training.config import TrainConfig, parse_train_config

__all__ = [
    "FOREST_SECTIONS",
    "JOINT_MODES",
    "ForestTrainConfig",
    "forest_resolved_defaults",
    "forest_train_config",
    "parse_forest_config",
    "repartition_settings",
]

JOINT_MODES = ("joint", "alternate")
INITS = ("random", "twin")
"""Query-model init of a trained pair: its own random draw (the seed) or the twin's model."""


@dataclass
class ForestTrainConfig:
    """Hyperparameters of :func:`train_forest`, flat (config sections: :data:`FOREST_SECTIONS`).

    The seed's scale is ``n_models = 2000, n_classes = 1000``; the bundled configs use less so
    that the sample pipeline fits a 2-core CPU budget (see ``configs/forest/``). The defaults run
    every step of the seed (step A included), pairs one by one, and the learned not-retrievable
    outcome; ``docs/forest.md`` lists the departures from the seed.

    Twins (issue 27): ``twin`` names the untrained twin kind (:data:`treerank.forest.model.TWINS`);
    ``untrained: true`` makes the "trained" model that twin itself (no training: the baseline
    beside the forest, same M, C, index and scoring); ``init: twin`` starts each trained pair's
    query model from its twin's. ``probe`` / ``assign`` / ``capacity_epsilon`` / ``scoring`` are
    the search settings (:class:`treerank.forest.model.ForestSearch`) saved with the model.

    IRLI re-partitioning (issue 27, :mod:`treerank.forest.repartition`):
    ``repartition: {rounds: R, steps: S, lr: 0.05}`` in the trainer section re-partitions the
    trained forest (``R`` rounds of re-assignment and ``S`` query-model Adam steps per model,
    boosting weights as the seed's when ``boosting``, ``assign`` / ``capacity_epsilon`` of the
    model section as the capacity, ``group_size`` models at once); absent (the default): none.
    With ``init: twin`` and every ``steps_*`` at 0 it is IRLI from the twin.
    """

    n_models: int = 64
    n_classes: int = 64
    hidden: list[int] = field(default_factory=list)
    nr_threshold: float = 0.5
    seed: int = 0
    group_size: int = 1
    bag_queries: float = 0.7
    bag_passages: float = 0.7
    random_negatives: int = 8
    random_pool: int = 1024
    hard_negatives: int = 8
    sources: list[dict[str, Any]] | None = None
    uniformity: str = "entropy"
    uniformity_weight: float = 5.0
    passage_uniformity_weight: float = 5.0
    sharpness_weight: float = 0.5
    init_scale: float = 1.0
    lr: float = 0.05
    weight_decay: float = 1e-4
    dropout: float = 0.2
    steps_query: int = 10
    steps_passage: int = 60
    steps_joint: int = 30
    joint_mode: str = "joint"
    negative_weight: float = 1.0
    nr_bias_init: float = -4.0
    nr_penalty: float = 0.0
    nr_weight: float = 0.5
    boosting: bool = True
    num_threads: int | None = 1
    chunk_size: int = ROW_CHUNK
    validate_at: list[int] | None = None
    name: str = "forest"
    twin: str = "random"
    untrained: bool = False
    init: str = "random"
    probe: int = 1
    assign: int = 1
    capacity_epsilon: float | None = 0.2
    scoring: str = "shipped"
    repartition: dict[str, Any] | None = None

    @classmethod
    def from_dict(
        cls, cfg: Mapping[str, Any], *, where: str = "forest config"
    ) -> ForestTrainConfig:
        """Validate a config mapping.

        Raises:
            ValueError: unknown keys (listed with the allowed ones) or out-of-range values.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        out = cls(**dict(cfg))
        out.check(where)
        return out

    def check(self, where: str = "forest config") -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"{where}: {msg}")

        if self.n_models < 1 or self.n_classes < 2:
            bad("n_models must be >= 1 and n_classes >= 2")
        if self.group_size < 1:
            bad("group_size must be >= 1")
        for name in ("bag_queries", "bag_passages"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                bad(f"{name} must be in (0, 1] (got {v})")
        if self.uniformity not in UNIFORMITY_KINDS:
            bad(f"uniformity must be one of {UNIFORMITY_KINDS} (got {self.uniformity!r})")
        if self.joint_mode not in JOINT_MODES:
            bad(f"joint_mode must be one of {JOINT_MODES} (got {self.joint_mode!r})")
        if not 0.0 <= self.dropout < 1.0:
            bad(f"dropout must be in [0, 1) (got {self.dropout})")
        if self.nr_weight < 0 or self.nr_penalty < 0:
            bad("nr_weight and nr_penalty must be >= 0")
        if self.chunk_size < 1:
            bad("chunk_size must be >= 1")
        if self.random_pool < 1:
            bad("random_pool must be >= 1")
        for name in ("steps_query", "steps_passage", "steps_joint", "random_negatives"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0")
        if self.hard_negatives < 0:
            bad("hard_negatives must be >= 0")
        if self.twin not in TWINS:
            bad(f"twin must be one of {TWINS} (got {self.twin!r})")
        if self.init not in INITS:
            bad(f"init must be one of {INITS} (got {self.init!r})")
        if self.twin == "sign" and (self.untrained or self.init == "twin"):
            bits = self.n_classes.bit_length() - 1
            if 2**bits != self.n_classes or self.hidden:
                bad(
                    f"twin: sign needs a linear forest with n_classes a power of two "
                    f"(got {self.n_classes})"
                )
        if (self.untrained or self.init == "twin") and self.twin != "random" and self.hidden:
            bad(f"twin: {self.twin} twins are linear (hidden must be [])")
        try:
            self.search()
        except ValueError as exc:
            bad(str(exc))
        if self.repartition is not None:
            if self.untrained:
                bad("trainer.repartition: an untrained twin is not re-partitioned (use init: twin)")
            repartition_settings(self.repartition, f"{where}: trainer.repartition")
        if self.sources is not None:
            from treerank.training.data import parse_sources

            parse_sources(self.sources, where=f"{where}: data.sources")

    def search(self) -> ForestSearch:
        """The search settings of the trained forest (model section)."""
        return ForestSearch(self.probe, self.assign, self.capacity_epsilon, self.scoring)

    def forest_config(self, dim: int) -> ForestConfig:
        return ForestConfig(
            self.n_models, self.n_classes, dim, tuple(self.hidden), self.nr_threshold
        )


REPARTITION_DEFAULTS: dict[str, Any] = {"rounds": 2, "steps": 20, "lr": 0.05}
"""Defaults of the ``trainer.repartition`` keys (those of
:func:`treerank.forest.repartition.repartition`)."""


def repartition_settings(cfg: Any, where: str = "trainer.repartition") -> dict[str, Any]:
    """The checked ``trainer.repartition`` mapping with its defaults filled in.

    Raises:
        ValueError: not a mapping, an unknown key, ``rounds < 1``, ``steps < 0`` or ``lr <= 0``
            (the message names ``where`` and the key).
    """
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: expected a mapping {{rounds, steps, lr}} (got {cfg!r})")
    unknown = sorted(set(cfg) - set(REPARTITION_DEFAULTS))
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(REPARTITION_DEFAULTS)}"
        )
    out = {**REPARTITION_DEFAULTS, **dict(cfg)}
    for key in ("rounds", "steps"):
        if isinstance(out[key], bool) or not isinstance(out[key], int):
            raise ValueError(f"{where}.{key}: expected an integer (got {out[key]!r})")
    if out["rounds"] < 1:
        raise ValueError(f"{where}.rounds: must be >= 1 (got {out['rounds']})")
    if out["steps"] < 0:
        raise ValueError(f"{where}.steps: must be >= 0 (got {out['steps']})")
    if isinstance(out["lr"], bool) or not isinstance(out["lr"], int | float) or out["lr"] <= 0:
        raise ValueError(f"{where}.lr: must be a number > 0 (got {out['lr']!r})")
    return out


FOREST_SECTIONS: dict[str, tuple[str, ...]] = {
    "model": (
        "n_models",
        "n_classes",
        "hidden",
        "nr_threshold",
        "name",
        "twin",
        "untrained",
        "probe",
        "assign",
        "capacity_epsilon",
        "scoring",
    ),
    "data": (
        "bag_queries",
        "bag_passages",
        "random_negatives",
        "random_pool",
        "hard_negatives",
        "sources",
    ),
    "trainer": (
        "group_size",
        "uniformity",
        "uniformity_weight",
        "passage_uniformity_weight",
        "sharpness_weight",
        "init_scale",
        "lr",
        "weight_decay",
        "dropout",
        "steps_query",
        "steps_passage",
        "steps_joint",
        "joint_mode",
        "negative_weight",
        "nr_bias_init",
        "nr_penalty",
        "nr_weight",
        "boosting",
        "num_threads",
        "chunk_size",
        "validate_at",
        "init",
        "repartition",
    ),
}
"""Which :class:`ForestTrainConfig` field each section of the forest's config holds."""


def forest_train_config(cfg: TrainConfig, where: str = "config") -> ForestTrainConfig:
    """The flat :class:`ForestTrainConfig` of a parsed sectioned config (range-checked)."""
    flat = {**cfg.model, **(cfg.data or {}), **(cfg.trainer or {}), "seed": cfg.seed}
    return ForestTrainConfig.from_dict(flat, where=where)


def forest_resolved_defaults(cfg: TrainConfig, where: str = "config") -> dict[str, Any]:
    """Every :class:`ForestTrainConfig` field of a parsed config (the family's ``resolved``
    config, part of the train-stage key), ``repartition`` only when set (its defaults filled
    in): a forest without it
    keeps the resolved config, and so the stage key, it had before the option existed."""
    out = asdict(forest_train_config(cfg, where))
    if out["repartition"] is None:
        del out["repartition"]
    else:  # defaults filled in: {rounds: 2} and {rounds: 2, steps: 20} are one stage
        out["repartition"] = repartition_settings(
            out["repartition"], f"{where}: trainer.repartition"
        )
    return out


def parse_forest_config(
    cfg: Mapping[str, Any] | TrainConfig | None, where: str = "config"
) -> TrainConfig:
    """The ``forest`` family's config: ``seed`` + ``model / data / trainer / validation``
    sections holding the :class:`ForestTrainConfig` fields listed in :data:`FOREST_SECTIONS`.

    Raises:
        ConfigError: unknown key (names the key path and the allowed keys) or a bad value.
    """
    if isinstance(cfg, TrainConfig):
        return cfg
    out = parse_train_config(
        cfg,
        model=FOREST_SECTIONS["model"],
        data=FOREST_SECTIONS["data"],
        trainer=FOREST_SECTIONS["trainer"],
        where=where,
        model_exclude=(),
    )
    for name in ("model", "data", "trainer"):  # key-list sections: typed by the flat record
        check_types(getattr(out, name) or {}, ForestTrainConfig, f"{where}.{name}")
    try:
        forest_train_config(out, where)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    return out
