"""Forest search: per-model inverted lists ``class -> passage ids`` and vectorised match counting.

A TreeRank forest (:class:`treerank.models.forest.Forest`) assigns every passage, under each of
its ``M`` models, one of ``C`` classes or "not retrievable". The index keeps, for each
``(model m, class c)``, the ascending list of passage ids with ``class_m(p) == c`` in one
CSR-style layout (bm25s / scipy style: plain arrays, mmap-able):

* ``offsets``: ``int64 (M * C + 1,)``; list ``l = m * C + c`` is ``ids[offsets[l]:offsets[l+1]]``
* ``ids``: ``int32 (nnz,)`` passage ids, ascending inside every list
* ``probs``: ``float32 (nnz,)`` the passage model's softmax probability of that class

Passages not retrievable for model ``m`` appear in none of ``m``'s lists.

Ranking (TreeRank seed): ``count(q, p) = #{m : class_m(q) == class_m(p)}``. Integer counts tie
massively, so the order is **lexicographic and deterministic**:

1. match count, highest first;
2. secondary score ``sum over matching models of P_m(class | q) * P_m(class | p)`` (the summed
   probability that both sides really fall in the matching class), highest first;
3. passage id, ascending.

The ``Run.scores`` written for a forest are ``count + secondary / (M + 1)`` (``secondary <=
count <= M``, so this is strictly monotone in the lexicographic order in exact arithmetic; the
float32 copy in the run may round, the ids carry the exact order). Passages with zero matching
models are **not retrieved** (the run is padded with ``-1``): a forest retrieves only what shares
at least one class with the query.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from treerank.models.forest import Forest
from treerank.search.run import Run

_BLOCK_BUDGET = 1 << 22
"""Elements per query block (posting entries and ``B * n_passages`` score cells)."""


def build_inverted_lists(
    classes: np.ndarray, probs: np.ndarray, n_classes: int, id_offset: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR inverted lists from a passage-class table.

    Args:
        classes: ``int (n, M)`` class of passage ``i`` under model ``m``; ``-1`` = not indexed.
        probs: ``float32 (n, M)`` probability of that class.
        n_classes: C.
        id_offset: passage id of row 0.

    Returns:
        ``(offsets int64 (M*C+1,), ids int32 (nnz,), probs float32 (nnz,))``; ids ascending
        inside each list.

    Raises:
        ValueError: shapes differ or a class is outside ``[-1, C)``.
    """
    classes = np.asarray(classes)
    probs = np.asarray(probs, dtype=np.float32)
    if classes.ndim != 2 or classes.shape != probs.shape:
        raise ValueError(f"forest index: classes {classes.shape} and probs {probs.shape} differ")
    n, m = classes.shape
    if classes.size and (classes.min() < -1 or classes.max() >= n_classes):
        raise ValueError(f"forest index: classes must lie in [-1, {n_classes})")
    valid = classes >= 0
    # Row-major nonzero: rows ascending, so a stable sort on the list key keeps ids ascending.
    rows, cols = np.nonzero(valid)
    keys = cols.astype(np.int64) * n_classes + classes[rows, cols]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    offsets = np.zeros(m * n_classes + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=m * n_classes), out=offsets[1:])
    ids = (rows[order] + id_offset).astype(np.int32)
    return offsets, ids, probs[rows, cols][order]


