"""Loading a checkpoint into its model object, by the checkpoint's ``model_type``.

The checkpoint's ``model_type`` is a family name (``treerank.families``). Which class a name
stands for is decided in one place, the family table (``treerank.families``, a layer above this
one: ``treerank.families.model_class``); a function of this layer that loads a checkpoint takes
that decision as an argument (``classes``, a :data:`ModelClassOf`), injected by its caller.

The default, :func:`model_class`, knows only the families whose model classes live in this layer
(:data:`MODEL_CLASSES`: cosine, linear, mlp, drt), so that a lower layer loading a dense head
needs nothing from above; any other ``model_type`` (the forest, a plugin family) is refused with
an :class:`UnknownModelClassError` naming the class and the checkpoint. Nothing registers into
this table at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from treerank.models.checkpoint import load_checkpoint

__all__ = [
    "MODEL_CLASSES",
    "ModelClassOf",
    "UnknownModelClassError",
    "load_model",
    "model_class",
]


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
"""The families whose model classes live in this layer: name -> function importing the class
(so that no model module is imported before it is needed). Fixed: a family above this layer is
loaded through the family table's ``model_class``, passed in as ``classes``."""

ModelClassOf = Callable[[str], type]
"""``classes(model_type) -> model class``; raises ``KeyError`` for a name it does not know.
The family table's ``treerank.families.model_class`` knows every family; :func:`model_class`
only this layer's."""


class UnknownModelClassError(KeyError, ValueError):
    """A checkpoint whose ``model_type`` the given class lookup does not know (a ``KeyError``
    and a ``ValueError``, so that every command's bad-input handler reports it)."""

    def __init__(self, model_type: str, path: str | Path | None, detail: str) -> None:
        self.model_type = model_type
        self.detail = detail
        self.path = None if path is None else Path(path)
        where = f"{self.path}: " if self.path is not None else ""
        self.message = f"{where}checkpoint of unknown model class {model_type!r} ({detail})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def model_class(model_type: str) -> type:
    """The model class of ``model_type`` among this layer's families (:data:`MODEL_CLASSES`).

    Raises:
        UnknownModelClassError: any other name; the message lists the known ones and says that
            a family above this layer (the forest) loads through ``treerank.families``.
    """
    if model_type not in MODEL_CLASSES:
        raise UnknownModelClassError(
            model_type,
            None,
            f"the models layer knows {', '.join(MODEL_CLASSES)}; a family above it, such as "
            "the forest with its own retrieval, loads through the family table: pass "
            "treerank.families.model_class as classes, or build with treerank.families."
            "CHECKPOINTS",
        )
    return MODEL_CLASSES[model_type]()


def load_model(
    path: str | Path,
    expected_fingerprint: str | None = None,
    expected_precision: str | None = None,
    *,
    classes: ModelClassOf = model_class,
) -> Any:
    """Load any checkpoint directory into its model object (family read from ``config.json``).

    Args:
        path: the checkpoint directory (``config.json`` + ``weights.safetensors``).
        expected_fingerprint / expected_precision: the scored store's encoder fingerprint and
            vector precision (see :func:`load_checkpoint`; ``None`` skips a check).
        classes: ``model_type -> class`` (default :func:`model_class`: this layer's families
            only; ``treerank.families.model_class``: every registered family).

    Raises:
        FileNotFoundError, ValueError, EncoderMismatchError, PrecisionMixError: see
            :func:`load_checkpoint`.
        UnknownModelClassError: ``classes`` does not know the checkpoint's family (the message
            names the class and ``path``).
    """
    ckpt = load_checkpoint(path, expected_fingerprint, expected_precision)
    try:
        cls: Any = classes(ckpt.model_type)  # a CheckpointMixin subclass
    except UnknownModelClassError as exc:
        raise UnknownModelClassError(ckpt.model_type, path, exc.detail) from None
    except KeyError as exc:
        detail = str(exc.args[0]) if exc.args else "unknown"
        raise UnknownModelClassError(ckpt.model_type, path, detail) from None
    return cls.from_checkpoint(ckpt)
