"""`RetrievalSplit`: the in-memory description of one split that every reader returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(repr=False)
class RetrievalSplit:
    """Texts and labels of one split (queries, passages, candidate lists).

    Row ``i`` of the query tables is query id ``i``; row ``j`` of the passage tables is passage
    id ``j``. Passages are de-duplicated by a hash of their exact text: the first occurrence owns
    the id and later occurrences share it (``passage_aliases`` maps every source id seen,
    including the later ones, to that id).

    Attributes:
        name: split name, e.g. ``"validation"``, ``"train"``, ``"test"``.
        source: dataset / format tag, e.g. ``"msmarco"``, ``"beir"``, ``"scifact"``, ``"trec-dl"``.
        query_ids: source id of each query, ``len == n_queries``.
        query_texts: text of each query.
        passage_ids: source id of the first occurrence of each passage, ``len == n_passages``.
        passage_texts: text of each passage (exact, never normalised).
        candidates: ``int32 (n_queries, K)`` passage ids of each query's candidates, ``-1`` padding.
            MS MARCO: the (up to) 10 shown passages. Sources without candidate lists (BEIR, TREC):
            the query's judged passages, so ``K`` grows to the largest judged set.
        labels: ``uint8 (n_queries, K)`` relevance grade of each candidate (MS MARCO
            ``is_selected``; graded qrels elsewhere); 0 = not selected and for padding.
        relevance_threshold: a grade ``>=`` this counts as relevant for MRR@10 and Recall@k
            (1 by default; 2 for TREC DL, the track's convention).
        query_types: optional per-query type (MS MARCO ``query_type``).
        passage_aliases: every source passage id seen -> passage id (dedup included).
        qrels: the source's own judgments ``[(query source id, document source id, grade)]``
            for this split's queries, by source ids, including judgments on documents absent
            from the corpus (evaluation counts those relevant and never retrieved) and on
            source ids that de-duplication folded into another passage. ``None`` when the
            candidate lists are the judgments (MS MARCO: the source has no passage ids).
        meta: free-form provenance (paths, counts of skipped rows, ...), JSON-serialisable.
    """

    name: str
    source: str
    query_ids: list[str]
    query_texts: list[str]
    passage_ids: list[str]
    passage_texts: list[str]
    candidates: np.ndarray
    labels: np.ndarray
    relevance_threshold: int = 1
    query_types: list[str] | None = None
    passage_aliases: dict[str, int] = field(default_factory=dict)
    qrels: list[tuple[str, str, int]] | None = None
    meta: dict[str, object] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Counts only: printing a split never dumps its texts (a corpus can be gigabytes)."""
        path = self.meta.get("path")
        where = f", path={str(path)!r}" if path else ""
        return (
            f"RetrievalSplit(name={self.name!r}, source={self.source!r}, "
            f"n_queries={self.n_queries}, n_passages={self.n_passages}, k={self.k}, "
            f"relevance_threshold={self.relevance_threshold}{where})"
        )

    @property
    def n_queries(self) -> int:
        return len(self.query_texts)

    @property
    def n_passages(self) -> int:
        return len(self.passage_texts)

    @property
    def k(self) -> int:
        """Candidates per query (columns of ``candidates``)."""
        return int(self.candidates.shape[1])

    def warnings(self) -> list[str]:
        """What the reader dropped or found unusable, as sentences for the user.

        Read from ``meta`` (counts the readers record) and the labels: judgments on passages
        absent from the corpus (count and an example), empty documents skipped, BEIR documents
        without a ``text`` field (stored as their title; file and rows), and a split
        whose judgments match none of its passages (fine for label-free training and serving;
        ``evaluate`` refuses it).
        """
        out: list[str] = []
        n_missing = self.meta.get("n_judgments_on_missing_passages")
        if isinstance(n_missing, int) and n_missing:
            example = self.meta.get("example_judgment_on_missing_passage")
            n_all = self.meta.get("n_judgments")
            out.append(
                f"{n_missing:,}{f' of {n_all:,}' if isinstance(n_all, int) else ''} judgments "
                "name a passage that is not in the corpus and were dropped"
                + (f" (e.g. {example})" if example else "")
            )
        n_empty = self.meta.get("n_empty_documents_skipped")
        if isinstance(n_empty, int) and n_empty:
            out.append(f"{n_empty:,} documents with empty text were skipped")
        n_no_text = self.meta.get("n_documents_without_text")
        if isinstance(n_no_text, int) and n_no_text:
            shown = self.meta.get("rows_without_text")
            shown = list(shown) if isinstance(shown, list) else []
            rows = ", ".join(str(r) for r in shown)
            more = ", ..." if n_no_text > len(shown) else ""
            out.append(
                f'{self.meta.get("corpus_file")}: {n_no_text:,} documents have no "text" field '
                f"and are stored as their title only (row {rows}{more})"
            )
        relevant = (self.candidates >= 0) & (self.labels >= self.relevance_threshold)
        if self.n_queries and not relevant.any():
            out.append(
                f"none of the {self.n_queries:,} queries has a judgment on a passage of this "
                "split: the store can serve search and label-free training, but evaluate will "
                "refuse it"
            )
        elif self.n_queries:
            n_unjudged = int((~relevant.any(axis=1)).sum())
            if n_unjudged:
                out.append(
                    f"{n_unjudged:,} of {self.n_queries:,} queries have no relevant passage in "
                    "this split; metrics leave them out (and count them)"
                )
        return out

    def validate(self) -> None:
        """Check internal consistency.

        Raises:
            ValueError: on mismatched lengths, wrong dtypes/shapes, or out-of-range passage ids.
        """
        nq, npas = self.n_queries, self.n_passages
        if len(self.query_ids) != nq:
            raise ValueError(f"{self.name}: {len(self.query_ids)} query ids for {nq} query texts")
        if len(self.passage_ids) != npas:
            raise ValueError(
                f"{self.name}: {len(self.passage_ids)} passage ids for {npas} passage texts"
            )
        if self.candidates.dtype != np.int32 or self.labels.dtype != np.uint8:
            raise ValueError(f"{self.name}: candidates must be int32 and labels uint8")
        if self.candidates.ndim != 2 or self.candidates.shape != self.labels.shape:
            raise ValueError(f"{self.name}: candidates/labels must be equal-shaped 2-D arrays")
        if self.candidates.shape[0] != nq:
            raise ValueError(
                f"{self.name}: candidates have {self.candidates.shape[0]} rows, {nq} queries"
            )
        if self.candidates.size and (self.candidates.max() >= npas or self.candidates.min() < -1):
            raise ValueError(f"{self.name}: candidate passage id out of range [-1, {npas})")
        if np.any(self.labels[self.candidates < 0] != 0):
            raise ValueError(f"{self.name}: padding slots (-1) must have label 0")
