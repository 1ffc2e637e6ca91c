"""What a model is to the rest of treerank.

Every dense model (cosine, linear, mlp, drt) maps stored vectors to a query representation and a
passage representation whose **inner product is the model's ranking score** (any temperature is a
monotone rescaling and is left out of search). Search and evaluation therefore need only
``encode_queries`` / ``encode_passages``; the forest, whose score is a match count, has its own
search (``treerank.forest.index``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class DenseScorer(Protocol):
    """A model whose score is ``encode_queries(Q) @ encode_passages(P).T``."""

    name: str

    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored query vectors -> ``float32 (n, d')`` search vectors."""
        ...

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored passage vectors -> ``float32 (n, d')`` search vectors."""
        ...


@runtime_checkable
class SlotScorer(Protocol):
    """A dense model whose score decomposes over ``k`` slots (DRT): the diagnostics' scoring
    variants and per-slot probes apply to it. ``config`` has ``k`` and ``slot_dim``."""

    config: Any

    def query_raw_slots(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` -> ``float32 (n, k, d_s)`` query slots before normalisation."""
        ...

    def passage_raw_slots(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` -> ``float32 (n, k, d_s)`` passage slots before normalisation."""
        ...

    def query_alpha(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` -> ``float32 (n, k)`` slot attention (rows sum to 1)."""
        ...
