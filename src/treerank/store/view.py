"""`QuerySubset`: a store split seen through a subset of its queries (all passages kept)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["QuerySubset"]


class QuerySubset:
    """The queries ``rows`` of ``store`` with every passage of the split.

    Row ``i`` of the view is query ``rows[i]`` of the store; passages (vectors, texts, ids) are
    the store's own, so a run on the view has the same passage ids as a run on the store and
    the evaluation contract (all passages of the split) holds. Any attribute not overridden here
    is the store's.

    Args:
        store: an ``EmbeddingStore`` (or anything with the same attributes).
        rows: ``int (n,)`` query ids of the store, each in ``[0, n_queries)``.

    Raises:
        ValueError: ``rows`` not 1-D or out of range.
    """

    def __init__(self, store: Any, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        nq = int(store.n_queries)
        if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= nq)):
            raise ValueError(f"{getattr(store, 'path', 'store')}: query rows out of [0, {nq})")
        self._store = store
        self.rows = rows
        self.queries = np.asarray(store.queries[rows], dtype=np.float32)
        self.candidates = np.asarray(store.candidates[rows])
        self.labels = np.asarray(store.labels[rows])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @property
    def n_queries(self) -> int:
        return int(self.rows.size)

    def query_texts(self) -> list[str]:
        texts = self._store.query_texts()
        return [texts[i] for i in self.rows]

    def query_ids(self) -> list[str]:
        ids = self._store.query_ids()
        return [ids[i] for i in self.rows]

    def __repr__(self) -> str:
        return f"QuerySubset({self._store!r}, {self.rows.size} queries)"
