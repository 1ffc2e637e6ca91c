"""`Qrels`: graded relevance judgments of every query of a split, as arrays.

Relevance comes from the store's candidate lists: ``candidates[i, j]`` is a passage id judged for
query ``i`` and ``labels[i, j]`` its grade (MS MARCO ``is_selected``; graded qrels for TREC DL;
``-1`` pads). A grade ``>= relevance_threshold`` counts as relevant for MRR@k, Recall@k and
Success@k; nDCG@k uses the grades themselves.

**Source qrels and aliases.** A store that keeps the source's own judgments (``qrels.tsv``, see
:meth:`Qrels.from_store`) is scored against them, by source ids, so that every metric equals
``trec_eval`` on the run file treerank writes and the source's qrels file: a passage that
de-duplication shares between several source ids (identical texts) is *expanded* in the ranking
into all of them, at consecutive ranks in source order (:meth:`Qrels.expand`); a judged id
absent from the corpus counts as relevant and never retrieved. Stores without ``qrels.tsv``
(MS MARCO, whose candidate lists are the judgments; stores written before) are scored against
their candidate tables by passage id, as before.

**Pools (stores without ``qrels.tsv``).** A store only holds the passages of its split. For a pooled
corpus such as the TREC DL19 pool shipped here, judged passages that no pooled run retrieved are not
in the store, so they are not in the qrels either: Recall@k is then "the fraction of the *pooled*
relevant passages retrieved", and the nDCG ideal ranking is built from pooled judgments only. Scores
are comparable between systems run on the same pool, not with full-collection numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from treerank.storelike import Judgments, meta_object

_SHIFT = 32  # key = query << 32 | passage id (passage ids < 2**32)
#: reader counts (``meta.json`` ``source_meta``) reported as departures from the source
_SOURCE_DEPARTURES = (
    "n_judgments_on_unknown_topics",
    "n_judgments_on_missing_passages",
    "n_empty_documents_skipped",
    "n_empty_passages_skipped",
    "n_unlabelled_passages",
    "n_folded_candidates",
)


PassageIds = npt.NDArray[np.int32 | np.int64]
"""``int32`` / ``int64`` passage ids (``-1`` = padding)."""
Grades = npt.NDArray[np.uint8 | np.int16 | np.int32 | np.int64]
"""Integer relevance grades (``uint8`` in a store, ``int16`` graded runs)."""
RunScores = npt.NDArray[np.float32 | np.float64]
"""A run's scores, rank order."""


