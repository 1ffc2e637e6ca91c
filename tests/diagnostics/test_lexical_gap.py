"""Lexical-gap diagnostic: idf coverage by hand on the tiny store, buckets, table and plot."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.diagnostics.lexical_gap import (
    bucket_of,
    idf_coverage,
    lexical_gap,
    lexical_gap_markdown,
    lucene_idf,
    plot_lexical_gap,
    store_coverage,
)

# Tiny store (tests/search/tiny_store.py), N = 8 passages, BM25 tokens (stemmed, no stopwords):
# q0 "cats purr softly" -> cat, purr, soft ; relevant p1 "a cat purrs ..." (grade 2) and
# p5 "cats and dogs are pets" (grade 1). df(cat) = 2 (p1, p5), df(purr) = 1, df(soft) = 0.
IDF_CAT, IDF_PURR, IDF_SOFT = math.log(1 + 6.5 / 2.5), math.log(1 + 7.5 / 1.5), math.log(18)
TOTAL = IDF_CAT + IDF_PURR + IDF_SOFT


def test_lucene_idf() -> None:
    np.testing.assert_allclose(lucene_idf(np.array([2, 1, 0]), 8), [IDF_CAT, IDF_PURR, IDF_SOFT])


def test_store_coverage_hand_values(tmp_path: Path) -> None:
    cov = store_coverage(write_tiny_store(tmp_path / "test"))
    # q0: p1 covers cat + purr, p5 covers cat; mean over the two relevant passages
    assert cov[0] == pytest.approx(((IDF_CAT + IDF_PURR) + IDF_CAT) / 2 / TOTAL)
    # q1 "dogs bark loudly" / p0 "the dog barked loudly at night": every term; q2, q3 likewise
    assert cov[1:].tolist() == pytest.approx([1.0, 1.0, 1.0])
    # relevance threshold 2: only p1 is relevant to q0; q1-q3 have no relevant passage
    cov2 = store_coverage(write_tiny_store(tmp_path / "t2", threshold=2))
    assert cov2[0] == pytest.approx((IDF_CAT + IDF_PURR) / TOTAL)
    assert np.isnan(cov2[1:]).all()


def test_idf_coverage_edge_cases() -> None:
    df = {"a": 1, "b": 3}
    got = idf_coverage([["a", "a", "b"], [], ["a"]], [{"a"}, {"b"}], df, 4, [[0, 1], [0], []])
    ia, ib = math.log(1 + 3.5 / 1.5), math.log(1 + 1.5 / 3.5)
    assert got[0] == pytest.approx((ia + ib) / 2 / (ia + ib))  # repeats ignored: 0.5
    assert np.isnan(got[1]) and np.isnan(got[2])  # no term; no relevant passage
    # a judged passage absent from the corpus (id past the last passage, as Qrels keys it) has
    # no text: skipped, so query 0 is scored on passage 0 alone, query 1 has nothing left
    got = idf_coverage([["a", "b"], ["b"]], [{"a"}, {"b"}], df, 4, [[0, 7], [5]])
    assert got[0] == pytest.approx(ia / (ia + ib)) and np.isnan(got[1])


def test_buckets_histogram_table_and_plot(tmp_path: Path) -> None:
    cov = np.array([0.0, 0.3, 0.3, 0.99, 1.0, np.nan, 0.6])
    assert bucket_of(cov).tolist() == [0, 1, 1, 3, 4, -1, 2]
    per_query = {
        "bm25": {"ndcg@10": np.array([0.0, 0.2, 0.4, 0.9, 1.0, 0.5, np.nan])},
        "cosine": {"ndcg@10": np.array([0.6, 0.5, 0.7, 0.8, 0.9, 0.1, np.nan])},
    }
    doc = lexical_gap(cov, per_query)
    rows = {r["bucket"]: r for r in doc["buckets"]}
    assert [r["n"] for r in doc["buckets"]] == [1, 2, 0, 1, 1]  # query 6 is not evaluated
    assert rows["[0.25, 0.50)"]["systems"] == pytest.approx({"bm25": 0.3, "cosine": 0.6})
    assert rows["[0.50, 0.75)"]["systems"] == {"bm25": None, "cosine": None}
    assert doc["n_no_coverage"] == 1 and doc["n_queries"] == 6
    assert doc["mean_coverage"] == pytest.approx((0.0 + 0.3 + 0.3 + 0.99 + 1.0) / 5)
    md = lexical_gap_markdown(doc)
    assert "| [0.25, 0.50) | 2 | 0.3000 | 0.6000 |" in md and "| 1 | 1 | 1.0000 | 0.9000 |" in md
    assert plot_lexical_gap(doc, tmp_path / "gap.png").stat().st_size > 0
