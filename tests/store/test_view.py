"""`QuerySubset`: metrics on a subset of a split's queries equal trec_eval on those queries.

Real data: the SciFact test split (judgments from its candidate tables) and the DL19 subset
(judgments from the source's ``qrels.tsv``, read for the whole split and kept for the view's
queries only). The reference is ir-measures on the run files ``compare_systems`` wrote for the
view and the source's original qrels file.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.evaluation.test_trec_eval_parity import assert_trec_eval_parity
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings
from treerank.metrics.qrels import Qrels
from treerank.store.view import QuerySubset


def test_subset_metrics_equal_trec_eval_on_its_queries(scifact_store, shared_data, tmp_path):
    store = scifact_store["test"]
    rows = np.arange(3, store.n_queries, 7)[::-1].copy()  # 43 queries, in reverse order
    view = QuerySubset(store, rows)
    comp = compare_systems(
        view,
        ["cosine", "bm25"],
        settings=EvaluationSettings(baseline="cosine", n_permutations=10),
        out_dir=tmp_path,
    )
    qrels_file = shared_data / "beir-scifact" / "qrels.beir-v1.0.0-scifact.test.txt"
    assert assert_trec_eval_parity(comp, tmp_path, qrels_file, view.query_ids()) == rows.size
    # the view's rows are exactly the full split's rows for those queries
    full = compare_systems(
        store, ["cosine"], settings=EvaluationSettings(baseline="cosine", n_permutations=10)
    )
    ours = comp.results["cosine"].per_query["ndcg@10"]
    np.testing.assert_array_equal(ours, full.results["cosine"].per_query["ndcg@10"][rows])


def test_subset_of_a_store_with_source_qrels(dl19_store, dl19_dir, tmp_path) -> None:
    store = dl19_store["test"]
    rows = np.array([7, 2, 5])
    view = QuerySubset(store, rows)
    qrels = Qrels.from_store(view)
    assert qrels.n_queries == 3  # only the view's queries, from the split's qrels.tsv
    comp = compare_systems(
        view,
        ["bm25", "cosine"],
        settings=EvaluationSettings(baseline="bm25", n_permutations=10),
        out_dir=tmp_path,
    )
    qrels_file = dl19_dir / "qrels.dl19-passage.txt"
    assert assert_trec_eval_parity(comp, tmp_path, qrels_file, view.query_ids()) == 3


def test_views_never_share_a_memoised_run(scifact_store) -> None:
    from treerank.search.specs import build_system

    store = scifact_store["test"]
    bm25 = build_system("bm25")
    a = bm25.retrieve(QuerySubset(store, np.array([0, 1])), 5)
    b = bm25.retrieve(QuerySubset(store, np.array([2, 3])), 5)  # same path, maybe the same id()
    assert a.ids.tolist() != b.ids.tolist()
    assert b.ids.tolist() == bm25.retrieve(store, 5).ids[2:4].tolist()


def test_rows_out_of_range(scifact_store) -> None:
    with pytest.raises(ValueError, match=r"query rows out of \[0, 300\)"):
        QuerySubset(scifact_store["test"], np.array([0, 300]))
