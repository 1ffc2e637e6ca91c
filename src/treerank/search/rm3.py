"""BM25 + RM3 pseudo-relevance feedback (the honest sparse baseline), built on ``bm25s``.

RM3 (Lavrenko & Croft, SIGIR 2001, "Relevance-based language models"; RM3 = the relevance model
interpolated with the original query, Abdul-Jaleel et al., TREC 2004), exactly as Anserini's
``Rm3Reranker`` computes it (Yang, Fang & Lin, "Anserini", JDIQ 2018; defaults
``fb_docs = 10, fb_terms = 10, orig_weight = 0.5``):

1. Retrieve with BM25; the top ``fb_docs`` passages **with a positive score** are the feedback set
   (fewer when BM25 matched fewer; none leaves the query unchanged).
2. Each feedback passage ``d`` becomes a term-count vector over the BM25 vocabulary (NFC
   normalised, stemmed, stopwords removed, the same tokens BM25 indexed), keeping only terms of
   2-20 characters matching ``[a-z0-9]+`` whose document frequency is at most ``max_df = 10%``
   of the passages (Anserini's stopword heuristic), pruned to its ``fb_terms`` most frequent terms.
3. Relevance model: ``P(t|R) ~ sum_d tf(t, d) / |d|' * score(d)``, with ``|d|'`` the L1 norm of the
   pruned vector and ``score(d)`` the passage's BM25 score. Because the model is L1-normalised
   afterwards, weighting by the raw score equals weighting by the normalised score
   ``score(d) / sum score`` (the stand-in for the query likelihood ``P(q|d)`` of Lavrenko &
   Croft). Pruned to the ``fb_terms`` heaviest terms, then L1-normalised.
4. Interpolation: ``w(t) = orig_weight * q(t) + (1 - orig_weight) * P(t|R)``, with ``q(t)`` the
   query's term counts L1-normalised (terms outside the vocabulary count in the norm but match
   nothing).
5. The expanded query scores every passage as ``sum_t w(t) * bm25(t, d)`` (Lucene's weighted
   ``BooleanQuery`` of boosted ``TermQuery``s); the run lists only passages with a positive
   score, sorted by score, ties by ascending passage id.

Ties when pruning (equal counts or weights) are broken by the term's string, ascending, so the
expansion is deterministic (Anserini leaves them to its hash map's order).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from treerank.kernels.topk import RUN_DEPTH, topk_desc
from treerank.kernels.vectors import F32, F64, I64
from treerank.search.bm25 import BM25Index, BM25Params
from treerank.search.run import Run, store_key
from treerank.storelike import StoreLike

TermIds = npt.NDArray[np.int32 | np.int64]
"""Term ids (the columns of a sparse term-count row, bm25s' indices)."""


class _ScoreMatrix(TypedDict):
    """bm25s' precomputed BM25 weights as compressed-column parts (``BM25.scores``)."""

    data: F32
    indices: TermIds
    indptr: TermIds | list[int]


DEFAULT_FB_DOCS = 10
DEFAULT_FB_TERMS = 10
DEFAULT_ORIG_WEIGHT = 0.5
DEFAULT_MAX_DF = 0.1
_TERM_RE = re.compile(r"[a-z0-9]{2,20}")
_SCORE_BUDGET = 32_000_000  # dense scores held at once


@dataclass(frozen=True)
class RM3Params:
    """RM3 settings (Anserini's names and defaults): feedback passages ``fb_docs``, expansion
    terms ``fb_terms``, weight of the original query ``orig_weight`` in [0, 1], and the document
    frequency ratio ``max_df`` above which a term is never a feedback term."""

    fb_docs: int = DEFAULT_FB_DOCS
    fb_terms: int = DEFAULT_FB_TERMS
    orig_weight: float = DEFAULT_ORIG_WEIGHT
    max_df: float = DEFAULT_MAX_DF

    def __post_init__(self) -> None:
        if self.fb_docs < 1 or self.fb_terms < 1:
            raise ValueError(
                f"RM3 needs fb_docs >= 1 and fb_terms >= 1, got {self.fb_docs}, {self.fb_terms}"
            )
        if not 0.0 <= self.orig_weight <= 1.0 or not 0.0 < self.max_df <= 1.0:
            raise ValueError(
                "RM3 needs 0 <= orig_weight <= 1 and 0 < max_df <= 1, got "
                f"orig_weight={self.orig_weight}, max_df={self.max_df}"
            )


def _top_terms(terms: TermIds, weights: F64, rank: I64, n: int) -> I64:
    """Positions of the ``n`` largest ``weights``, ties by ``rank[terms]`` ascending."""
    order = np.lexsort((rank[terms], -weights))
    return order[:n]


def relevance_model(
    fb_counts: sp.csr_matrix,
    fb_scores: F32,
    term_ok: npt.NDArray[np.bool_],
    term_rank: I64,
    fb_terms: int,
) -> dict[int, float]:
    """The RM3 relevance model ``P(t|R)`` of one query's feedback set (steps 2-3 above).

    Args:
        fb_counts: ``(n_fb, n_vocab)`` term counts of the feedback passages, best first.
        fb_scores: ``float (n_fb,)`` their first-round (BM25) scores, all > 0.
        term_ok: ``bool (n_vocab,)`` terms allowed as feedback terms (pattern and df filter).
        term_rank: ``int (n_vocab,)`` each term's position in alphabetical order (tie-break).
        fb_terms: terms kept per passage and in the model.

    Returns:
        term id -> weight, L1-normalised (empty when no feedback term survives).
    """
    terms: list[TermIds] = []
    contrib: list[F64] = []
    for i in range(fb_counts.shape[0]):
        row = fb_counts.getrow(i)
        cols, vals = row.indices, row.data.astype(np.float64)
        keep = term_ok[cols] & (vals > 0)
        cols, vals = cols[keep], vals[keep]
        top = _top_terms(cols, vals, term_rank, fb_terms)
        cols, vals = cols[top], vals[top]
        norm = vals.sum()
        if norm > 0.001:  # Anserini skips (near) empty feedback vectors
            terms.append(cols)
            contrib.append(vals / norm * float(fb_scores[i]))
    if not terms:
        return {}
    u, inv = np.unique(np.concatenate(terms), return_inverse=True)
    w = np.zeros(u.size)
    np.add.at(w, inv, np.concatenate(contrib))
    top = _top_terms(u, w, term_rank, fb_terms)
    u, w = u[top], w[top]
    total = w.sum()
    return {int(t): float(x / total) for t, x in zip(u, w, strict=True)} if total > 0 else {}


def interpolate(
    query_counts: dict[int, float], n_oov: int, rm: dict[int, float], orig_weight: float
) -> dict[int, float]:
    """``orig_weight * q(t) + (1 - orig_weight) * rm(t)`` (step 4 above).

    Args:
        query_counts: in-vocabulary term id -> count in the query.
        n_oov: query terms outside the vocabulary (they count in ``q``'s L1 norm only).
        rm: the relevance model (:func:`relevance_model`).
        orig_weight: weight of the original query.
    """
    total = sum(query_counts.values()) + n_oov
    out: dict[int, float] = {}
    for t, c in query_counts.items():
        out[t] = orig_weight * c / total
    for t, x in rm.items():
        out[t] = out.get(t, 0.0) + (1.0 - orig_weight) * x
    return out


class RM3Index:
    """BM25 + RM3 over a list of passages (passage id = position in the list).

    Args:
        passage_texts: the split's passages.
        params: RM3 settings; ``bm25``: BM25 settings of both rounds.
    """

    def __init__(
        self,
        passage_texts: Sequence[str],
        params: RM3Params | None = None,
        bm25: BM25Params | None = None,
    ) -> None:
        self.params = params or RM3Params()
        self.bm25 = BM25Index(passage_texts, bm25)
        self.n_passages = self.bm25.n_passages
        # a stopwords-only corpus has no vocabulary: nothing is ever retrieved (scores 0)
        self.vocab: dict[str, int] = {} if self.bm25.empty else dict(self.bm25.model.vocab_dict)
        vocab = self.vocab
        n_vocab = len(vocab)
        words = [""] * n_vocab
        for w, i in vocab.items():
            words[i] = w
        self.words = words
        ids = self.bm25.corpus_token_ids
        rows = np.repeat(np.arange(len(ids)), [len(t) for t in ids])
        cols = np.fromiter((t for doc in ids for t in doc), np.int64, count=rows.size)
        #: ``(n_passages, n_vocab)`` term counts.
        self.counts = sp.csr_matrix(
            (np.ones(rows.size, np.float32), (rows, cols)), shape=(len(ids), n_vocab)
        )
        self.counts.sum_duplicates()
        s: _ScoreMatrix = (
            {"data": np.zeros(0, np.float32), "indices": np.zeros(0, np.int64), "indptr": [0]}
            if self.bm25.empty
            else self.bm25.model.scores
        )
        n_cols = len(s["indptr"]) - 1  # bm25s' vocabulary may end with an unindexed "" token
        #: ``(n_vocab, n_passages)`` BM25 term weights (bm25s' precomputed matrix, transposed).
        self.term_scores = sp.vstack(
            [
                sp.csc_matrix(
                    (s["data"], s["indices"], s["indptr"]), shape=(self.n_passages, n_cols)
                ).T.tocsr(),
                sp.csr_matrix((n_vocab - n_cols, self.n_passages), dtype=np.float32),
            ]
        ).tocsr()
        self.df = np.zeros(n_vocab, np.int64)
        self.df[:n_cols] = np.diff(s["indptr"])
        ok_word = np.array([bool(_TERM_RE.fullmatch(w)) for w in words], dtype=bool)
        self.term_ok = ok_word & (self.df <= self.params.max_df * max(self.n_passages, 1))
        self.term_rank = np.empty(n_vocab, np.int64)
        self.term_rank[np.argsort(np.array(words, dtype=object), kind="stable")] = np.arange(
            n_vocab
        )

    def expansions(
        self, query_texts: Sequence[str], first_round: F32 | None = None
    ) -> list[dict[int, float]]:
        """The expanded query of each text: term id -> weight (step 1-4 of the module doc).

        Args:
            query_texts: the queries.
            first_round: ``float32 (n_queries, n_passages)`` BM25 scores if already computed.
        """
        p = self.params
        vocab = self.vocab
        tokens = self.bm25.query_tokens(query_texts)
        scores = self.bm25.scores(query_texts) if first_round is None else first_round
        out: list[dict[int, float]] = []
        for i, toks in enumerate(tokens):
            qc: dict[int, float] = {}
            for t in toks:
                if t in vocab:
                    qc[vocab[t]] = qc.get(vocab[t], 0.0) + 1.0
            n_oov = sum(1 for t in toks if t not in vocab)
            if not qc:
                out.append({})
                continue
            ids, vals = topk_desc(scores[i : i + 1], p.fb_docs)
            pos = vals[0] > 0
            fb, fb_scores = ids[0][pos], vals[0][pos]
            rm = relevance_model(
                self.counts[fb], fb_scores, self.term_ok, self.term_rank, p.fb_terms
            )
            out.append(interpolate(qc, n_oov, rm, p.orig_weight))
        return out

    def scores(self, expansions: Sequence[dict[int, float]]) -> F32:
        """``float32 (n_queries, n_passages)`` ``sum_t w(t) * bm25(t, d)`` per expanded query."""
        n_vocab = self.term_scores.shape[0]
        rows = np.repeat(np.arange(len(expansions)), [len(e) for e in expansions])
        cols = np.fromiter((t for e in expansions for t in e), np.int64, count=rows.size)
        vals = np.fromiter((w for e in expansions for w in e.values()), np.float64, rows.size)
        q = sp.csr_matrix((vals, (rows, cols)), shape=(len(expansions), n_vocab))
        return np.asarray((q @ self.term_scores).toarray(), dtype=np.float32)

    def search(
        self, query_texts: Sequence[str], k: int = RUN_DEPTH, batch: int = 256
    ) -> tuple[I64, F32]:
        """Top-``k`` passages per query with a positive expanded-query score.

        Returns:
            ``(ids int64 (nq, k'), scores float32 (nq, k'))``, ``k' = min(k, n_passages)``,
            sorted by score, ties by ascending passage id; ``-1`` / ``-inf`` pad each row after
            its last positive-score passage.
        """
        k = min(k, self.n_passages)
        batch = max(1, min(batch, _SCORE_BUDGET // max(self.n_passages, 1)))
        ids = np.empty((len(query_texts), k), np.int64)
        vals = np.empty((len(query_texts), k), np.float32)
        for s in range(0, len(query_texts), batch):
            texts = query_texts[s : s + batch]
            exp = self.expansions(texts, self.bm25.scores(texts))
            top_i, top_v = topk_desc(self.scores(exp), k)
            miss = top_v <= 0
            ids[s : s + batch] = np.where(miss, -1, top_i)
            vals[s : s + batch] = np.where(miss, -np.inf, top_v)
        return ids, vals

    def describe(self, expansion: dict[int, float]) -> dict[str, float]:
        """An expanded query as ``{term: weight}``, heaviest first (for reports and debugging)."""
        items = sorted(expansion.items(), key=lambda kv: (-kv[1], self.words[kv[0]]))
        return {self.words[t]: w for t, w in items}


class RM3System:
    """``bm25+rm3:...`` as a :class:`~treerank.search.systems.System`: BM25 + RM3 over the
    split's passage texts; the index is built on first use per store and kept."""

    def __init__(
        self,
        params: RM3Params | None = None,
        bm25: BM25Params | None = None,
        name: str = "bm25+rm3",
    ) -> None:
        self.params = params or RM3Params()
        self.bm25_params = bm25 or BM25Params()
        self.name = name
        self._cache: tuple[str, RM3Index] | None = None
        self._run: tuple[str, Run] | None = None

    def index_for(self, store: StoreLike) -> RM3Index:
        key = store_key(getattr(store, "base", store))  # a view shares its store's index
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, RM3Index(store.passage_texts(), self.params, self.bm25_params))
        return self._cache[1]

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        k = min(k, int(store.n_passages))
        key = store_key(store)
        if self._run is not None and self._run[0] == key and self._run[1].k >= k:
            return self._run[1].truncate(k)
        ids, scores = self.index_for(store).search(store.query_texts(), k)
        run = Run(self.name, ids, scores)
        self._run = (key, run)
        return run
