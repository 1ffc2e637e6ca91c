"""`Run`: the ranked passages a system returned for every query of a split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treerank.kernels.vectors import I64, Scores
from treerank.storelike import StoreLike


def store_key(store: StoreLike) -> str:
    """What a system memoises its last run (or index) under for ``store``.

    A view (``treerank.search.query.QueryView``, ``treerank.store.view.QuerySubset``) carries
    its own unique ``memo_key``: views are short-lived, and a reused ``id()`` must never return
    another view's memoised run. Pass ``getattr(store, "base", store)`` for what depends only on
    the passages (an index), which a view shares with its store.
    """
    key = getattr(store, "memo_key", None)
    return str(key) if key else f"{getattr(store, 'path', '')}#{id(store)}"


@dataclass
class Run:
    """Top-k passages per query, best first.

    Attributes:
        name: system name (used for file names and table rows).
        ids: ``int64 (n_queries, k)`` passage ids (store row numbers), best first; ``-1`` pads rows
            that have fewer than ``k`` results (always at the end of a row).
        scores: ``float32 (n_queries, k)`` the system's scores, non-increasing along each row;
            ``-inf`` on padding. Rows are ordered by score, ties by ascending passage id.
    """

    name: str
    ids: I64
    scores: Scores  # float32 once __post_init__ has run

    def __post_init__(self) -> None:
        self.ids = np.ascontiguousarray(self.ids, dtype=np.int64)
        self.scores = np.ascontiguousarray(self.scores, dtype=np.float32)
        if self.ids.ndim != 2 or self.ids.shape != self.scores.shape:
            raise ValueError(
                f"run {self.name!r}: ids {self.ids.shape} and scores {self.scores.shape} must be "
                "equal-shaped (n_queries, k) arrays"
            )

    @property
    def n_queries(self) -> int:
        return int(self.ids.shape[0])

    @property
    def k(self) -> int:
        """Depth of the run (columns)."""
        return int(self.ids.shape[1])

    def truncate(self, k: int) -> Run:
        """The same run cut to its first ``k`` columns."""
        return Run(self.name, self.ids[:, :k], self.scores[:, :k])
