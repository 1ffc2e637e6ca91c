"""A tiny on-disk store in the real format (for tests that need `EmbeddingStore.open`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from treerank.store import EmbeddingStore

QUERIES = ["cats purr softly", "dogs bark loudly", "fish swim", "birds sing at dawn"]
PASSAGES = [
    "the dog barked loudly at night",
    "a cat purrs when it is content",
    "fish swim in the river",
    "birds sing songs at dawn",
    "stock markets fell today",
    "cats and dogs are pets",
    "the river was cold",
    "loud music at the party",
]
# query i -> relevant passages (grade), -1 padding
CANDIDATES = np.array([[1, 5], [0, -1], [2, -1], [3, -1]], np.int32)
LABELS = np.array([[2, 1], [1, 0], [1, 0], [1, 0]], np.uint8)


def write_tiny_store(
    root: Path, dim: int = 16, seed: int = 0, threshold: int = 1
) -> EmbeddingStore:
    """Queries sit near their first relevant passage, so cosine ranks them well."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((len(PASSAGES), dim)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    q = p[CANDIDATES[:, 0]] + 0.3 * rng.standard_normal((len(QUERIES), dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    root.mkdir(parents=True, exist_ok=True)
    q.astype("<f4").tofile(root / "queries.bin")
    p.astype("<f4").tofile(root / "passages.bin")
    CANDIDATES.astype("<i4").tofile(root / "query_indices.bin")
    LABELS.tofile(root / "query_is_selected.bin")
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(QUERIES))
    )
    (root / "passages.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(PASSAGES))
    )
    meta = {
        "format": "treerank-store",
        "version": 1,
        "complete": True,
        "dim": dim,
        "k": 2,
        "n_queries": len(QUERIES),
        "n_passages": len(PASSAGES),
        "normalized": True,
        "split": "test",
        "relevance_threshold": threshold,
        "encoder": {"name": "fake", "fingerprint": "sha256:fake"},
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return EmbeddingStore.open(root)
