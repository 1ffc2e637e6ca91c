"""Scoring against the source's own qrels: de-duplicated passages expand into all their source
ids, judged ids absent from the corpus count relevant and not retrieved (issue 10, item 6)."""

from __future__ import annotations

import ir_measures
import numpy as np
import pytest
from ir_measures import RR, R, nDCG

from treerank.evaluation.trec_io import write_trec_run
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.search.run import Run

# passages: 0 = "p100", 1 = "p200" (also source id "p400": identical text), 2 = "p300"
PASSAGE_IDS = ["p100", "p200", "p300"]
ALIASES = {"p100": 0, "p200": 1, "p400": 1, "p300": 2}


def _ir(path, qrels: dict[str, dict[str, int]], measures) -> dict[tuple[str, str], float]:
    run = list(ir_measures.read_trec_run(str(path)))
    return {
        (m.query_id, str(m.measure)): m.value for m in ir_measures.iter_calc(measures, qrels, run)
    }


def test_alias_judged_scores_on_the_expanded_ranking(tmp_path) -> None:
    # the case: p200 and p400 share a text, qrels "q1 p400 1"; the run ranks that passage
    # first. Before, treerank reported MRR 1.0 while its run file scored 0.0.
    judgments = [("q1", "p400", 1), ("q2", "p100", 1), ("q2", "p999", 2)]
    qrels = Qrels.from_source(judgments, ["q1", "q2"], PASSAGE_IDS, ALIASES)
    assert qrels.doc_ids == ["p100", "p200", "p400", "p300", "p999"]
    assert qrels.expansion is not None and qrels.expansion.tolist() == [0, 1, 3, 4]
    assert qrels.departures == {
        "judgments_on_documents_absent_from_corpus": 1,
        "relevant_judgments_on_documents_absent_from_corpus": 1,
        "duplicate_documents_merged": 1,
    }
    run = Run(
        "r", np.array([[1, 0, 2], [0, 2, -1]]), np.array([[0.9, 0.5, 0.1], [0.8, 0.7, -np.inf]])
    )
    ids, scores = qrels.expand(run.ids, run.scores)
    assert ids.tolist() == [[1, 2, 0, 3], [0, 3, -1, -1]]
    assert scores is not None and scores[0].tolist() == pytest.approx([0.9, 0.9, 0.5, 0.1])
    res = evaluate_run(run.ids, qrels, ("mrr@10", "recall@10", "ndcg@10"))
    # q1: p200 at rank 1, p400 (relevant) at rank 2 -> RR 1/2
    assert res.per_query["mrr@10"].tolist() == [0.5, 1.0]
    # q2: p100 (grade 1) found at rank 1, p999 (grade 2) is not in the corpus: recall 1/2,
    # nDCG = (1 / log2 2) / (2 / log2 2 + 1 / log2 3)
    assert res.per_query["recall@10"].tolist() == [1.0, 0.5]
    assert res.per_query["ndcg@10"][1] == pytest.approx(1.0 / (2.0 + 1.0 / np.log2(3.0)))
    # the written run file scored by ir-measures against the source qrels gives the same values
    path = write_trec_run(tmp_path / "r.trec", Run("r", ids, scores), ["q1", "q2"], qrels.doc_ids)
    lines = path.read_text().splitlines()
    assert [ln.split()[2] for ln in lines[:4]] == ["p200", "p400", "p100", "p300"]
    tie = [np.float32(float(ln.split()[4])) for ln in lines[:2]]
    assert tie[0] > tie[1]  # a tie is written strictly decreasing, as float32 (trec_eval)
    src = {"q1": {"p400": 1}, "q2": {"p100": 1, "p999": 2}}
    ref = _ir(path, src, [RR @ 10, R @ 10, nDCG @ 10])
    for i, q in enumerate(["q1", "q2"]):
        assert res.per_query["mrr@10"][i] == pytest.approx(ref[(q, "RR@10")])
        assert res.per_query["recall@10"][i] == pytest.approx(ref[(q, "R@10")])
        assert res.per_query["ndcg@10"][i] == pytest.approx(ref[(q, "nDCG@10")])


def test_query_judged_only_on_absent_documents_scores_zero() -> None:
    qrels = Qrels.from_source([("q1", "gone", 1)], ["q1"], PASSAGE_IDS, ALIASES)
    res = evaluate_run(np.array([[0, 1, 2]]), qrels, ("mrr@10", "recall@100"))
    assert res.n_evaluated == 1 and res.mean == {"mrr@10": 0.0, "recall@100": 0.0}


def test_without_duplicates_ids_are_passage_ids() -> None:
    qrels = Qrels.from_source([("q1", "b", 1)], ["q1"], ["a", "b"], {"a": 0, "b": 1})
    assert qrels.expansion is None and qrels.doc_ids == ["a", "b"]
    ids = np.array([[1, 0]])
    assert qrels.expand(ids)[0] is ids
    assert evaluate_run(ids, qrels, ("mrr@10",)).mean["mrr@10"] == 1.0
