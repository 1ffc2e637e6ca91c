"""Metrics: hand-computed fixtures and parity with ir-measures (pytrec_eval) on real runs."""

from __future__ import annotations

import math

import ir_measures
import numpy as np
import pytest
from ir_measures import RR, R, Success, nDCG

from tests.conftest import SHARED_DATA
from tests.evaluation.dl19 import DL19, load_runs, require_dl19, topic_ids
from treerank.evaluation.trec_io import read_qrels, run_from_dict
from treerank.metrics.metrics import evaluate_run, ndcg_at, parse_metric
from treerank.metrics.qrels import Qrels


def _qrels() -> Qrels:
    # q0: passages 3 (grade 1) and 7 (grade 2); q1: passage 5 (grade 3); q2: nothing relevant
    cand = np.array([[3, 7, -1], [5, 2, -1], [4, -1, -1]], np.int32)
    lab = np.array([[1, 2, 0], [3, 0, 0], [0, 0, 0]], np.uint8)
    return Qrels(cand, lab, relevance_threshold=1)


def test_hand_fixture_values() -> None:
    ids = np.array([[9, 7, 1, 3], [1, 2, 4, 6], [4, 0, 1, 2]])
    r = evaluate_run(ids, _qrels(), ("mrr@10", "ndcg@10", "recall@2", "success@1", "mrr@1"))
    assert r.n_evaluated == 2 and r.n_left_out == 1
    assert np.isnan(r.per_query["mrr@10"][2])
    assert r.per_query["mrr@10"][:2].tolist() == [0.5, 0.0]
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert r.per_query["ndcg@10"][0] == pytest.approx(dcg / idcg, abs=1e-12)
    assert r.per_query["ndcg@10"][1] == 0.0
    assert r.per_query["recall@2"][:2].tolist() == [0.5, 0.0]
    assert r.per_query["success@1"][:2].tolist() == [0.0, 0.0]
    assert r.mean["mrr@10"] == pytest.approx(0.25)


