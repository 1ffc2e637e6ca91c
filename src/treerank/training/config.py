"""The one shape of every trainable family's config, parsed by one strict function.

::

    seed: 0
    model:      the model's constructor arguments (``dim`` comes from the store)
    data:       which training pairs and negatives (the contrastive families' SamplerConfig)
    trainer:    optimiser, schedule, logging, early stopping
    validation: held-out queries and how they are scored (ValidationConfig, same for all)

A family says which keys each section allows (a dataclass, a constructor, or a list of names);
:func:`parse_train_config` rejects any other key with the file, the key path and the allowed
keys (``treerank.config.check_keys``). ``configs/heads/linear.yaml`` lists every key of the
linear family with its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treerank.config import ConfigError, allowed_keys, build, check_keys, check_types, section
from treerank.training.holdout import ValidationConfig

__all__ = ["SECTIONS", "TrainConfig", "parse_train_config"]

SECTIONS = ("model", "data", "trainer", "validation")


@dataclass
class TrainConfig:
    """A parsed training config.

    Attributes:
        seed: seeds the model's initialisation, the sampler and the held-out split.
        model: constructor arguments of the model (``dict``; checked against its allowed keys).
        data: the family's data section (a dataclass instance, or a dict for key-list families).
        trainer: the family's trainer section (likewise).
        validation: the held-out validation section.
    """

    seed: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    data: Any = None
    trainer: Any = None
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON types, in the shape :func:`parse_train_config` reads."""
        return {
            "seed": self.seed,
            "model": dict(self.model),
            "data": _plain(self.data),
            "trainer": _plain(self.trainer),
            "validation": _plain(self.validation),
        }


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        to_dict = getattr(x, "to_dict", None)
        d = to_dict() if callable(to_dict) else dataclasses.asdict(x)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
    return dict(x or {})


def _part(target: Any, doc: dict[str, Any], where: str, **defaults: Any) -> Any:
    if dataclasses.is_dataclass(target) and isinstance(target, type):
        names = allowed_keys(target)
        check_keys(doc, names, where)
        return build(target, {**{k: v for k, v in defaults.items() if k in names}, **doc}, where)
    return check_keys(doc, allowed_keys(target), where)


def parse_train_config(
    cfg: Mapping[str, Any] | TrainConfig | None,
    *,
    model: Any,
    data: Any,
    trainer: Any,
    where: str = "config",
    model_exclude: tuple[str, ...] = ("dim",),
) -> TrainConfig:
    """Parse a training config strictly.

    Args:
        cfg: the mapping (``None``: every default); an already parsed :class:`TrainConfig` is
            returned as it is, so a trainer may call its parser on whatever it is given.
        model: what the ``model`` section may hold (a class, dataclass or list of key names);
            keys in ``model_exclude`` are never allowed (``dim`` is taken from the store).
        data, trainer: a dataclass (built, with a ``seed`` field defaulting to the top-level
            seed) or a list of key names (kept as a dict).
        where: ``"<file>"`` or ``"<file>: models.<name>"``: prefix of every message.

    Raises:
        ConfigError: unknown section or key (naming the key path and the allowed keys), or a
            value a section rejects; ``validation.fraction`` outside ``[0, 1)``.
    """
    if isinstance(cfg, TrainConfig):
        return cfg
    doc = check_keys(cfg, ("seed", *SECTIONS), where)
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}.seed: must be an integer, got {seed!r}")
    model_doc = check_keys(
        section(doc, "model", where), allowed_keys(model), f"{where}.model", exclude=model_exclude
    )
    check_types(model_doc, model, f"{where}.model")
    out = TrainConfig(
        seed=seed,
        model=model_doc,
        data=_part(data, section(doc, "data", where), f"{where}.data"),
        trainer=_part(trainer, section(doc, "trainer", where), f"{where}.trainer", seed=seed),
        validation=build(
            ValidationConfig, section(doc, "validation", where), f"{where}.validation"
        ),
    )
    early = getattr(out.trainer, "early_stopping_metric", None)
    if early is not None and out.validation.fraction > 0 and early not in out.validation.metrics:
        raise ConfigError(
            f"{where}.trainer.early_stopping_metric: {early!r} is not in validation.metrics "
            f"{out.validation.metrics}"
        )
    return out