@dataclass
class Qrels:
    """Judgments of ``n_queries`` queries.

    Attributes:
        candidates: ``int32 (n_queries, K)`` judged passage ids, ``-1`` padding.
        labels: ``uint8 (n_queries, K)`` grades (0 = judged not relevant, and for padding).
        relevance_threshold: grade ``>=`` this is relevant for MRR / Recall / Success (1 by
            default; 2 for TREC DL).
        expansion: ``int64 (n_passages + 1,)`` offsets when judgments are by *document* ids and
            passage ``p`` stands for documents ``expansion[p] .. expansion[p + 1] - 1`` (text
            de-duplication); ``None`` when documents and passages coincide. ``candidates`` then
            hold document ids.
        doc_ids: source id of each document id (``None``: unknown); ids past the corpus are
            judged documents absent from it.
        departures: counts of what differs from the source (judgments on absent documents,
            merged duplicates, ...), reported beside the metrics.
    """

    candidates: PassageIds
    labels: Grades
    relevance_threshold: int = 1
    expansion: npt.NDArray[np.int64] | None = None
    doc_ids: list[str] | None = None
    departures: dict[str, int] = field(default_factory=dict)

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
        self._index: tuple[npt.NDArray[np.int64], Grades] | None = None

    @classmethod
    def from_store(cls, store: Judgments, relevance_threshold: int | None = None) -> Qrels:
        """Judgments of an :class:`~treerank.store.EmbeddingStore` split; the threshold defaults
        to the store's ``relevance_threshold``.

        With the store's source qrels (``store.source_qrels()``) this is :meth:`from_source`
        (document ids, aliases expanded, absent judged ids kept); without, the ``candidates``
        and ``labels`` tables by passage id. ``departures`` also carries the reader's counts
        from ``meta.json`` (judgments on unknown topics, empty documents skipped, ...).
        """
        thr = store.relevance_threshold if relevance_threshold is None else relevance_threshold
        source = store.source_qrels()
        src_meta = meta_object(store.meta, "source_meta")
        extra = {
            k: int(v) for k in _SOURCE_DEPARTURES if isinstance(v := src_meta.get(k), int | float)
        }
        if source is None:
            out = cls(np.asarray(store.candidates), np.asarray(store.labels), int(thr))
            out.departures = extra
            return out
        extra.pop("n_judgments_on_missing_passages", None)  # kept, counted by from_source
        out = cls.from_source(
            source, store.query_ids(), store.passage_ids(), store.passage_aliases(), int(thr)
        )
        out.departures.update(extra)
        return out

    @classmethod
    def from_source(
        cls,
        judgments: list[tuple[str, str, int]],
        query_ids: list[str],
        passage_ids: list[str],
        aliases: dict[str, int] | None = None,
        relevance_threshold: int = 1,
    ) -> Qrels:
        """Judgments by source ids, scored on runs of passage ids expanded to document ids.

        Args:
            judgments: ``[(query id, doc id, grade)]`` as in the source's qrels file (negative
                grades become 0); judgments on queries not in ``query_ids`` are ignored.
            query_ids: source id of each query row.
            passage_ids: source id of each passage (its first occurrence).
            aliases: every source doc id -> passage id (de-duplicated ids included); a passage's
                documents are its own id, then its aliases in mapping order.
            relevance_threshold: see the class.

        Returns:
            `Qrels` over document ids: ``0 ..`` the corpus's source ids in passage order (with
            their aliases), then the judged ids absent from the corpus. ``doc_ids``,
            ``expansion`` (``None`` without merged duplicates) and ``departures`` are set.
        """
        groups = [[sid] for sid in passage_ids]
        for sid, p in (aliases or {}).items():
            if passage_ids[p] != sid:
                groups[p].append(sid)
        sizes = np.fromiter((len(g) for g in groups), np.int64, len(groups))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        doc_ids = [s for g in groups for s in g]
        n_corpus = len(doc_ids)
        index = {s: i for i, s in enumerate(doc_ids)}
        row_of = {q: i for i, q in enumerate(query_ids)}
        rows: list[list[tuple[int, int]]] = [[] for _ in query_ids]
        n_absent = n_absent_rel = 0
        for q, d, g in judgments:
            i = row_of.get(q)
            if i is None:
                continue
            e = index.get(d)
            if e is None:
                e = index[d] = len(doc_ids)
                doc_ids.append(d)
            if e >= n_corpus:
                n_absent += 1
                n_absent_rel += int(g >= relevance_threshold)
            rows[i].append((e, max(int(g), 0)))
        width = max((len(r) for r in rows), default=0)
        cand = np.full((len(query_ids), max(width, 1)), -1, np.int64)
        lab = np.zeros_like(cand)
        for i, r in enumerate(rows):
            if r:
                cand[i, : len(r)] = [e for e, _ in r]
                lab[i, : len(r)] = [g for _, g in r]
        out = cls(
            cand,
            lab,
            relevance_threshold,
            expansion=offsets if (sizes > 1).any() else None,
            doc_ids=doc_ids,
        )
        out.departures = {
            "judgments_on_documents_absent_from_corpus": n_absent,
            "relevant_judgments_on_documents_absent_from_corpus": n_absent_rel,
            "duplicate_documents_merged": n_corpus - len(passage_ids),
        }
        return out

    def expand(
        self, ids: PassageIds, scores: RunScores | None = None
    ) -> tuple[npt.NDArray[np.int64], RunScores | None]:
        """A ranking of passage ids as the ranking of document ids it stands for.

        Each passage is replaced by all its documents at consecutive ranks (source order), each
        with the passage's score. Identity when ``expansion`` is ``None``.

        Args:
            ids: ``int64 (nq, k)`` passage ids, rank order, ``-1`` padding at row ends.
            scores: optional ``float32 (nq, k)`` scores, expanded alike.

        Returns:
            ``(ids int64 (nq, k'), scores float32 (nq, k') or None)``, ``k' >= k``, ``-1`` /
            ``-inf`` padding.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if self.expansion is None:
            return ids.astype(np.int64, copy=False), scores
        off = self.expansion
        nq, k = ids.shape
        valid = ids >= 0
        safe = np.where(valid, ids, 0)
        rep = np.where(valid, off[safe + 1] - off[safe], 0).ravel()
        per_row = rep.reshape(nq, k).sum(axis=1)
        width = max(int(per_row.max(initial=0)), 1)
        total = int(rep.sum())
        ends = np.cumsum(rep)
        within = np.arange(total) - np.repeat(ends - rep, rep)
        doc = np.repeat(off[safe].ravel(), rep) + within
        row = np.repeat(np.repeat(np.arange(nq), k), rep)
        col = np.arange(total) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        out = np.full((nq, width), -1, np.int64)
        out[row, col] = doc
        out_scores = None
        if scores is not None:
            out_scores = np.full((nq, width), -np.inf, np.float32)
            out_scores[row, col] = np.repeat(np.asarray(scores, np.float32).ravel(), rep)
        return out, out_scores

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

    def n_relevant(self, threshold: int | None = None) -> npt.NDArray[np.int64]:
        """``int64 (n_queries,)`` distinct passages with grade ``>= threshold`` per query."""
        thr = self.relevance_threshold if threshold is None else threshold
        keys, grades = self.index()
        return np.bincount(keys[grades >= thr] >> _SHIFT, minlength=self.n_queries).astype(np.int64)

    def index(self) -> tuple[npt.NDArray[np.int64], Grades]:
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

    def grades_of(self, ids: PassageIds, row_offset: int = 0) -> npt.NDArray[np.int16]:
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

    def ideal_grades(self, depth: int) -> npt.NDArray[np.int64]:
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
