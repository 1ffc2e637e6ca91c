"""BM25 + RM3: hand-computed expansion weights, the feedback filters, scoring, spec parsing."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from treerank.search.bm25 import BM25Index
from treerank.search.rm3 import RM3Index, RM3Params, RM3System, interpolate, relevance_model
from treerank.search.specs import build_system
from treerank.search.systems import FusionSystem

# vocabulary ids: x=0, y=1, z=2, w=3, q=4 ; alphabetical ranks: q=0, w=1, x=2, y=3, z=4
RANK = np.array([2, 3, 4, 1, 0])
OK = np.ones(5, dtype=bool)


def _counts(rows: list[dict[int, int]]) -> sp.csr_matrix:
    m = sp.lil_matrix((len(rows), 5), dtype=np.float32)
    for i, r in enumerate(rows):
        for t, c in r.items():
            m[i, t] = c
    return m.tocsr()


# feedback: d_a = {x: 3, y: 1, z: 1} with BM25 score 2.0, d_b = {y: 2, w: 2} with score 1.0
FB = _counts([{0: 3, 1: 1, 2: 1}, {1: 2, 3: 2}])
FB_SCORES = np.array([2.0, 1.0])


def test_relevance_model_hand_values() -> None:
    # fb_terms = 2: d_a keeps x:3 and y:1 (y beats z on the tie: alphabetical), |d_a|' = 4;
    # d_b keeps w:2, y:2, |d_b|' = 4.
    # x = 3/4 * 2 = 1.5 ; y = 1/4 * 2 + 2/4 * 1 = 1.0 ; w = 2/4 * 1 = 0.5
    # keep the 2 heaviest (x, y) and L1-normalise: x = 0.6, y = 0.4
    rm = relevance_model(FB, FB_SCORES, OK, RANK, fb_terms=2)
    assert rm == pytest.approx({0: 0.6, 1: 0.4})
    # fb_terms = 3: nothing pruned per passage; z = 1/5 * 2 = 0.4 ; x = 3/5 * 2 = 1.2 ;
    # y = 1/5 * 2 + 2/4 * 1 = 0.9 ; w = 0.5 ; top 3 = x, y, w; sum 2.6
    rm3 = relevance_model(FB, FB_SCORES, OK, RANK, fb_terms=3)
    assert rm3 == pytest.approx({0: 1.2 / 2.6, 1: 0.9 / 2.6, 3: 0.5 / 2.6})


def test_relevance_model_respects_the_term_filter_and_scales_with_scores() -> None:
    no_x = OK.copy()
    no_x[0] = False
    # without x: d_a = {y: 1, z: 1} (norm 2), d_b = {w: 2, y: 2} (norm 4)
    # y = 1/2 * 2 + 2/4 = 1.5 ; z = 1/2 * 2 = 1.0 ; w = 0.5 -> top 2 (y, z) / 2.5
    assert relevance_model(FB, FB_SCORES, no_x, RANK, 2) == pytest.approx({1: 0.6, 2: 0.4})
    # scaling every score leaves the normalised model unchanged (score ~ normalised score)
    assert relevance_model(FB, 7 * FB_SCORES, OK, RANK, 2) == pytest.approx({0: 0.6, 1: 0.4})
    assert relevance_model(FB[:0], FB_SCORES[:0], OK, RANK, 2) == {}


def test_interpolate_hand_values() -> None:
    rm = {0: 0.6, 1: 0.4}
    # query "x q": q(x) = q(q) = 1/2 ; 0.5 * q + 0.5 * rm
    assert interpolate({0: 1.0, 4: 1.0}, 0, rm, 0.5) == pytest.approx({0: 0.55, 4: 0.25, 1: 0.2})
    # one out-of-vocabulary term counts in the norm: q(x) = q(q) = 1/3
    got = interpolate({0: 1.0, 4: 1.0}, 1, rm, 0.5)
    assert got == pytest.approx({0: 0.5 / 3 + 0.3, 4: 0.5 / 3, 1: 0.2})
    assert interpolate({0: 2.0}, 0, rm, 1.0) == pytest.approx({0: 1.0, 1: 0.0})


CORPUS = [
    "cats purr and cats sleep",
    "felines purr loudly at night",
    "dogs bark at the mailman",
    "the stock market fell",
    "cat food for hungry kittens",
    "market prices of cat food",
    "kittens sleep all day",
    "dogs and cats as pets",
    "bonds and stock prices",
    "a mailman delivers letters",
    "night owls hunt mice",
    "mice fear cats",
]


def test_feedback_filter_and_expanded_scoring_match_bm25() -> None:
    idx = RM3Index(CORPUS, RM3Params(fb_docs=2, fb_terms=3, orig_weight=0.5, max_df=0.2))
    words = idx.words
    df = {w: int(idx.df[i]) for i, w in enumerate(words)}
    assert df["cat"] == 5  # passages 0, 4, 5, 7, 11 (cats / cat, stemmed)
    ok = {w for i, w in enumerate(words) if idx.term_ok[i]}
    assert "cat" not in ok  # 5 / 12 passages > 20%
    assert "purr" in ok and "kitten" in ok  # 2 / 12 <= 20%
    (exp,) = idx.expansions(["cats"])
    # feedback set = BM25's top-2 for "cats"; recompute the model from those two passages
    bm = BM25Index(CORPUS)
    first = bm.scores(["cats"])[0]
    top = np.lexsort((np.arange(len(CORPUS)), -first))[:2]
    rm = relevance_model(idx.counts[top], first[top], idx.term_ok, idx.term_rank, 3)
    assert rm  # non-empty: purr / sleep / food ... survive the filter
    assert exp == pytest.approx(interpolate({bm.model.vocab_dict["cat"]: 1.0}, 0, rm, 0.5))
    # the expanded query scores sum_t w(t) * bm25(t, d)
    want = sum(w * bm.model.get_scores_from_ids([t]) for t, w in exp.items())
    np.testing.assert_allclose(idx.scores([exp])[0], want, rtol=1e-5)
    ids, vals = idx.search(["cats"], k=12)
    pos = want > 0
    assert (ids[0] >= 0).sum() == pos.sum()  # only positive-score passages are listed
    assert set(ids[0][ids[0] >= 0].tolist()) == set(np.flatnonzero(pos).tolist())
    assert np.all(np.diff(vals[0][ids[0] >= 0]) <= 0)
    assert np.all(np.isneginf(vals[0][ids[0] < 0]))


def test_query_without_known_terms_retrieves_nothing() -> None:
    idx = RM3Index(CORPUS)
    ids, vals = idx.search(["zebra unicorn"], k=5)
    assert ids.tolist() == [[-1] * 5]
    assert np.all(np.isneginf(vals))


def test_stopwords_only_corpus_retrieves_nothing() -> None:
    idx = RM3Index(["the", "and of", "is it"])
    ids, vals = idx.search(["what is it"], k=3)
    assert ids.tolist() == [[-1, -1, -1]] and np.all(np.isneginf(vals))


def test_rm3_spec_and_fusion_parsing() -> None:
    s = build_system("bm25+rm3:fb_docs=5,fb_terms=20,orig_weight=0.3,k1=1.2")
    assert isinstance(s, RM3System)
    assert s.params == RM3Params(fb_docs=5, fb_terms=20, orig_weight=0.3)
    assert s.bm25_params.k1 == 1.2
    assert isinstance(build_system("bm25+rm3"), RM3System)
    f = build_system("rrf:bm25+rm3+cosine")
    assert isinstance(f, FusionSystem) and isinstance(f.a, RM3System)
    f2 = build_system("linear-fusion:bm25+rm3:fb_docs=3+cosine:w=0.3")
    assert isinstance(f2, FusionSystem) and f2.a.params.fb_docs == 3 and f2.weight == 0.3
    with pytest.raises(ValueError, match="fb_docs"):
        build_system("bm25+rm3:fb_docs=0")
    with pytest.raises(ValueError, match="not one of"):
        build_system("bm25+rm3:fbdocs=3")


def test_rm3_scores_nfd_and_nfc_queries_alike() -> None:
    nfc, nfd = "caf\u00e9 menu", "cafe\u0301 menu"
    passages = [
        "the caf\u00e9 menu lists espresso",
        "cafe\u0301 opening hours and menu prices",
        "a bakery sells bread",
        "espresso machines for the home",
    ]
    index = RM3Index(passages)
    ids_c, s_c = index.search([nfc], k=4)
    ids_d, s_d = index.search([nfd], k=4)
    assert ids_c.tolist() == ids_d.tolist() and s_c.tolist() == s_d.tolist()
    assert set(ids_c[0, :2].tolist()) == {0, 1}  # both spellings of the passage are found
