"""BM25: the Lucene formula recomputed by hand on a tiny corpus, tokenisation, ranking ties."""

from __future__ import annotations

import math
from collections import Counter

import bm25s
import numpy as np
import pytest
import Stemmer

from treerank.search.bm25 import BM25Index, BM25Params

CORPUS = [
    "The running dogs were running fast",
    "A cat sleeps all day",
    "Dogs and cats are friends",
    "Fast cars race on the track",
    "Nothing relevant here",
]


def _lucene(corpus_tokens: list[list[str]], query: list[str], k1: float, b: float) -> np.ndarray:
    n = len(corpus_tokens)
    avgdl = sum(map(len, corpus_tokens)) / n
    df = Counter(t for doc in corpus_tokens for t in set(doc))
    out = np.zeros(n)
    for j, doc in enumerate(corpus_tokens):
        tf = Counter(doc)
        for t in set(query):
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                out[j] += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(doc) / avgdl))
    return out


@pytest.mark.parametrize(("k1", "b"), [(0.9, 0.4), (1.5, 0.75)])
def test_scores_equal_hand_computed_lucene_bm25(k1: float, b: float) -> None:
    index = BM25Index(CORPUS, BM25Params(k1=k1, b=b))
    toks = bm25s.tokenize(
        CORPUS,
        stopwords="en",
        stemmer=Stemmer.Stemmer("english"),
        return_ids=False,
        show_progress=False,
    )
    corpus_tokens = [list(t) for t in toks]
    assert corpus_tokens[0] == ["run", "dog", "were", "run", "fast"]  # "the" gone, stemmed
    queries = ["running dog", "fast cats", "zebra"]
    got = index.scores(queries)
    for i, q in enumerate(index.query_tokens(queries)):
        np.testing.assert_allclose(got[i], _lucene(corpus_tokens, q, k1, b), rtol=1e-5, atol=1e-6)
    assert not got[2].any()  # no known term: all zero


def test_search_lists_only_positive_scores() -> None:
    index = BM25Index(CORPUS)
    ids, scores = index.search(["dogs", "zebra", "fast"], k=10)
    assert ids.shape == (3, 5)  # k clipped to the corpus
    assert set(ids[0, :2].tolist()) == {0, 2} and (scores[0, :2] > 0).all()
    # passages sharing no term with the query are not retrieved: no zero-score filler
    assert ids[0, 2:].tolist() == [-1, -1, -1] and np.isneginf(scores[0, 2:]).all()
    assert ids[1].tolist() == [-1] * 5  # no known term: nothing retrieved
    # "fast" is in passages 0 and 3 with the same tf; the shorter one (3) scores higher
    assert ids[2, :2].tolist() == [3, 0] and scores[2, 0] > scores[2, 1] > 0


def test_stopword_only_corpus_scores_zero_everywhere() -> None:
    # issue 10, item 1: bm25s alone fails with "max() arg is an empty sequence"
    index = BM25Index(["the", "and of", "is it"])
    assert index.scores(["what is it", "cat"]).tolist() == [[0.0] * 3] * 2
    ids, scores = index.search(["what is it"], k=3)
    assert ids.tolist() == [[-1, -1, -1]] and np.isneginf(scores).all()


def test_bad_params_rejected() -> None:
    with pytest.raises(ValueError, match="method"):
        BM25Params(method="bm26")
    with pytest.raises(ValueError, match="b <= 1"):
        BM25Params(b=1.5)


NFC_CAFE = "caf\u00e9"  # é as one code point
NFD_CAFE = "cafe\u0301"  # e + combining acute accent: the same visible text


def test_nfd_and_nfc_spellings_score_alike_hand_computed() -> None:
    # issue 36: the NFC query found the passage (1.000), the NFD one nothing (0.000).
    # Each passage keeps 3 tokens after stopwords (dl = avgdl = 3), "café" is in 1 of N = 3
    # passages with tf = 1, so Lucene BM25 = idf * tf / (tf + k1) with idf = log(1 + (3 - 1 + 0.5)
    # / (1 + 0.5)) = log(8/3), k1 = 0.9: log(8/3) / 1.9 = 0.51623.
    for corpus_form in (NFC_CAFE, NFD_CAFE):
        index = BM25Index(
            [f"the {corpus_form} opened early", "a bakery on main street", "coffee beans roasted"]
        )
        s = index.scores([NFC_CAFE, NFD_CAFE, f"{NFD_CAFE} bakery".upper()])
        assert s[0].tolist() == s[1].tolist()
        assert s[0, 0] == pytest.approx(math.log(8 / 3) / 1.9, rel=1e-6)
        assert s[0, 1] == 0.0 and s[0, 2] == 0.0
        assert s[2, 0] == pytest.approx(math.log(8 / 3) / 1.9, rel=1e-6)  # upper-cased NFD too
        ids, _ = index.search([NFD_CAFE], k=3)
        assert ids[0].tolist() == [0, -1, -1]


def test_lexical_form_is_nfc_not_nfkc() -> None:
    from treerank.search.bm25 import lexical_form

    assert lexical_form(NFD_CAFE) == NFC_CAFE
    assert lexical_form("m\u00b2 \ufb01sh") == "m\u00b2 \ufb01sh"  # compatibility forms kept
