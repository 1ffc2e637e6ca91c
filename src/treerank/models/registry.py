"""Loading any checkpoint into its model object, through the family table.

The checkpoint's ``model_type`` is a family name of :data:`treerank.families.FAMILIES`,
whose model class rebuilds it (``CheckpointMixin.from_checkpoint``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treerank.families import family
from treerank.models.checkpoint import load_checkpoint


def model_class(model_type: str) -> Any:
    """The model class of family ``model_type``.

    Raises:
        KeyError: unknown family (the message lists the known ones).
    """
    return family(model_type).model_class()


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
