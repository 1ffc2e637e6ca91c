"""The evaluation on real embedded stores (shared cached-store fixtures from tests/conftest.py)."""

from __future__ import annotations

import faiss
import ir_measures
import numpy as np
import pytest
from ir_measures import RR, R, nDCG

from treerank.evaluation.compare import compare_systems
from treerank.evaluation.qrels import Qrels


def test_scifact_test_published_baselines(scifact_store, tmp_path) -> None:
    store = scifact_store["test"]
    assert (store.n_queries, store.n_passages) == (300, 5183)
    comp = compare_systems(
        store, ["cosine", "bm25"], baseline="cosine", k=1000, out_dir=tmp_path, n_permutations=500
    )
    # published nDCG@10 on the full corpus: all-MiniLM-L6-v2 0.645; BM25 0.665 (BEIR) - 0.676
    assert abs(comp.mean("cosine", "ndcg@10") - 0.645) < 0.02
    assert 0.665 - 0.02 < comp.mean("bm25", "ndcg@10") < 0.676 + 0.02
    assert comp.results["cosine"].n_left_out == 0
    # the cosine run is FAISS IndexFlatIP's on the stored vectors
    q, p = np.asarray(store.queries), np.asarray(store.passages)
    index = faiss.IndexFlatIP(p.shape[1])
    index.add(p / np.linalg.norm(p, axis=1, keepdims=True))
    ref_s, ref_i = index.search(q / np.linalg.norm(q, axis=1, keepdims=True), 10)
    run = comp.runs["cosine"]
    np.testing.assert_allclose(run.scores[:, :10], ref_s, atol=1e-5)
    assert (run.ids[:, :10] == ref_i).mean() > 0.999


def test_dl19_store_graded_parity(dl19_store) -> None:
    store = dl19_store["test"]
    assert store.relevance_threshold == 2
    qrels = Qrels.from_store(store)
    qids, pids = store.query_ids(), store.passage_ids()
    judged: dict[str, dict[str, int]] = {}
    for i, q in enumerate(qids):
        judged[q] = {
            pids[c]: int(g)
            for c, g in zip(store.candidates[i], store.labels[i], strict=True)
            if c >= 0
        }
    comp = compare_systems(
        store, ["cosine", "bm25", "rrf:bm25+cosine"], baseline="bm25", n_permutations=200
    )
    for name, run in comp.runs.items():
        ir_run = {
            q: {pids[p]: float(run.k - r) for r, p in enumerate(run.ids[i]) if p >= 0}
            for i, q in enumerate(qids)
        }
        ref = {
            (m.query_id, str(m.measure)): m.value
            for m in ir_measures.iter_calc(
                [RR(rel=2) @ 10, nDCG @ 10, R(rel=2) @ 100], judged, ir_run
            )
        }
        res = comp.results[name]
        for i, q in enumerate(qids):
            if not res.evaluated[i]:
                continue
            assert res.per_query["mrr@10"][i] == pytest.approx(ref[(q, "RR(rel=2)@10")], abs=1e-6)
            assert res.per_query["ndcg@10"][i] == pytest.approx(ref[(q, "nDCG@10")], abs=1e-6)
            assert res.per_query["recall@100"][i] == pytest.approx(
                ref[(q, "R(rel=2)@100")], abs=1e-6
            )
    assert qrels.n_relevant().min() >= 0
