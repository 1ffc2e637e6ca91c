"""A small in-memory stand-in for ``EmbeddingStore`` (the attributes the trainer reads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest


@dataclass
class ToyStore:
    queries: np.ndarray
    passages: np.ndarray
    candidates: np.ndarray
    labels: np.ndarray
    relevance_threshold: int = 1
    encoder_name: str = "toy-encoder"
    encoder_fingerprint: str = "toy-fingerprint"
    path: Path = Path("toy-store")
    has_texts: bool = False
    split: str = "train"
    meta: dict[str, object] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.queries.shape[1])

    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    @property
    def n_passages(self) -> int:
        return int(self.passages.shape[0])

    def query_ids(self) -> list[str]:
        """Row numbers as source ids (what a checkpoint's training provenance records)."""
        return [str(i) for i in range(self.n_queries)]

    def has_array(self, name: str) -> bool:
        return name in self.arrays

    def load_array(self, name: str) -> np.ndarray | None:
        return self.arrays.get(name)

    def save_array(self, name: str, arr: np.ndarray, meta: dict | None = None) -> None:
        self.arrays[name] = np.asarray(arr)


def make_toy_store(
    n_queries: int = 96, n_passages: int = 400, dim: int = 16, seed: int = 0, noise: float = 0.8
) -> ToyStore:
    """Queries are noisy copies of a rotated version of their gold passage: a linear head can
    undo the rotation, raw cosine cannot fully, so training has something to learn."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n_passages, dim)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    rot, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    gold = rng.choice(n_passages, size=n_queries, replace=False)
    q = (p[gold] @ rot.T.astype(np.float32) * 0.7 + p[gold] * 0.3) + noise * rng.standard_normal(
        (n_queries, dim)
    ).astype(np.float32) / np.sqrt(dim)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    candidates = np.full((n_queries, 2), -1, dtype=np.int32)
    labels = np.zeros((n_queries, 2), dtype=np.uint8)
    candidates[:, 0] = gold
    labels[:, 0] = 1
    return ToyStore(q, p, candidates, labels)


@pytest.fixture
def toy_store() -> ToyStore:
    return make_toy_store()
