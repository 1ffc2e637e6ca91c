"""`SplitBuilder`: accumulate queries, de-duplicated passages and candidate lists into a split."""

from __future__ import annotations

import numpy as np

from treerank.readers.split import RetrievalSplit


class SplitBuilder:
    """Incrementally build a `RetrievalSplit`.

    Passages are de-duplicated by their exact text (a hash table keyed on the text, i.e. a hash
    of the text with exact comparison on collision): the first occurrence gets the next passage
    id and its source id; later occurrences share that id and are recorded in
    ``passage_aliases``. A query's candidate list keeps the first slot of each passage; when
    dedup folds two source passages of one query into one id, the larger grade is kept.

    Exact text means the exact code points, **not** Unicode-normalised: an NFD and an NFC
    spelling of one visible passage stay two passages. Dedup decides passage identity (qrels,
    split digests, every store signature) and the dense encoder reads the raw text, so two
    texts are one passage only when every consumer sees the same string; lexical matching
    treats the two spellings alike anyway (BM25 and RM3 normalise to NFC,
    :func:`treerank.search.bm25.lexical_form`), and passage-vector reuse between splits
    (:func:`treerank.store.reuse.match_passages`) matches exact text the same way.

    Args:
        name: split name.
        source: dataset / format tag.
        relevance_threshold: grade ``>=`` this counts as relevant.
    """

    def __init__(self, name: str, source: str, relevance_threshold: int = 1) -> None:
        self.name = name
        self.source = source
        self.relevance_threshold = relevance_threshold
        self.query_ids: list[str] = []
        self.query_texts: list[str] = []
        self.query_types: list[str] = []
        self.passage_ids: list[str] = []
        self.passage_texts: list[str] = []
        self.aliases: dict[str, int] = {}
        self._by_text: dict[str, int] = {}
        self._cands: list[list[int]] = []
        self._grades: list[list[int]] = []
        self.n_folded_candidates = 0

    def add_passage(self, source_id: str, text: str) -> int:
        """Add (or find) a passage; return its passage id."""
        pid = self._by_text.get(text)
        if pid is None:
            pid = len(self.passage_texts)
            self._by_text[text] = pid
            self.passage_ids.append(source_id)
            self.passage_texts.append(text)
        self.aliases.setdefault(source_id, pid)
        return pid

    def add_query(self, source_id: str, text: str, query_type: str = "") -> int:
        """Add a query with an empty candidate list; return its query id."""
        qid = len(self.query_texts)
        self.query_ids.append(source_id)
        self.query_texts.append(text)
        self.query_types.append(query_type)
        self._cands.append([])
        self._grades.append([])
        return qid

    def add_candidate(self, qid: int, pid: int, grade: int) -> None:
        """Append passage ``pid`` with ``grade`` to query ``qid``'s candidates (-1 = empty slot)."""
        cands, grades = self._cands[qid], self._grades[qid]
        if pid >= 0 and pid in cands:
            j = cands.index(pid)
            grades[j] = max(grades[j], grade)
            self.n_folded_candidates += 1
            return
        cands.append(pid)
        grades.append(grade if pid >= 0 else 0)

    def build(self, k: int | None = None, keep_query_types: bool = False) -> RetrievalSplit:
        """Return the split; ``k`` fixes the candidate width (default: the longest list, >= 1).

        Raises:
            ValueError: when a candidate list is longer than ``k``.
        """
        width = max([len(c) for c in self._cands] + [1]) if k is None else k
        nq = len(self._cands)
        candidates = np.full((nq, width), -1, dtype=np.int32)
        labels = np.zeros((nq, width), dtype=np.uint8)
        for i, (c, g) in enumerate(zip(self._cands, self._grades, strict=True)):
            if len(c) > width:
                raise ValueError(f"query {self.query_ids[i]}: {len(c)} candidates > K={width}")
            candidates[i, : len(c)] = c
            labels[i, : len(g)] = g
        labels[candidates < 0] = 0
        split = RetrievalSplit(
            name=self.name,
            source=self.source,
            query_ids=self.query_ids,
            query_texts=self.query_texts,
            passage_ids=self.passage_ids,
            passage_texts=self.passage_texts,
            candidates=candidates,
            labels=labels,
            relevance_threshold=self.relevance_threshold,
            query_types=self.query_types if keep_query_types else None,
            passage_aliases=self.aliases,
            meta={"n_folded_candidates": self.n_folded_candidates},
        )
        split.validate()
        return split