def test_threshold_two_counts_only_high_grades() -> None:
    q = _qrels()
    q2 = Qrels(q.candidates, q.labels, relevance_threshold=2)
    ids = np.array([[3, 7], [5, 1], [4, 0]])
    r = evaluate_run(ids, q2, ("mrr@10", "recall@1", "ndcg@10"))
    assert r.per_query["mrr@10"][:2].tolist() == [0.5, 1.0]  # grade-1 passage 3 is not relevant
    assert r.per_query["recall@1"][:2].tolist() == [0.0, 1.0]
    # nDCG still uses every grade (trec_eval): passage 3 (grade 1) ranked first, 7 (grade 2) second
    assert r.per_query["ndcg@10"][0] == pytest.approx(
        (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    )


def test_exp_gain_and_mrr_beyond_cutoff() -> None:
    g = np.array([[0, 3, 1]])
    ideal = np.array([[3, 1, 0]])
    expected = (7 / math.log2(3) + 1 / 2) / (7 + 1 / math.log2(3))
    assert ndcg_at(g, ideal, 10, gain="exp")[0] == pytest.approx(expected)
    ids = np.array([[*range(20, 30), 3, 7]])  # relevant passages at ranks 11 and 12
    q = Qrels(np.array([[3, 7]]), np.array([[1, 1]]))
    r = evaluate_run(ids, q, ("mrr@10", "recall@12"))
    assert r.mean == {"mrr@10": 0.0, "recall@12": 1.0}


def test_duplicate_judgment_counts_once_and_bad_inputs_fail() -> None:
    q = Qrels(np.array([[4, 4]]), np.array([[1, 2]]))
    assert q.n_relevant().tolist() == [1]
    assert evaluate_run(np.array([[4]]), q, ("ndcg@10",)).mean["ndcg@10"] == 1.0
    with pytest.raises(ValueError, match="repeats"):
        evaluate_run(np.array([[4, 4]]), q)
    with pytest.raises(ValueError, match="bad metric"):
        parse_metric("map")
    with pytest.raises(ValueError, match="queries"):
        evaluate_run(np.array([[1, 2], [3, 4]]), q)


def _parity(judged: dict[str, dict[str, int]], run_dict, qids, pindex, threshold: int) -> None:
    qrels = Qrels.from_dict(judged, qids, pindex, relevance_threshold=threshold)
    for name, ranking in run_dict.items():
        run = run_from_dict(name, ranking, qids, pindex)
        ours = evaluate_run(
            run, qrels, ("mrr@10", "ndcg@10", "recall@100", "recall@1000", "success@10")
        )
        # strictly decreasing scores so trec_eval's re-sort cannot reorder ties
        ir_run = {
            q: {p: float(len(ranking[q]) - r) for r, (p, _) in enumerate(ranking[q])}
            for q in qids
            if q in ranking
        }
        measures = {
            "mrr@10": RR(rel=threshold) @ 10,
            "ndcg@10": nDCG @ 10,
            "recall@100": R(rel=threshold) @ 100,
            "recall@1000": R(rel=threshold) @ 1000,
            "success@10": Success(rel=threshold) @ 10,
        }
        inv = {v: k for k, v in measures.items()}
        ref: dict[str, dict[str, float]] = {m: {} for m in measures}
        for m in ir_measures.iter_calc(list(measures.values()), judged, ir_run):
            ref[inv[m.measure]][m.query_id] = m.value
        checked = 0
        for i, q in enumerate(qids):
            if not ours.evaluated[i]:
                continue
            for m in measures:
                assert ours.per_query[m][i] == pytest.approx(ref[m].get(q, 0.0), abs=1e-6), (
                    name,
                    q,
                    m,
                )
                checked += 1
        assert checked >= 5 * 40


def test_parity_with_ir_measures_on_dl19_runs() -> None:
    require_dl19()
    runs = load_runs()
    judged = read_qrels(DL19 / "qrels.dl19-passage.txt")
    qids = [q for q in topic_ids() if q in judged]
    assert len(qids) == 43
    docids = sorted(
        {p for r in runs.values() for hits in r.values() for p, _ in hits}
        | {p for j in judged.values() for p in j}
    )
    pindex = {p: i for i, p in enumerate(docids)}
    _parity(judged, runs, qids, pindex, threshold=2)
    _parity(judged, {"BM25": runs["BM25"]}, qids, pindex, threshold=1)


def test_parity_with_ir_measures_on_scifact_bm25_run() -> None:
    from treerank.readers.scifact import read_scifact
    from treerank.search.bm25 import BM25Index

    data = SHARED_DATA / "beir-scifact"
    if not (data / "scifact.zip").is_file():
        pytest.skip("SciFact not available")
    split = read_scifact(data / "scifact.zip", "test")
    ids, scores = BM25Index(split.passage_texts).search(split.query_texts, k=100)
    judged = read_qrels(data / "qrels.beir-v1.0.0-scifact.test.txt")
    pindex = {p: i for i, p in enumerate(split.passage_ids)}
    # the reader's candidates/labels are the same judgments as BEIR's qrels file
    from_store = Qrels(split.candidates, split.labels, split.relevance_threshold)
    from_file = Qrels.from_dict(judged, split.query_ids, pindex)
    assert from_store.index()[0].tolist() == from_file.index()[0].tolist()
    ranking = {
        q: [(split.passage_ids[p], 0.0) for p in ids[i]] for i, q in enumerate(split.query_ids)
    }
    _parity(judged, {"bm25": ranking}, split.query_ids, pindex, threshold=1)
    ours = evaluate_run(ids, from_store, ("ndcg@10",))
    assert ours.n_evaluated == 300
    assert abs(ours.mean["ndcg@10"] - 0.676) < 0.02  # Anserini's BEIR SciFact BM25 flat
