"""`Qrels`: graded relevance judgments of every query of a split, as arrays.

Relevance comes from the store's candidate lists: ``candidates[i, j]`` is a passage id judged for
query ``i`` and ``labels[i, j]`` its grade (MS MARCO ``is_selected``; graded qrels for TREC DL;
``-1`` pads). A grade ``>= relevance_threshold`` counts as relevant for MRR@k, Recall@k and
Success@k; nDCG@k uses the grades themselves.

**Pools.** A store only holds the passages of its split. For a pooled corpus such as the TREC DL19
pool shipped here, judged passages that no pooled run retrieved are not in the store, so they are
not in the qrels either: Recall@k is then "the fraction of the *pooled* relevant passages
retrieved", and the nDCG ideal ranking is built from pooled judgments only. Scores are comparable
between systems run on the same pool, not with full-collection numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_SHIFT = 32  # key = query << 32 | passage id (passage ids < 2**32)


@dataclass
class Qrels:
    """Judgments of ``n_queries`` queries.

    Attributes:
        candidates: ``int32 (n_queries, K)`` judged passage ids, ``-1`` padding.
        labels: ``uint8 (n_queries, K)`` grades (0 = judged not relevant, and for padding).
        relevance_threshold: grade ``>=`` this is relevant for MRR / Recall / Success (1 by
            default; 2 for TREC DL).
    """

    candidates: np.ndarray
    labels: np.ndarray
    relevance_threshold: int = 1

    def __post_init__(self) -> None:
        self.candidates = np.asarray(self.candidates, dtype=np.int64)
        self.labels = np.asarray(self.labels)
        if self.candidates.ndim != 2 or self.candidates.shape != self.labels.shape:
            raise ValueError(
                f"qrels: candidates {self.candidates.shape} and labels {self.labels.shape} must "
                "be equal-shaped (n_queries, K) arrays"
            )
        if self.relevance_threshold < 1:
            raise ValueError(
                f"qrels: relevance_threshold must be >= 1, got {self.relevance_threshold}"
            )
        if self.candidates.size and self.candidates.max() >= 2**32:
            raise ValueError("qrels: passage ids must be < 2**32")
        self.labels = np.where(self.candidates < 0, 0, self.labels).astype(np.int64)
        self._index: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_store(cls, store: Any, relevance_threshold: int | None = None) -> Qrels:
        """Judgments of an :class:`~treerank.store.EmbeddingStore` split (its ``candidates`` and
        ``labels``); the threshold defaults to the store's ``relevance_threshold``."""
        thr = store.relevance_threshold if relevance_threshold is None else relevance_threshold
        return cls(np.asarray(store.candidates), np.asarray(store.labels), int(thr))

    @classmethod
    def from_dict(
        cls,
        judgments: dict[str, dict[str, int]],
        query_ids: list[str],
        passage_index: dict[str, int],
        relevance_threshold: int = 1,
    ) -> Qrels:
        """Build from TREC-style ``{query_id: {passage_id: grade}}``.

        Args:
            judgments: grades by source ids (e.g. from ``trec_io.read_qrels``).
            query_ids: source query id of each row, in row order.
            passage_index: source passage id -> passage id (row); judged passages absent from it
                are dropped (they are not in the corpus), negative grades become 0.
            relevance_threshold: see the class.
        """
        rows = [
            [
                (passage_index[p], max(int(g), 0))
                for p, g in judgments.get(q, {}).items()
                if p in passage_index
            ]
            for q in query_ids
        ]
        width = max((len(r) for r in rows), default=0)
        cand = np.full((len(query_ids), max(width, 1)), -1, np.int64)
        lab = np.zeros_like(cand)
        for i, r in enumerate(rows):
            for j, (pid, g) in enumerate(r):
                cand[i, j], lab[i, j] = pid, g
        return cls(cand, lab, relevance_threshold)

    @property
    def n_queries(self) -> int:
        return int(self.candidates.shape[0])

    def n_relevant(self, threshold: int | None = None) -> np.ndarray:
        """``int64 (n_queries,)`` distinct passages with grade ``>= threshold`` per query."""
        thr = self.relevance_threshold if threshold is None else threshold
        keys, grades = self.index()
        return np.bincount(keys[grades >= thr] >> _SHIFT, minlength=self.n_queries).astype(np.int64)

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted ``query << 32 | passage`` keys of the judged passages with grade > 0, and their
        grades (the highest one when a passage is judged twice for a query)."""
        if self._index is None:
            qi = np.broadcast_to(
                np.arange(self.n_queries, dtype=np.int64)[:, None], self.candidates.shape
            )
            m = (self.candidates >= 0) & (self.labels > 0)
            keys = (qi[m] << _SHIFT) | self.candidates[m]
            grades = self.labels[m]
            order = np.lexsort((-grades, keys))
            keys, grades = keys[order], grades[order]
            first = np.ones(keys.size, bool)
            first[1:] = keys[1:] != keys[:-1]
            self._index = (keys[first], grades[first])
        return self._index

    def grades_of(self, ids: np.ndarray, row_offset: int = 0) -> np.ndarray:
        """Grade of each retrieved passage.

        Args:
            ids: ``int64 (n, k)`` passage ids per query, ``-1`` padding; row ``i`` is query
                ``row_offset + i`` (so a long run can be graded block by block).
            row_offset: first query row of ``ids``.

        Returns:
            ``int16 (n, k)`` grades (0 for unjudged passages and padding).

        Raises:
            ValueError: the rows run past the qrels' queries.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or row_offset < 0 or row_offset + ids.shape[0] > self.n_queries:
            raise ValueError(
                f"run rows {row_offset}..{row_offset + ids.shape[0]} (shape {ids.shape}) do not "
                f"fit the qrels' {self.n_queries} queries"
            )
        keys, grades = self.index()
        out = np.zeros(ids.shape, np.int16)
        if keys.size == 0:
            return out
        rows = np.arange(row_offset, row_offset + ids.shape[0], dtype=np.int64)[:, None]
        qk = (rows << _SHIFT) | np.maximum(ids, 0)
        pos = np.minimum(np.searchsorted(keys, qk), keys.size - 1)
        hit = (ids >= 0) & (keys[pos] == qk)
        out[hit] = grades[pos[hit]]
        return out

    def ideal_grades(self, depth: int) -> np.ndarray:
        """``int64 (n_queries, depth)`` each query's distinct judged grades, descending, 0-padded
        (the ideal ranking of nDCG)."""
        keys, grades = self.index()
        q = keys >> _SHIFT
        out = np.zeros((self.n_queries, depth), np.int64)
        if grades.size:
            order = np.lexsort((-grades, q))
            q, g = q[order], grades[order]
            starts = np.searchsorted(q, np.arange(self.n_queries))
            rank = np.arange(q.size) - starts[q]
            keep = rank < depth
            out[q[keep], rank[keep]] = g[keep]
        return out
