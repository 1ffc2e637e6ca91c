"""--limit / --max-passages: labelled passages of kept queries always survive, ids remapped."""

from __future__ import annotations

import numpy as np

from treerank.readers.scifact import read_scifact
from treerank.readers.subset import subset_split


def test_subset_keeps_labels_exact(scifact_zip):
    full = read_scifact(scifact_zip, "test")
    s = subset_split(full, limit=20, max_passages=100)
    assert s.n_queries == 20 and s.n_passages == 100
    for i in range(20):
        got = {
            (s.passage_ids[p], int(g))
            for p, g in zip(s.candidates[i], s.labels[i], strict=True)
            if p >= 0
        }
        want = {
            (full.passage_ids[p], int(g))
            for p, g in zip(full.candidates[i], full.labels[i], strict=True)
            if p >= 0
        }
        assert got == want
    # original order kept; the first non-candidate passages fill the remaining room
    order = [full.passage_ids.index(p) for p in s.passage_ids]
    assert order == sorted(order)
    assert s.passage_ids[0] == full.passage_ids[0]
    assert s.k == int((s.candidates >= 0).sum(axis=1).max())


def test_limit_alone_keeps_corpus(scifact_zip):
    full = read_scifact(scifact_zip, "train")
    s = subset_split(full, limit=5)
    assert s.n_queries == 5 and s.n_passages == full.n_passages
    np.testing.assert_array_equal(s.candidates, full.candidates[:5, : s.k])
    assert subset_split(full) is full


def test_cap_below_labelled_keeps_all_labelled(scifact_zip):
    full = read_scifact(scifact_zip, "test")
    s = subset_split(full, limit=10, max_passages=1)
    assert s.n_passages == len(np.unique(full.candidates[:10][full.candidates[:10] >= 0]))
