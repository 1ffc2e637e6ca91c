"""The evaluation on real embedded stores (shared cached-store fixtures from tests/conftest.py)."""

from __future__ import annotations

import faiss
import numpy as np

from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings
from treerank.metrics.qrels import Qrels


def test_scifact_test_published_baselines(scifact_store, tmp_path) -> None:
    store = scifact_store["test"]
    assert (store.n_queries, store.n_passages) == (300, 5183)
    comp = compare_systems(
        store,
        ["cosine", "bm25"],
        settings=EvaluationSettings(baseline="cosine", k=1000, n_permutations=500),
        out_dir=tmp_path,
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


def test_dl19_store_scored_against_the_source_qrels(dl19_store) -> None:
    # the store keeps the source's judgments: DL19's unpooled judged passages are counted
    # relevant and never retrieved (parity with trec_eval: test_trec_eval_parity.py)
    store = dl19_store["test"]
    assert store.relevance_threshold == 2
    qrels = Qrels.from_store(store)
    src = store.source_qrels()
    assert src is not None and qrels.doc_ids is not None
    assert len(qrels.doc_ids) > store.n_passages  # judged ids outside the pool
    pooled = Qrels(np.asarray(store.candidates), np.asarray(store.labels), 2)
    assert (qrels.n_relevant() >= pooled.n_relevant()).all()
    assert qrels.n_relevant().sum() == sum(1 for _, _, g in src if g >= 2)
