"""The forest family's configuration: hyperparameters, their sections, strict parsing.

A forest config has the sectioned shape of every trainable family (``seed`` + ``model`` / ``data`` /
``trainer`` / ``validation``, see :mod:`treerank.training.config`); the trainer reads the one
typed :class:`ForestTrainConfig`, which mirrors it: ``seed`` and a frozen record per section
(choices as ``Literal`` types, ``trainer.repartition`` a :class:`Repartition` record).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from treerank.config import ConfigError, check_types
from treerank.forest.losses import UNIFORMITY_KINDS, Uniformity
from treerank.forest.model import TWINS, ForestConfig, ForestSearch, Scoring, Twin
from treerank.kernels.vectors import ROW_CHUNK
from treerank.training.config import TrainConfig, parse_train_config

__all__ = [
    "FOREST_SECTIONS",
    "FOREST_SECTION_TYPES",
    "INITS",
    "JOINT_MODES",
    "ForestDataSection",
    "ForestModelSection",
    "ForestTrainConfig",
    "ForestTrainerSection",
    "Repartition",
    "forest_resolved_defaults",
    "forest_train_config",
    "parse_forest_config",
    "repartition_settings",
]

JointMode = Literal["joint", "alternate"]
JOINT_MODES: tuple[str, ...] = get_args(JointMode)
Init = Literal["random", "twin"]
"""Query-model init of a trained pair: its own random draw (the seed) or the twin's model."""
INITS: tuple[str, ...] = get_args(Init)


@dataclass(frozen=True)
class Repartition:
    """``trainer.repartition``: IRLI re-partitioning of the trained forest
    (:func:`treerank.forest.repartition.repartition`), ``rounds`` of re-assignment and
    ``steps`` query-model Adam steps at rate ``lr`` per model."""

    rounds: int = 2
    steps: int = 20
    lr: float = 0.05


REPARTITION_DEFAULTS: dict[str, Any] = asdict(Repartition())
"""Defaults of the ``trainer.repartition`` keys (those of :class:`Repartition`)."""


@dataclass(frozen=True)
class ForestModelSection:
    """The ``model`` section: the forest's shape, its untrained twin and its search settings
    (:class:`treerank.forest.model.ForestSearch`, saved with the model).

    ``twin`` names the untrained twin kind (:data:`treerank.forest.model.TWINS`);
    ``untrained: true`` makes the "trained" model that twin itself (no training: the baseline
    beside the forest, same M, C, index and scoring).
    """

    n_models: int = 64
    n_classes: int = 64
    hidden: tuple[int, ...] = ()
    nr_threshold: float = 0.5
    name: str = "forest"
    twin: Twin = "random"
    untrained: bool = False
    probe: int = 1
    assign: int = 1
    capacity_epsilon: float | None = 0.2
    scoring: Scoring = "shipped"

    def search(self) -> ForestSearch:
        """The search settings of the trained forest."""
        return ForestSearch(self.probe, self.assign, self.capacity_epsilon, self.scoring)

    def forest_config(self, dim: int) -> ForestConfig:
        """The model's shape for ``dim``-wide vectors."""
        return ForestConfig(self.n_models, self.n_classes, dim, self.hidden, self.nr_threshold)


@dataclass(frozen=True)
class ForestDataSection:
    """The ``data`` section: bagging, negatives and the shared ``data.sources``."""

    bag_queries: float = 0.7
    bag_passages: float = 0.7
    random_negatives: int = 8
    random_pool: int = 1024
    hard_negatives: int = 8
    sources: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ForestTrainerSection:
    """The ``trainer`` section: the three stages' losses and steps, boosting, threads, blocks,
    the twin init and IRLI re-partitioning (``repartition``: None = none)."""

    group_size: int = 1
    uniformity: Uniformity = "entropy"
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
    joint_mode: JointMode = "joint"
    negative_weight: float = 1.0
    nr_bias_init: float = -4.0
    nr_penalty: float = 0.0
    nr_weight: float = 0.5
    boosting: bool = True
    num_threads: int | None = 1
    chunk_size: int = ROW_CHUNK
    validate_at: list[int] | None = None
    init: Init = "random"
    repartition: Repartition | None = None


FOREST_SECTION_TYPES: dict[str, type] = {
    "model": ForestModelSection,
    "data": ForestDataSection,
    "trainer": ForestTrainerSection,
}
"""The record of each section of the forest's config."""

FOREST_SECTIONS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in fields(cls)) for name, cls in FOREST_SECTION_TYPES.items()
}
"""The keys of each section of the forest's config (the section records' fields)."""


