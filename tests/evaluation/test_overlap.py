from types import SimpleNamespace

import numpy as np
import pytest

from treerank.evaluation.overlap import overlap_breakdown, overlap_markdown, seen_positive_mask


def _store(cands: list[list[int]], labels: list[list[int]], pids: list[str], thr: int = 1):
    return SimpleNamespace(
        candidates=np.array(cands, dtype=np.int32),
        labels=np.array(labels, dtype=np.uint8),
        passage_ids=lambda: pids,
        relevance_threshold=thr,
    )


def test_seen_mask_matches_by_source_id_not_row() -> None:
    # train: query 0 cites doc "a"; query 1 cites "b" with grade 1 (below threshold 2: not relevant)
    train = _store([[0, -1], [1, -1]], [[2, 0], [1, 0]], ["a", "b"], thr=2)
    # eval rows differ from train rows: "a" is row 2 here
    ev = _store([[2, 0], [1, -1], [0, -1]], [[2, 0], [2, 0], [3, 0]], ["b", "c", "a"], thr=2)
    assert seen_positive_mask(ev, train).tolist() == [True, False, False]


def test_breakdown_means_and_deltas_by_hand() -> None:
    pq = {
        "cosine": {"ndcg@10": np.array([0.5, 0.5, 0.2, 0.4])},
        "head": {"ndcg@10": np.array([1.0, 0.9, 0.2, 0.3])},
    }
    seen = np.array([True, True, False, False])
    doc = overlap_breakdown(pq, seen, "cosine", ["ndcg@10"], n_permutations=200)
    assert (doc["n_seen"], doc["n_unseen"]) == (2, 2)
    s, u = doc["parts"]["seen"], doc["parts"]["unseen"]
    assert s["head"]["ndcg@10"]["mean"] == pytest.approx(0.95)
    assert s["head"]["ndcg@10"]["delta"] == pytest.approx(0.45)
    assert u["head"]["ndcg@10"]["mean"] == pytest.approx(0.25)
    assert u["head"]["ndcg@10"]["delta"] == pytest.approx(-0.05)
    assert "delta" not in s["cosine"]["ndcg@10"]
    md = overlap_markdown(doc, "ndcg@10", "cosine")
    assert "| head | 0.9500 (+0.4500" in md and "0.2500 (-0.0500" in md
    with pytest.raises(KeyError, match="bm25"):
        overlap_breakdown(pq, seen, "bm25", ["ndcg@10"])
