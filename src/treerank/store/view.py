"""`QuerySubset`: a store split seen through a subset of its queries (all passages kept)."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from treerank.storelike import StoreLike

__all__ = ["QuerySubset"]


class QuerySubset:
    """The queries ``rows`` of ``store`` with every passage of the split.

    Row ``i`` of the view is query ``rows[i]`` of the store; passages (vectors, texts, ids) are
    the store's own, so a run on the view has the same passage ids as a run on the store and
    the evaluation contract (all passages of the split) holds. Any attribute not overridden here
    is the store's, ``path`` included (messages and on-disk caches such as FAISS indexes name the
    real split).

    Judgments: ``treerank.metrics.qrels.Qrels.from_store(view)`` reads the split's source
    qrels (``qrels.tsv``) when there are some and keeps only the judgments of the view's
    ``query_ids()``, or else the view's own ``candidates`` / ``labels`` rows; either way each
    row's judgments are its query's, and metrics on the view equal trec_eval on those queries.

    ``base`` is the store (systems share a per-store index through it, as for
    ``treerank.search.query.QueryView``) and ``memo_key`` is unique per view, so a system that
    memoises its last run per store never hands one view's run to another view of the same
    store.

    Args:
        store: an ``EmbeddingStore`` (or anything with the same attributes: ``queries``,
            ``candidates``, ``labels``, ``n_queries``).
        rows: ``int (n,)`` query ids of the store, each in ``[0, n_queries)``, in view order.

    Raises:
        ValueError: ``rows`` not 1-D or out of range.
    """

    def __init__(self, store: StoreLike, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        nq = int(store.n_queries)
        if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= nq)):
            raise ValueError(f"{store.path}: query rows out of [0, {nq})")
        self.base = store
        self.rows = rows
        self.memo_key = f"query-subset:{uuid.uuid4().hex}"
        self.queries = np.asarray(store.queries[rows], dtype=np.float32)
        self.candidates = np.asarray(store.candidates[rows])
        self.labels = np.asarray(store.labels[rows])

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (during unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def n_queries(self) -> int:
        return int(self.rows.size)

    def query_texts(self) -> list[str]:
        texts = self.base.query_texts()
        return [texts[i] for i in self.rows]

    def query_ids(self) -> list[str]:
        ids = self.base.query_ids()
        return [ids[i] for i in self.rows]

    def __repr__(self) -> str:
        return f"QuerySubset({self.base!r}, {self.rows.size} queries)"
