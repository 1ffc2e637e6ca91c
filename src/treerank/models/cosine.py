"""`CosineScorer`: the zero-training baseline, cosine similarity of the frozen embeddings.

Both towers L2-normalise their input, so the inner product of the two outputs is the cosine of
the stored vectors. Stores written with normalised vectors (``meta["normalized"]``) rank the same
with or without it; normalising again makes the baseline correct for stores that were not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from treerank.kernels.vectors import l2_normalize
from treerank.models.checkpoint import CheckpointMixin

__all__ = ["CosineScorer", "l2_normalize"]


class CosineScorer(CheckpointMixin):
    """Cosine of the stored query and passage vectors (a ``DenseScorer``).

    Score = ``<q/|q|, p/|p|>``, a cosine in ``[-1, 1]``. No parameters; the checkpoint holds only
    the encoder provenance and the dimension.
    """

    model_type = "cosine"
    trained = False

    def __init__(self, dim: int | None = None, name: str = "cosine") -> None:
        self.dim = dim
        self.name = name
        self.extra: dict[str, Any] = {}

    def _check(self, x: np.ndarray) -> None:
        if self.dim is not None and x.shape[-1] != self.dim:
            raise ValueError(f"{self.name}: expected {self.dim}-dim vectors, got shape {x.shape}")

    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored query vectors -> ``float32 (n, d)`` unit vectors."""
        self._check(x)
        return l2_normalize(x)

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored passage vectors -> ``float32 (n, d)`` unit vectors."""
        self._check(x)
        return l2_normalize(x)

    def checkpoint_config(self) -> dict[str, Any]:
        return {"dim": self.dim, "name": self.name}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {"_empty": torch.zeros(0)}

    @classmethod
    def from_checkpoint_parts(
        cls, config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> CosineScorer:
        return cls(dim=config.get("dim") or None, name=str(config.get("name", "cosine")))
