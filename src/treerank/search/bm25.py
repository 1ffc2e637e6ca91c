"""BM25 over the split's passage texts (the sparse baseline), built on ``bm25s``.

Tokenisation (passages and queries alike): Unicode NFC (:func:`lexical_form`), lower-case,
``\\w\\w+`` tokens, English stopwords removed (bm25s' list), Snowball English stemmer
(PyStemmer). Scoring variants come from bm25s by
name (``method``): ``"lucene"`` (default; Lucene's idf ``log(1 + (N - df + 0.5)/(df + 0.5))``),
``"robertson"``, ``"atire"``, ``"bm25l"``, ``"bm25+"`` (Kamphuis et al. 2020, "Which BM25 do you
mean?"). Defaults ``k1 = 0.9, b = 0.4`` are Anserini/Pyserini's, the "Lucene-style" BM25 that
scores nDCG@10 = 0.676 on BEIR SciFact (Elasticsearch's 1.2 / 0.75 gives BEIR's 0.665).

Ranking uses each query's full score vector and :func:`~treerank.kernels.topk.topk_desc`, so ties
are broken by ascending passage id like every other system in treerank. A ranking lists only
passages with a **positive** score: a passage that shares no term with the query was not
retrieved and is not padded in (so fusion gives it no rank credit); a query that matches nothing
gets an empty ranking, which scores 0 (as ``trec_eval -c`` counts a query missing from a run).
A corpus whose passages are all stopwords (no term at all) scores 0 everywhere.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from treerank.kernels.topk import RUN_DEPTH, topk_desc
from treerank.kernels.vectors import F32, I64

BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4
_SCORE_BUDGET = 32_000_000  # dense scores held at once (128 MB of float32)
LEXICAL_NORMALISATION: Final = "NFC"


def lexical_form(text: str) -> str:
    """The one Unicode normalisation of lexical matching: NFC, applied to passages and queries
    alike before tokenisation (BM25, and RM3, which reuses BM25's tokens).

    NFC (canonical composition) makes canonically equivalent spellings one string: ``"cafe"``
    plus U+0301 (NFD, as macOS file names and some PDF extractions write it) and ``"café"``
    with U+00E9 are the same visible text and now the same token. NFKC was not chosen: it
    also folds *compatibility* characters that are different text (``"m²"`` -> ``"m2"``,
    ``"ﬁ"`` -> ``"fi"``, full-width letters), which rewrites 100 of SciFact's 5,183 corpus lines
    (NFC rewrites 1), i.e. it would change BM25's published numbers for a choice of analysis,
    not a correction.

    Args:
        text: any ``str``.

    Returns:
        ``unicodedata.normalize("NFC", text)``.
    """
    return unicodedata.normalize(LEXICAL_NORMALISATION, text)


@dataclass(frozen=True)
class BM25Params:
    """BM25 hyperparameters: term-frequency saturation ``k1``, length normalisation ``b``,
    bm25s scoring ``method``, stemmer language (``None`` = no stemming) and stopword list."""

    k1: float = DEFAULT_K1
    b: float = DEFAULT_B
    method: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"

    def __post_init__(self) -> None:
        if self.method not in BM25_METHODS:
            raise ValueError(
                f"unknown BM25 method {self.method!r}; known: {', '.join(BM25_METHODS)}"
            )
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


def _stemmer(lang: str | None):  # type: ignore[no-untyped-def]
    if lang is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(lang)


class BM25Index:
    """A bm25s index over a list of passages; passage id = position in the list."""

    def __init__(self, passage_texts: Sequence[str], params: BM25Params | None = None) -> None:
        import bm25s

        self.params = params or BM25Params()
        self._stem = _stemmer(self.params.stemmer)
        self.n_passages = len(passage_texts)
        tokens = bm25s.tokenize(
            [lexical_form(t) for t in passage_texts],
            stopwords=self.params.stopwords,
            stemmer=self._stem,
            show_progress=False,
        )
        self.model = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        self.empty = not tokens.vocab  # no passage has a term left (stopwords only)
        if not self.empty:
            self.model.index(tokens, show_progress=False)
        #: passage -> its token ids (bm25s vocabulary ids), kept for term statistics (RM3).
        self.corpus_token_ids: list[list[int]] = list(tokens.ids)  # type: ignore[union-attr]

    def query_tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """Tokenise queries exactly as the passages were (NFC, :func:`lexical_form`, included)."""
        import bm25s

        toks = bm25s.tokenize(
            [lexical_form(t) for t in texts],
            stopwords=self.params.stopwords,
            stemmer=self._stem,
            return_ids=False,
            show_progress=False,
        )
        return [list(t) for t in toks]  # type: ignore[union-attr]

    def scores(self, query_texts: Sequence[str]) -> F32:
        """``float32 (n_queries, n_passages)`` BM25 score of every passage for every query."""
        out = np.zeros((len(query_texts), self.n_passages), np.float32)
        if self.empty:
            return out
        vocab = self.model.vocab_dict
        for i, toks in enumerate(self.query_tokens(query_texts)):
            ids = [vocab[t] for t in toks if t in vocab]
            if ids:
                out[i] = self.model.get_scores_from_ids(ids)
        return out

    def search(
        self, query_texts: Sequence[str], k: int = RUN_DEPTH, batch: int = 256
    ) -> tuple[I64, F32]:
        """Top-``k`` passages per query (``batch`` queries' dense score rows at a time, fewer on
        big corpora so that at most 32M scores are held).

        Returns:
            ``(ids int64 (nq, k'), scores float32 (nq, k'))``, ``k' = min(k, n_passages)``,
            sorted by score, ties by ascending passage id; only positive scores, the rest of
            a row padded with ``-1`` / ``-inf``.
        """
        k = min(k, self.n_passages)
        batch = max(1, min(batch, _SCORE_BUDGET // max(self.n_passages, 1)))
        ids = np.empty((len(query_texts), k), np.int64)
        vals = np.empty((len(query_texts), k), np.float32)
        for s in range(0, len(query_texts), batch):
            ids[s : s + batch], vals[s : s + batch] = topk_desc(
                self.scores(query_texts[s : s + batch]), k
            )
        missed = ~(vals > 0)  # not retrieved: no shared term
        ids[missed], vals[missed] = -1, -np.inf
        return ids, vals