@dataclass(frozen=True)
class ForestTrainConfig:
    """Hyperparameters of :func:`train_forest`: ``seed`` and one frozen record per YAML section
    (:class:`ForestModelSection`, :class:`ForestDataSection`, :class:`ForestTrainerSection`).

    The seed's scale is ``n_models = 2000, n_classes = 1000``; the bundled configs use less so
    that the sample pipeline fits a 2-core CPU budget (see ``configs/forest/``). The defaults run
    every step of the seed (step A included), pairs one by one, and the learned not-retrievable
    outcome; ``docs/forest.md`` lists the departures from the seed.

    Twins (issue 27): ``trainer.init: twin`` starts each trained pair's query model from its
    twin's (``model.twin``). IRLI re-partitioning (issue 27,
    :mod:`treerank.forest.repartition`): ``trainer.repartition: {rounds: R, steps: S, lr}``
    re-partitions the trained forest (``R`` rounds of re-assignment and ``S`` query-model Adam
    steps per model, boosting weights as the seed's when ``boosting``, ``assign`` /
    ``capacity_epsilon`` of the model section as the capacity, ``group_size`` models at once);
    absent (the default): none. With ``init: twin`` and every ``steps_*`` at 0 it is IRLI from
    the twin.
    """

    seed: int = 0
    model: ForestModelSection = field(default_factory=ForestModelSection)
    data: ForestDataSection = field(default_factory=ForestDataSection)
    trainer: ForestTrainerSection = field(default_factory=ForestTrainerSection)

    @classmethod
    def of(cls, **flat: Any) -> ForestTrainConfig:
        """The config of flat keys (each section's keys and ``seed``), without range checks;
        ``trainer.repartition`` may be a mapping (its defaults are filled in).

        Raises:
            TypeError: a key of no section.
        """
        parts: dict[str, dict[str, Any]] = {name: {} for name in FOREST_SECTIONS}
        for key, value in flat.items():
            sec = _SECTION_OF.get(key)
            if sec is None and key != "seed":
                raise TypeError(f"ForestTrainConfig: unknown key {key!r}")
            if key == "hidden" and value is not None:
                value = tuple(value)
            elif key == "repartition" and isinstance(value, Mapping):
                value = Repartition(**repartition_settings(value))
            if sec is not None:
                parts[sec][key] = value
        return cls(
            seed=flat.get("seed", 0),
            model=ForestModelSection(**parts["model"]),
            data=ForestDataSection(**parts["data"]),
            trainer=ForestTrainerSection(**parts["trainer"]),
        )

    @classmethod
    def from_dict(
        cls, cfg: Mapping[str, Any], *, where: str = "forest config"
    ) -> ForestTrainConfig:
        """Validate a flat config mapping (each section's keys and ``seed``).

        Raises:
            ValueError: unknown keys (listed with the allowed ones) or out-of-range values.
        """
        known = {*_SECTION_OF, "seed"}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        raw = dict(cfg)
        rp = raw.get("repartition")
        if rp is not None:
            if raw.get("untrained"):
                raise ValueError(
                    f"{where}: trainer.repartition: an untrained twin is not re-partitioned "
                    "(use init: twin)"
                )
            raw["repartition"] = Repartition(
                **repartition_settings(rp, f"{where}: trainer.repartition")
            )
        out = cls.of(**raw)
        out.check(where)
        return out

    def flat(self) -> dict[str, Any]:
        """Every key of every section and ``seed``, as plain JSON types (``hidden`` a list,
        ``repartition`` None or its filled-in mapping)."""
        out: dict[str, Any] = {"seed": self.seed}
        for name in FOREST_SECTIONS:
            out.update(asdict(getattr(self, name)))
        out["hidden"] = list(out["hidden"])
        return out

    def replace(self, **flat: Any) -> ForestTrainConfig:
        """A copy with some flat keys changed (no range checks, as :meth:`of`)."""
        return ForestTrainConfig.of(**{**self.flat(), **flat})

    def check(self, where: str = "forest config") -> None:
        """Range checks across the sections.

        Raises:
            ValueError: ``"<where>: <key> must be ..."``.
        """

        def bad(msg: str) -> None:
            raise ValueError(f"{where}: {msg}")

        m, d, t = self.model, self.data, self.trainer
        if m.n_models < 1 or m.n_classes < 2:
            bad("n_models must be >= 1 and n_classes >= 2")
        if t.group_size < 1:
            bad("group_size must be >= 1")
        for name in ("bag_queries", "bag_passages"):
            v = getattr(d, name)
            if not 0.0 < v <= 1.0:
                bad(f"{name} must be in (0, 1] (got {v})")
        if t.uniformity not in UNIFORMITY_KINDS:
            bad(f"uniformity must be one of {UNIFORMITY_KINDS} (got {t.uniformity!r})")
        if t.joint_mode not in JOINT_MODES:
            bad(f"joint_mode must be one of {JOINT_MODES} (got {t.joint_mode!r})")
        if not 0.0 <= t.dropout < 1.0:
            bad(f"dropout must be in [0, 1) (got {t.dropout})")
        if t.nr_weight < 0 or t.nr_penalty < 0:
            bad("nr_weight and nr_penalty must be >= 0")
        if t.chunk_size < 1:
            bad("chunk_size must be >= 1")
        if d.random_pool < 1:
            bad("random_pool must be >= 1")
        for sec, name in (
            (t, "steps_query"),
            (t, "steps_passage"),
            (t, "steps_joint"),
            (d, "random_negatives"),
        ):
            if getattr(sec, name) < 0:
                bad(f"{name} must be >= 0")
        if d.hard_negatives < 0:
            bad("hard_negatives must be >= 0")
        if m.twin not in TWINS:
            bad(f"twin must be one of {TWINS} (got {m.twin!r})")
        if t.init not in INITS:
            bad(f"init must be one of {INITS} (got {t.init!r})")
        if m.twin == "sign" and (m.untrained or t.init == "twin"):
            bits = m.n_classes.bit_length() - 1
            if 2**bits != m.n_classes or m.hidden:
                bad(
                    f"twin: sign needs a linear forest with n_classes a power of two "
                    f"(got {m.n_classes})"
                )
        if (m.untrained or t.init == "twin") and m.twin != "random" and m.hidden:
            bad(f"twin: {m.twin} twins are linear (hidden must be [])")
        try:
            self.search()
        except ValueError as exc:
            bad(str(exc))
        if t.repartition is not None and m.untrained:
            bad("trainer.repartition: an untrained twin is not re-partitioned (use init: twin)")
        if d.sources is not None:
            from treerank.training.data import parse_sources

            parse_sources(d.sources, where=f"{where}: data.sources")

    def search(self) -> ForestSearch:
        """The search settings of the trained forest (model section)."""
        return self.model.search()

    def forest_config(self, dim: int) -> ForestConfig:
        """The model's shape (model section) for ``dim``-wide vectors."""
        return self.model.forest_config(dim)