def posting_matrices(
    offsets: np.ndarray, ids: np.ndarray, list_probs: np.ndarray, n_passages: int
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The CSR index as two sparse ``(M*C, n_passages)`` matrices sharing its ``ids``.

    Returns:
        ``(ones float32, probs float64)``: entry ``(l, p)`` is 1 / ``P_m(c | p)`` when passage
        ``p`` is in list ``l = m * C + c``.
    """
    n_lists = len(offsets) - 1
    indptr = offsets.astype(np.int32) if offsets[-1] < 2**31 else offsets
    ones = sp.csr_matrix(
        (np.ones(ids.size, np.float32), ids, indptr), shape=(n_lists, n_passages), copy=False
    )
    probs = sp.csr_matrix(
        (np.asarray(list_probs, np.float64), ids, indptr), shape=(n_lists, n_passages), copy=False
    )
    return ones, probs


def match_scores(
    postings: tuple[sp.csr_matrix, sp.csr_matrix],
    query_classes: np.ndarray,
    query_probs: np.ndarray,
    n_classes: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Match counts and secondary scores of a block of queries against every passage.

    A query is a sparse one-hot row over the ``M * C`` lists (one list per model), so the
    accumulation over its ``M`` inverted lists is one sparse x sparse product (scipy's compiled
    CSR kernel): it touches exactly the ``~ M * n / C`` posting entries of the query's lists.

    Args:
        postings: from :func:`posting_matrices`.
        query_classes: ``int (B, M)`` query classes in ``[0, C)``.
        query_probs: ``float32 (B, M)`` their probabilities.
        n_classes: C.

    Returns:
        ``(counts int32 (B, n_passages), secondary float64 (B, n_passages))``; ``secondary =
        sum over matching models of P_m(c | q) * P_m(c | p)``.
    """
    b, m = query_classes.shape
    n_lists = postings[0].shape[0]
    cols = (np.arange(m, dtype=np.int64)[None, :] * n_classes + query_classes).ravel()
    indptr = np.arange(0, b * m + 1, m, dtype=np.int64)
    q_ones = sp.csr_matrix((np.ones(b * m, np.float32), cols, indptr), shape=(b, n_lists))
    q_probs = sp.csr_matrix(
        (np.asarray(query_probs, np.float64).ravel(), cols, indptr), shape=(b, n_lists)
    )
    counts = (q_ones @ postings[0]).toarray().astype(np.int32)
    secondary = (q_probs @ postings[1]).toarray()
    return counts, secondary


def topk_lexicographic(
    counts: np.ndarray, secondary: np.ndarray, k: int, n_models: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top ``k`` passages per row by (count desc, secondary desc, passage id asc).

    Args:
        counts: ``int (B, n)`` match counts.
        secondary: ``float64 (B, n)`` secondary scores, ``0 <= secondary <= counts``.
        k: depth.
        n_models: M (to fold the two keys into one exact float64 key).

    Returns:
        ``(ids int64 (B, k), counts int32 (B, k), secondary float64 (B, k))``; rows padded with
        ``-1`` / ``0`` / ``0.0`` past the passages with at least one match.
    """
    bsz, n = counts.shape
    out_ids = np.full((bsz, k), -1, dtype=np.int64)
    out_counts = np.zeros((bsz, k), dtype=np.int32)
    out_sec = np.zeros((bsz, k), dtype=np.float64)
    kk = min(k, n)
    if kk == 0 or bsz == 0:
        return out_ids, out_counts, out_sec
    key = counts + secondary / (n_models + 1)
    thr = -np.partition(-key, kk - 1, axis=1)[:, kk - 1]
    gt = key > thr[:, None]
    eq = key == thr[:, None]
    need = kk - gt.sum(axis=1)
    take = gt | (eq & (np.cumsum(eq, axis=1) <= need[:, None]))
    cols = np.nonzero(take)[1].reshape(bsz, kk)
    sel_key = np.take_along_axis(key, cols, axis=1)
    order = np.lexsort((cols, -sel_key), axis=-1)
    cols = np.take_along_axis(cols, order, axis=1)
    c = np.take_along_axis(counts, cols, axis=1)
    s = np.take_along_axis(secondary, cols, axis=1)
    hit = c > 0
    out_ids[:, :kk] = np.where(hit, cols, -1)
    out_counts[:, :kk] = np.where(hit, c, 0)
    out_sec[:, :kk] = np.where(hit, s, 0.0)
    return out_ids, out_counts, out_sec


@dataclass
class ForestHits:
    """Search result: ``ids int64 (nq, k)`` (-1 pad), ``counts int32 (nq, k)``, ``secondary
    float64 (nq, k)``, ranked by (count desc, secondary desc, id asc)."""

    ids: np.ndarray
    counts: np.ndarray
    secondary: np.ndarray

    def scores(self, n_models: int) -> np.ndarray:
        """``float32 (nq, k)`` run scores ``count + secondary / (M + 1)`` (``-inf`` on padding)."""
        s = (self.counts + self.secondary / (n_models + 1)).astype(np.float32)
        return np.where(self.ids >= 0, s, np.float32(-np.inf)).astype(np.float32)

    def tie_stats(self, at: int = 10) -> dict[str, float]:
        """How often ties decide the rank-``at`` boundary (needs ``k > at``).

        Returns:
            ``count_tie``: fraction of queries whose match count at rank ``at`` equals the one at
            rank ``at + 1`` (the count alone cannot decide who is in the top ``at``);
            ``secondary_tie``: fraction where count *and* secondary tie there (passage id
            decides); ``mean_tied_at_boundary``: mean number of retrieved passages sharing the
            count of rank ``at``. Queries with fewer than ``at + 1`` retrieved passages count as
            no tie.

        Raises:
            ValueError: ``k <= at``.
        """
        if self.ids.shape[1] <= at:
            raise ValueError(f"tie_stats: need k > {at} (got k={self.ids.shape[1]})")
        valid = self.ids[:, at] >= 0
        ct = valid & (self.counts[:, at - 1] == self.counts[:, at])
        st = ct & (self.secondary[:, at - 1] == self.secondary[:, at])
        same = (self.counts == self.counts[:, at - 1 : at]) & (self.ids >= 0)
        n = max(1, len(self.ids))
        return {
            "count_tie": float(ct.sum() / n),
            "secondary_tie": float(st.sum() / n),
            "mean_tied_at_boundary": float(same.sum(axis=1).mean()) if len(self.ids) else 0.0,
        }


class ForestIndex:
    """Inverted lists of a forest over a passage collection (see the module docstring).

    Args:
        n_models: M.
        n_classes: C.
    """

    def __init__(self, n_models: int, n_classes: int) -> None:
        self.n_models = int(n_models)
        self.n_classes = int(n_classes)
        self.n_passages = 0
        self.offsets = np.zeros(self.n_models * self.n_classes + 1, dtype=np.int64)
        self.ids = np.zeros(0, dtype=np.int32)
        self.probs = np.zeros(0, dtype=np.float32)
        self._postings: tuple[sp.csr_matrix, sp.csr_matrix] | None = None

    @classmethod
    def build(cls, classes: np.ndarray, probs: np.ndarray, n_classes: int) -> ForestIndex:
        """Index passages ``0 .. n-1`` from ``classes int (n, M)`` (-1 = not retrievable) and
        ``probs float32 (n, M)``."""
        index = cls(np.asarray(classes).shape[1], n_classes)
        index.add(classes, probs)
        return index

    def add(self, classes: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """Index new passages without retraining; they get ids ``n_passages, n_passages+1, ...``.

        The new entries are merged into every list with a stable sort on the list key, so lists
        stay ascending by id (cost ``O(nnz log nnz)``).

        Args:
            classes: ``int (n_new, M)`` from :meth:`Forest.passage_classes`.
            probs: ``float32 (n_new, M)``.

        Returns:
            ``int64 (n_new,)`` the ids given to the new passages.

        Raises:
            ValueError: wrong number of models or classes out of range.
        """
        classes = np.asarray(classes)
        if classes.ndim != 2 or classes.shape[1] != self.n_models:
            raise ValueError(
                f"forest index: expected classes of shape (n, {self.n_models}), got {classes.shape}"
            )
        new_off, new_ids, new_probs = build_inverted_lists(
            classes, probs, self.n_classes, id_offset=self.n_passages
        )
        n_lists = self.n_models * self.n_classes
        if self.ids.size == 0:
            self.offsets, self.ids, self.probs = new_off, new_ids, new_probs
        else:
            old_keys = np.repeat(np.arange(n_lists, dtype=np.int64), np.diff(self.offsets))
            new_keys = np.repeat(np.arange(n_lists, dtype=np.int64), np.diff(new_off))
            order = np.argsort(np.concatenate([old_keys, new_keys]), kind="stable")
            self.ids = np.concatenate([self.ids, new_ids])[order]
            self.probs = np.concatenate([self.probs, new_probs])[order]
            self.offsets = self.offsets + new_off
        first = self.n_passages
        self.n_passages += len(classes)
        self._postings = None
        return np.arange(first, self.n_passages, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored index arrays (offsets, ids, probs)."""
        return int(self.offsets.nbytes + self.ids.nbytes + self.probs.nbytes)

    @property
    def search_nbytes(self) -> int:
        """Bytes while searching: the stored arrays plus the sparse matrices' own data arrays
        (float32 ones + float64 probs + int32 row pointers; the ids are shared)."""
        return self.nbytes + self.ids.size * 12 + 2 * 4 * len(self.offsets)

    def list_sizes(self) -> np.ndarray:
        """``int64 (M, C)`` passages per (model, class) list."""
        return np.diff(self.offsets).reshape(self.n_models, self.n_classes)

    def _blocks(self, nq: int) -> Iterator[slice]:
        per_query = max(1, self.ids.size // max(1, self.n_classes), self.n_passages)
        b = max(1, min(nq, _BLOCK_BUDGET // per_query))
        for s in range(0, nq, b):
            yield slice(s, min(nq, s + b))

    def search(self, query_classes: np.ndarray, query_probs: np.ndarray, k: int) -> ForestHits:
        """Top ``k`` passages of each query by (match count, secondary score, passage id).

        Args:
            query_classes: ``int (nq, M)`` from :meth:`Forest.query_classes`.
            query_probs: ``float32 (nq, M)``.
            k: depth (``>= 1``).

        Returns:
            :class:`ForestHits` with ``(nq, k)`` arrays.

        Raises:
            ValueError: shapes disagree with the index or ``k < 1``.
        """
        qc = np.asarray(query_classes)
        qp = np.asarray(query_probs, dtype=np.float32)
        if qc.ndim != 2 or qc.shape[1] != self.n_models or qc.shape != qp.shape:
            raise ValueError(
                f"forest search: expected query classes/probs of shape (nq, {self.n_models}), "
                f"got {qc.shape} / {qp.shape}"
            )
        if k < 1:
            raise ValueError(f"forest search: k must be >= 1 (got {k})")
        if qc.size and (qc.min() < 0 or qc.max() >= self.n_classes):
            raise ValueError(f"forest search: query classes must lie in [0, {self.n_classes})")
        nq = len(qc)
        hits = ForestHits(
            np.full((nq, k), -1, dtype=np.int64),
            np.zeros((nq, k), dtype=np.int32),
            np.zeros((nq, k), dtype=np.float64),
        )
        if self._postings is None:
            self._postings = posting_matrices(self.offsets, self.ids, self.probs, self.n_passages)
        for sl in self._blocks(nq):
            counts, sec = match_scores(self._postings, qc[sl], qp[sl], self.n_classes)
            hits.ids[sl], hits.counts[sl], hits.secondary[sl] = topk_lexicographic(
                counts, sec, k, self.n_models
            )
        return hits

    def stats(self) -> dict[str, Any]:
        """Class-balance statistics of the indexed passages.

        Returns:
            ``passage_class_entropy``: per-model entropy (nats) of the class-usage distribution
            over indexed passages, as a list of M floats; ``max_entropy`` = ``log C``;
            ``not_retrievable_fraction``: fraction of (passage, model) entries left out;
            ``passages_never_indexed``: passages absent from every model; ``nbytes``.
        """
        sizes = self.list_sizes().astype(np.float64)
        tot = sizes.sum(axis=1, keepdims=True)
        p = np.divide(sizes, tot, out=np.zeros_like(sizes), where=tot > 0)
        ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        cells = max(1, self.n_passages * self.n_models)
        seen = np.zeros(self.n_passages, dtype=bool)
        seen[self.ids] = True
        return {
            "passage_class_entropy": ent.tolist(),
            "max_entropy": float(np.log(self.n_classes)),
            "not_retrievable_fraction": float(1.0 - self.ids.size / cells),
            "passages_never_indexed": int((~seen).sum()),
            "nbytes": self.nbytes,
        }


def class_entropy(classes: np.ndarray, n_classes: int) -> np.ndarray:
    """Entropy (nats) of class usage per model: ``classes int (n, M)`` (-1 ignored) ->
    ``float64 (M,)``; ``log C`` is perfectly balanced, 0 is all in one class."""
    classes = np.asarray(classes)
    n, m = classes.shape
    keys = (np.arange(m)[None, :] * n_classes + classes)[classes >= 0]
    counts = np.bincount(keys, minlength=m * n_classes).reshape(m, n_classes).astype(np.float64)
    tot = counts.sum(axis=1, keepdims=True)
    p = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)


class ForestSystem:
    """A forest as a retrieval system: ``retrieve(store, k) -> Run`` (the ``System`` protocol).

    ``retrieve`` classifies the store's passages in chunks, builds the inverted lists, classifies
    the queries and searches. The last index and hits are kept in ``index`` / ``hits`` for
    statistics (class balance, ties).

    Args:
        forest: a trained :class:`Forest`.
        name: run name (default: the forest's name).
        chunk_size: passages classified per chunk.
    """

    def __init__(self, forest: Forest, name: str | None = None, chunk_size: int = 16384) -> None:
        self.forest = forest
        self.name = name or forest.name
        self.chunk_size = chunk_size
        self.index: ForestIndex | None = None
        self.hits: ForestHits | None = None
        self._query_classes = np.zeros((0, forest.n_models), dtype=np.int64)

    def build_index(self, store: Any) -> ForestIndex:
        """Index every passage of ``store`` (an ``EmbeddingStore``)."""
        index = ForestIndex(self.forest.n_models, self.forest.n_classes)
        for _, block in store.iter_passage_chunks(self.chunk_size):
            index.add(*self.forest.passage_classes(np.asarray(block, dtype=np.float32)))
        return index

    def retrieve(self, store: Any, k: int = 1000) -> Run:
        """Rank all passages of ``store`` for all its queries.

        Returns:
            ``Run`` with ``ids int64 (nq, k)`` (-1 padded past the passages sharing no class with
            the query) and ``scores float32 (nq, k)`` = ``count + secondary / (M + 1)``.
        """
        self.index = self.build_index(store)
        qc, qp = self.forest.query_classes(np.asarray(store.queries, dtype=np.float32))
        self.hits = self.index.search(qc, qp, k)
        self._query_classes = qc
        return Run(name=self.name, ids=self.hits.ids, scores=self.hits.scores(self.forest.n_models))

    def balance_stats(self) -> dict[str, Any]:
        """Class balance, not-retrievable share and ties of the last :meth:`retrieve`.

        Returns:
            ``max_entropy_log_c``; mean / min over models of the class-usage entropy (nats) of the
            split's queries and indexed passages; ``not_retrievable_fraction`` of (passage, model)
            entries; ``passages_never_indexed``; ``index_bytes``; ``ties_at_rank_10``
            (:meth:`ForestHits.tie_stats`); ``mean_retrieved_per_query``.

        Raises:
            RuntimeError: :meth:`retrieve` has not run yet.
        """
        if self.index is None or self.hits is None:
            raise RuntimeError("balance_stats: call retrieve(store, k) first")
        st = self.index.stats()
        q_ent = class_entropy(self._query_classes, self.forest.n_classes)
        p_ent = np.asarray(st["passage_class_entropy"])
        return {
            "max_entropy_log_c": st["max_entropy"],
            "query_class_entropy_mean": float(q_ent.mean()),
            "query_class_entropy_min": float(q_ent.min()),
            "passage_class_entropy_mean": float(p_ent.mean()),
            "passage_class_entropy_min": float(p_ent.min()),
            "not_retrievable_fraction": st["not_retrievable_fraction"],
            "passages_never_indexed": st["passages_never_indexed"],
            "index_bytes": st["nbytes"],
            "ties_at_rank_10": self.hits.tie_stats(10) if self.hits.ids.shape[1] > 10 else None,
            "mean_retrieved_per_query": float((self.hits.ids >= 0).sum(1).mean()),
        }


def forest_report(systems: dict[str, ForestSystem]) -> dict[str, Any]:
    """The forest family's part of the evaluation report (``report`` hook of its family entry).

    Args:
        systems: report name -> a :class:`ForestSystem` that has retrieved on the split.

    Returns:
        ``{"stats": {name: balance_stats()}, "markdown": str}``: a table of class balance,
        not-retrievable share, ties and passages retrieved per query.
    """
    stats = {name: s.balance_stats() for name, s in systems.items()}
    md = [
        "### Forest index on this split",
        "",
        "| forest | query class entropy (mean / min, nats) | passage class entropy "
        "(mean / min) | max = log C | not retrievable | ties at rank 10 (count / "
        "count + secondary) | passages retrieved per query |",
        "|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for fname, st in stats.items():
        ties = st.get("ties_at_rank_10") or {}
        md.append(
            f"| {fname} | {st['query_class_entropy_mean']:.3f} / "
            f"{st['query_class_entropy_min']:.3f} | {st['passage_class_entropy_mean']:.3f}"
            f" / {st['passage_class_entropy_min']:.3f} | {st['max_entropy_log_c']:.3f} | "
            f"{st['not_retrievable_fraction']:.1%} | {ties.get('count_tie', nan):.0%}"
            f" / {ties.get('secondary_tie', nan):.0%} | "
            f"{st['mean_retrieved_per_query']:.0f} |"
        )
    return {"stats": stats, "markdown": "\n".join(md)}
