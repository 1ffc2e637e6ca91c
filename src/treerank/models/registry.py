"""Loading any checkpoint into its model object, by the checkpoint's ``model_type``.

The checkpoint's ``model_type`` is a family name (``treerank.families``); :data:`MODEL_CLASSES`
maps it to a function that imports and returns the model class, whose
``CheckpointMixin.from_checkpoint`` rebuilds it. The built-in families' classes are listed here
(one function per family, so that no model module is imported before it is needed);
``treerank.families.register_family`` adds a new family's class.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from treerank.models.checkpoint import load_checkpoint
from treerank.names import unknown_name

__all__ = ["MODEL_CLASSES", "load_model", "model_class", "register_model_class"]


def _cosine() -> type:
    from treerank.models.cosine import CosineScorer

    return CosineScorer


def _linear() -> type:
    from treerank.models.linear import LinearHead

    return LinearHead


def _mlp() -> type:
    from treerank.models.mlp import MLPHead

    return MLPHead


def _drt() -> type:
    from treerank.models.drt import DRTHead

    return DRTHead


MODEL_CLASSES: dict[str, Callable[[], type]] = {
    "cosine": _cosine,
    "linear": _linear,
    "mlp": _mlp,
    "drt": _drt,
}
"""Family name (a checkpoint's ``model_type``) -> function returning its model class. A family
in a layer above this one (the forest, ``treerank.forest``) is added by the family table
(``treerank.families``) when it loads."""


def register_model_class(
    model_type: str, load: Callable[[], type], *, replace: bool = False
) -> None:
    """Add (or with ``replace``, replace) the model class of a family.

    Raises:
        ValueError: ``model_type`` is taken and ``replace`` is false.
    """
    if model_type in MODEL_CLASSES and not replace:
        raise ValueError(f"model type {model_type!r} is already registered")
    MODEL_CLASSES[model_type] = load


def model_class(model_type: str) -> Any:
    """The model class of family ``model_type``.

    Raises:
        KeyError: unknown family (the message lists the known ones).
    """
    if model_type not in MODEL_CLASSES:
        raise KeyError(
            unknown_name("model family", model_type, MODEL_CLASSES)
            + " (a family above the models layer, such as the forest, is registered when "
            "treerank.families is imported)"
        )
    return MODEL_CLASSES[model_type]()


def load_model(
    path: str | Path,
    expected_fingerprint: str | None = None,
    expected_precision: str | None = None,
) -> Any:
    """Load any checkpoint directory into its model object (family read from ``config.json``).

    ``expected_fingerprint`` / ``expected_precision``: the scored store's encoder fingerprint
    and vector precision (see :func:`load_checkpoint`; ``None`` skips a check).

    Raises:
        FileNotFoundError, ValueError, EncoderMismatchError, PrecisionMixError: see
            :func:`load_checkpoint`.
        KeyError: the checkpoint's family is not registered.
    """
    ckpt = load_checkpoint(path, expected_fingerprint, expected_precision)
    return model_class(ckpt.model_type).from_checkpoint(ckpt)