_SECTION_OF: dict[str, str] = {k: sec for sec, keys in FOREST_SECTIONS.items() for k in keys}


def repartition_settings(cfg: Any, where: str = "trainer.repartition") -> dict[str, Any]:
    """The checked ``trainer.repartition`` mapping with its defaults filled in (the keys of
    :class:`Repartition`).

    Raises:
        ValueError: not a mapping, an unknown key, ``rounds < 1``, ``steps < 0`` or ``lr <= 0``
            (the message names ``where`` and the key).
    """
    if isinstance(cfg, Repartition):
        cfg = asdict(cfg)
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


def forest_train_config(cfg: TrainConfig, where: str = "config") -> ForestTrainConfig:
    """The typed :class:`ForestTrainConfig` of a parsed sectioned config (range-checked)."""
    flat = {**cfg.model, **(cfg.data or {}), **(cfg.trainer or {}), "seed": cfg.seed}
    return ForestTrainConfig.from_dict(flat, where=where)


def forest_resolved_defaults(cfg: TrainConfig, where: str = "config") -> dict[str, Any]:
    """Every key of a parsed config, defaults filled in (the family's ``resolved`` config, part
    of the train-stage key), flat as the YAML sections' keys; ``repartition`` only when set (its
    defaults filled in): a forest without it keeps the resolved config, and so the stage key,
    it had before the option existed."""
    out = forest_train_config(cfg, where).flat()
    if out["repartition"] is None:
        del out["repartition"]
    return out


def parse_forest_config(
    cfg: Mapping[str, Any] | TrainConfig | None, where: str = "config"
) -> TrainConfig:
    """The ``forest`` family's config: ``seed`` + ``model / data / trainer / validation``
    sections holding the keys of :data:`FOREST_SECTIONS` (typed by :data:`FOREST_SECTION_TYPES`).

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
    for name, record in FOREST_SECTION_TYPES.items():  # key-list sections: typed by the records
        check_types(getattr(out, name) or {}, record, f"{where}.{name}")
    try:
        forest_train_config(out, where)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    return out
