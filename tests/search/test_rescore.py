"""Two-stage rescoring: a hand-computed fixture, spec parsing, and real SciFact runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from treerank.models.cosine import CosineScorer
from treerank.search.rescore import (
    RescoreSystem,
    dense_scorer,
    rescore,
    split_params,
)
from treerank.search.run import Run
from treerank.search.specs import (
    BM25Spec,
    CheckpointSpec,
    CosineSpec,
    RescoreSpec,
    build_system,
    parse_spec,
)
from treerank.search.systems import DenseSystem


def test_rescore_hand_computed() -> None:
    q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    p = np.array([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8], [0.5, 0.5]], np.float32)
    cand = np.array([[0, 2, 1], [3, 0, -1]])
    ids, scores = rescore(q, p, cand, k=3)
    # query 0: p1 0.9, p0 0.5, p2 0.2; query 1: p0 and p3 tie at 0.5 -> ascending id; padding last
    np.testing.assert_array_equal(ids, [[1, 0, 2], [0, 3, -1]])
    np.testing.assert_allclose(scores, [[0.9, 0.5, 0.2], [0.5, 0.5, -np.inf]])
    ids2, _ = rescore(q, p, cand, k=1, passage_transform=lambda x: -x)
    np.testing.assert_array_equal(ids2, [[2], [0]])
    with pytest.raises(ValueError, match="candidate ids"):
        rescore(q, p, np.array([[4], [0]]), k=1)


def test_spec_parsing_nests_specs_with_colons() -> None:
    assert split_params("faiss:ivfpq:nlist=64,nprobe=8:depth=50", ("depth", "scorer")) == (
        "faiss:ivfpq:nlist=64,nprobe=8",
        "depth=50",
    )
    node = parse_spec("rescore:faiss:binary:depth=300,scorer=ckpt:runs/a:b")
    assert isinstance(node, RescoreSpec) and node.depth == 300
    assert node.first.render() == "faiss:binary"
    assert node.scorer == CheckpointSpec(Path("runs/a:b"))
    assert parse_spec("rescore:bm25") == RescoreSpec(BM25Spec(), 100, CosineSpec())
    with pytest.raises(ValueError, match="depth"):
        parse_spec("rescore:bm25:depth=x")
    with pytest.raises(ValueError, match="scorer must be cosine, ckpt:<dir> or ce:<dir>"):
        parse_spec("rescore:bm25:scorer=bm25")
    with pytest.raises(ValueError, match="cosine"):
        dense_scorer("bm25")


def test_rescore_reorders_first_stage_exactly(scifact_store) -> None:
    store = scifact_store["test"]
    system = build_system("rescore:bm25:depth=50")
    assert isinstance(system, RescoreSystem)
    bm25 = build_system("bm25").retrieve(store, 50)
    run = system.retrieve(store, 10)
    assert run.ids.shape == (store.n_queries, 10)
    q = CosineScorer().encode_queries(np.asarray(store.queries))
    for i in range(0, store.n_queries, 37):
        pool = bm25.ids[i][bm25.ids[i] >= 0]
        exact = np.asarray(store.passages[pool]) @ q[i]
        order = pool[np.lexsort((pool, -exact))][:10]
        np.testing.assert_array_equal(run.ids[i], order)
        np.testing.assert_allclose(run.scores[i], np.sort(exact)[::-1][:10], rtol=1e-5)


def test_rescore_of_all_passages_is_exact_search(scifact_store) -> None:
    store = scifact_store["test"]

    class Shuffled:
        name = "shuffled"

        def retrieve(self, st, k):  # every passage, in a fixed random order
            rng = np.random.default_rng(0)
            ids = np.stack([rng.permutation(st.n_passages) for _ in range(st.n_queries)])
            return Run(self.name, ids, np.zeros(ids.shape, np.float32))

    run = RescoreSystem(Shuffled(), "cosine", depth=store.n_passages).retrieve(store, 100)
    ref = DenseSystem(CosineScorer()).retrieve(store, 100)
    # one kernel (kernels.topk.pair_scores) computes both sides: equal, not close
    np.testing.assert_array_equal(run.ids, ref.ids)
    np.testing.assert_array_equal(run.scores, ref.scores)


def test_a_nan_candidate_is_refused_not_dropped() -> None:
    from treerank.kernels.topk import NonFiniteVectorError
    from treerank.search.rescore import rescore

    rng = np.random.default_rng(0)
    passages = rng.standard_normal((20, 8)).astype(np.float32)
    passages[7, 3] = np.nan
    q = rng.standard_normal((2, 8)).astype(np.float32)
    ok = rescore(q, passages, np.array([[1, 2, -1], [3, 4, 5]]), 3)
    assert (ok[0][0, :2] >= 0).all() and ok[0][0, 2] == -1
    with pytest.raises(NonFiniteVectorError, match="store-x: passage row 7 holds a non-finite"):
        rescore(q, passages, np.array([[1, 2, -1], [3, 7, 5]]), 3, source="store-x")
    q[1, 0] = np.inf
    with pytest.raises(NonFiniteVectorError, match="query row 1"):
        rescore(q, passages, np.array([[1, 2, -1], [3, 4, 5]]), 3)
