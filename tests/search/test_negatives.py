import json
from pathlib import Path

import numpy as np
import pytest

from treerank.search.bm25 import BM25Index
from treerank.search.negatives import drop_labelled, mine_bm25_negatives

PASSAGES = [
    "vitamin d deficiency increases the risk of bone fractures",  # 0 gold for q0
    "bone fractures in the elderly and vitamin d supplements",  # 1 hard negative for q0
    "the stock market fell sharply on monday",  # 2
    "insulin resistance is linked to type two diabetes",  # 3 gold for q1
    "diabetes treatment with insulin pumps",  # 4 hard negative for q1
    "football results from the weekend",  # 5
]
QUERIES = ["vitamin d and bone fractures", "insulin resistance diabetes"]


class TextStore:
    """The store attributes mining reads, with sidecar arrays in a temp directory."""

    def __init__(self, root: Path):
        self.path = root
        self.candidates = np.array([[0, -1], [3, -1]], dtype=np.int32)
        self.labels = np.array([[1, 0], [1, 0]], dtype=np.uint8)

    def passage_texts(self):
        return PASSAGES

    def query_texts(self):
        return QUERIES

    def save_array(self, name, arr, meta=None):
        np.save(self.path / f"{name}.npy", arr)
        (self.path / f"{name}.json").write_text(json.dumps(meta))

    def has_array(self, name):
        return (self.path / f"{name}.npy").exists()

    def load_array(self, name):
        return np.load(self.path / f"{name}.npy") if self.has_array(name) else None

    def load_array_meta(self, name):
        p = self.path / f"{name}.json"
        return json.loads(p.read_text()) if p.exists() else None


def test_drop_labelled_keeps_rank_positions():
    ranked = np.array([[0, 1, 2], [4, 3, 5]])
    cand = np.array([[0, -1], [3, 4]], dtype=np.int32)
    lab = np.array([[1, 0], [2, 0]], dtype=np.uint8)  # q1: 4 is judged non-relevant (grade 0)
    out = drop_labelled(ranked, cand, lab)
    assert out.tolist() == [[-1, 1, 2], [4, -1, 5]]
    assert out.dtype == np.int32
    scores = np.array([[3.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    assert drop_labelled(ranked, cand, lab, scores).tolist() == [[-1, 1, -1], [4, -1, 5]]
    with pytest.raises(ValueError, match="one row per query"):
        drop_labelled(ranked[:1], cand, lab)


def test_mine_bm25_negatives_matches_bm25_ranking(tmp_path):
    store = TextStore(tmp_path)
    neg = mine_bm25_negatives(store, depth=4)
    ids, scores = BM25Index(PASSAGES).search(QUERIES, k=4)
    # same ranking as BM25 itself, gold removed, zero-score passages removed
    want = np.where((ids == store.candidates[:, :1]) | (scores <= 0), -1, ids)
    assert neg.tolist() == want.tolist()
    # the lexical near-misses are the hard negatives (q0's even outranks its gold passage);
    # gold passages and passages sharing no term with the query are blanked, ranks kept
    assert neg.tolist() == [[1, -1, -1, -1], [-1, 4, -1, -1]]
    meta = store.load_array_meta("bm25_negatives")
    assert meta["depth"] == 4 and meta["source"] == "bm25"
    # reused when settings match (the file is not rewritten)
    mtime = (tmp_path / "bm25_negatives.npy").stat().st_mtime_ns
    again = mine_bm25_negatives(store, depth=4)
    assert np.array_equal(again, neg)
    assert (tmp_path / "bm25_negatives.npy").stat().st_mtime_ns == mtime
