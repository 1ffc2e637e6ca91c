"""TREC DL 2019 pool: union of runs' hits, REP_LLAMA text last, graded labels equal the qrels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treerank.readers.dl19 import read_trec_dl_pool
from treerank.readers.trec import read_trec_qrels, read_trec_topics


@pytest.fixture(scope="module")
def split(dl19_dir):
    return read_trec_dl_pool(dl19_dir)


def test_counts(split, dl19_dir):
    assert split.n_queries == 43
    assert split.meta["n_pool_docids"] == 14581
    # one pair of docids carries byte-identical text: dedup by text folds it (store rule)
    assert split.n_passages == 14580
    assert len(split.passage_aliases) == 14581
    assert int((split.candidates >= 0).sum()) == 4337
    assert split.relevance_threshold == 2
    assert split.query_ids == [q for q, _ in read_trec_topics(dl19_dir / "topics.dl19-passage.txt")]


def test_labels_equal_qrels(split, dl19_dir):
    qrels = read_trec_qrels(dl19_dir / "qrels.dl19-passage.txt")
    assert len(qrels) == 9260
    want = {(q, d): g for q, d, g in qrels if d in split.passage_aliases}
    got = {}
    for i, row in enumerate(split.candidates):
        for j in np.flatnonzero(row >= 0):
            got[(split.query_ids[i], split.passage_ids[row[j]])] = int(split.labels[i, j])
    # the folded docid pair maps onto one passage id: compare through the aliases
    want_by_pid = {}
    for (q, d), g in want.items():
        key = (q, split.passage_ids[split.passage_aliases[d]])
        want_by_pid[key] = max(g, want_by_pid.get(key, 0))
    assert got == want_by_pid
    assert np.bincount(split.labels[split.candidates >= 0]).tolist() == [1592, 956, 1300, 489]


def test_rep_llama_text_is_last_resort(split, dl19_dir):
    def texts(run):
        data = json.loads(
            (dl19_dir / "retrieve_results" / run / "retrieve_results_dl19.json").read_text()
        )
        return {h["docid"]: h["content"] for e in data for h in e["hits"]}

    rep, bm25 = texts("REP_LLAMA"), texts("BM25")
    differing = [d for d in rep if d in bm25 and rep[d] != bm25[d]]
    assert differing, "REP_LLAMA should differ in white space for some hits"
    for d in differing[:50]:
        assert split.passage_texts[split.passage_aliases[d]] == bm25[d]
