"""Named model types: one table that feeds loading, ``--help`` and config validation.

Each entry maps a model type to ``"module:Class"``; the class provides
``from_checkpoint(ckpt: Checkpoint) -> model`` and ``to_checkpoint(...) -> Checkpoint``.
Modules are imported lazily so that listing names costs nothing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from treerank.models.checkpoint import load_checkpoint

MODEL_TYPES: dict[str, str] = {
    "cosine": "treerank.models.cosine:CosineScorer",
    "linear": "treerank.models.linear:LinearHead",
    "mlp": "treerank.models.mlp:MLPHead",
    "drt": "treerank.models.drt:DRTHead",
    "forest": "treerank.models.forest:Forest",
}


def model_class(model_type: str) -> Any:
    """The class registered for ``model_type``.

    Raises:
        KeyError: unknown model type (the message lists the known ones).
    """
    try:
        target = MODEL_TYPES[model_type]
    except KeyError:
        raise KeyError(
            f"unknown model type {model_type!r}; known: {', '.join(MODEL_TYPES)}"
        ) from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def load_model(path: str | Path, expected_fingerprint: str | None = None) -> Any:
    """Load any checkpoint directory into its model object (type read from ``config.json``).

    Raises:
        FileNotFoundError, ValueError, EncoderMismatchError: see :func:`load_checkpoint`.
    """
    ckpt = load_checkpoint(path, expected_fingerprint)
    return model_class(ckpt.model_type).from_checkpoint(ckpt)
