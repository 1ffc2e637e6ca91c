"""Multi-probe, multi-assignment and the scoring options of the forest search, against a dense
numpy reference over every passage."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.forest.capacity import assign_capacity
from treerank.forest.index import ForestIndex, ForestSystem, assign_passages
from treerank.forest.model import SCORINGS, Forest, ForestConfig, ForestSearch


def dense_reference(qc, qp, floor, pc, pp, k, scoring):
    """Every (query, passage) pair: per model, the first probed class of the query (descending
    probability) that the passage is indexed in counts once."""
    nq, m, t = qc.shape
    n = pc.shape[0]
    ids = np.full((nq, k), -1, dtype=np.int64)
    keys = np.full((nq, k), -np.inf)
    for i in range(nq):
        count = np.zeros(n, dtype=np.int64)
        sec = np.zeros(n)
        for mm in range(m):
            done = np.zeros(n, dtype=bool)
            for j in range(t):
                hit = (pc[:, mm, :] == qc[i, mm, j]).any(axis=1) & ~done
                pidx = np.nonzero(hit)[0]
                # the passage's probability of that class
                ppv = np.array(
                    [pp[p, mm][pc[p, mm] == qc[i, mm, j]][0] for p in pidx], dtype=np.float64
                )
                if scoring == "shipped":
                    w = float(qp[i, mm, j]) * ppv
                elif scoring == "soft":
                    w = np.full(
                        len(pidx),
                        np.log(max(float(qp[i, mm, j]), 1e-30))
                        - np.log(max(float(floor[i, mm]), 1e-30)),
                    )
                else:
                    w = np.full(len(pidx), float(qp[i, mm, j]))
                count[pidx] += 1
                sec[pidx] += w
                done |= hit
        if scoring == "shipped":
            key = count + sec / (m + 1)
        elif scoring == "count":
            key = count.astype(np.float64)
        else:
            key = sec
        order = np.lexsort((np.arange(n), -key))
        order = order[count[order] > 0][:k]
        ids[i, : len(order)] = order
        keys[i, : len(order)] = key[order]
    return ids, keys


def tables(seed=0, nq=15, n=120, m=5, c=6, t=2, kk=2):
    rng = np.random.default_rng(seed)
    qc = np.stack([rng.permutation(c)[:t] for _ in range(nq * m)]).reshape(nq, m, t)
    qp = np.sort(rng.random((nq, m, t)), axis=-1)[..., ::-1].astype(np.float32)
    floor = (qp[..., -1] * rng.random((nq, m))).astype(np.float32)
    pc = np.stack([rng.permutation(c)[:kk] for _ in range(n * m)]).reshape(n, m, kk)
    pc = pc.astype(np.int32)
    pc[rng.random((n, m)) < 0.1] = -1  # not retrievable for that model
    pc[:, :, 1][rng.random((n, m)) < 0.3] = -1  # fewer than K classes
    pp = rng.random((n, m, kk)).astype(np.float32)
    return qc.astype(np.int32), qp, floor, pc, pp


@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_each_scoring_equals_dense_reference(scoring, seed) -> None:
    qc, qp, floor, pc, pp = tables(seed)
    index = ForestIndex.build(pc, pp, 6)
    hits = index.search_probes(qc, qp, floor, 30, scoring)
    ids, keys = dense_reference(qc, qp, floor, pc, pp, 30, scoring)
    np.testing.assert_array_equal(hits.ids, ids)
    assert hits.keys is not None
    np.testing.assert_allclose(hits.keys, keys, rtol=1e-12, atol=1e-12)
    # scanned = the posting entries of every probed list
    sizes = index.list_sizes()
    expect = sizes[np.arange(5)[None, :, None], qc].sum(axis=(1, 2))
    np.testing.assert_array_equal(hits.scanned, expect)


def test_probe_one_assign_one_equals_todays_search() -> None:
    rng = np.random.default_rng(3)
    qc = rng.integers(0, 7, size=(30, 9)).astype(np.int32)
    qp = rng.random((30, 9)).astype(np.float32)
    pc = rng.integers(-1, 7, size=(200, 9)).astype(np.int32)
    pp = rng.random((200, 9)).astype(np.float32)
    index = ForestIndex.build(pc, pp, 7)
    old = index.search(qc, qp, 50)
    new = index.search_probes(qc[:, :, None], qp[:, :, None], np.zeros_like(qp), 50, "shipped")
    np.testing.assert_array_equal(new.ids, old.ids)
    np.testing.assert_array_equal(new.counts, old.counts)
    np.testing.assert_array_equal(new.scanned, old.scanned)
    # the same float64 key: count + secondary / (M + 1) in one kernel's order of summation
    np.testing.assert_array_equal(new.scores(9), old.scores(9))


def test_forest_system_default_search_is_the_seed() -> None:
    cfg = ForestConfig(6, 5, 8)
    forest = Forest.random(cfg, seed=2)
    rng = np.random.default_rng(0)

    class View:
        queries = rng.standard_normal((20, 8)).astype(np.float32)
        passages = rng.standard_normal((90, 8)).astype(np.float32)

        def iter_passage_chunks(self, size):
            for s in range(0, len(self.passages), size):
                yield s, self.passages[s : s + size]

    base = ForestSystem(forest).retrieve(View(), 40)
    # t = 1 through the probe kernel, K = 1 through the capacity path without a bound
    one = ForestSearch(probe=1, assign=1, scoring="count")
    cnt = ForestSystem(forest.with_search(one)).retrieve(View(), 40)
    assert (base.ids >= 0).sum() == (cnt.ids >= 0).sum()
    qc, qp = forest.query_classes(View.queries)
    pc, pp = forest.passage_classes(View.passages)
    idx = ForestIndex.build(pc, pp, 5)
    np.testing.assert_array_equal(base.ids, idx.search(qc, qp, 40).ids)
    unbounded = forest.with_search(ForestSearch(assign=2, capacity_epsilon=None))
    multi = assign_passages(
        unbounded.with_search(ForestSearch(assign=1, capacity_epsilon=None)), View.passages
    )
    np.testing.assert_array_equal(multi.ids, idx.ids)
    np.testing.assert_array_equal(multi.offsets, idx.offsets)


def test_multi_assignment_respects_capacity() -> None:
    rng = np.random.default_rng(0)
    n, c, kk = 500, 8, 3
    logits = rng.standard_normal((n, c + 1)) * 2
    logits[:, 0] += 3  # class 0 is everyone's favourite
    logits[:, c] -= 2
    probs = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
    nr = probs[:, c] > 0.5
    n_in = int((~nr).sum())
    cap = int(np.ceil(1.1 * kk * n_in / c))
    classes, pp = assign_capacity(probs, kk, cap, 0.5)
    load = np.bincount(classes[classes >= 0], minlength=c)
    assert load.max() <= cap
    assert load[0] == cap  # the favourite filled up
    assert (classes[nr] == -1).all()
    for i in np.nonzero(~nr)[0]:
        row = classes[i][classes[i] >= 0]
        assert len(set(row.tolist())) == len(row)  # distinct classes
        np.testing.assert_array_equal(pp[i][: len(row)], probs[i, row])
    assert (classes[~nr] >= 0).all()  # room enough for everyone's K at 1.1
    # unbounded: plain top-K
    classes_u, _ = assign_capacity(probs, kk, n, 0.5)
    top = np.argsort(-probs[:, :c], axis=1, kind="stable")[:, :kk]
    np.testing.assert_array_equal(classes_u[~nr], top[~nr])


def test_forest_system_multi_assignment_index_is_bounded() -> None:
    cfg = ForestConfig(4, 8, 16, nr_threshold=1.0)
    forest = Forest.random(cfg, seed=0).with_search(ForestSearch(assign=2, capacity_epsilon=0.1))
    x = np.random.default_rng(1).standard_normal((400, 16)).astype(np.float32)
    index = assign_passages(forest, x, chunk_size=64)
    cap = int(np.ceil(1.1 * 2 * 400 / 8))
    assert index.list_sizes().max() <= cap
    assert index.ids.size == 2 * 4 * 400
    st = index.stats()
    assert st["not_retrievable_fraction"] == pytest.approx(0.0)
    assert st["postings_per_passage"] == pytest.approx(8.0)


def test_query_top_first_probe_is_the_argmax_and_floor_is_next() -> None:
    forest = Forest.random(ForestConfig(3, 5, 8), seed=4)
    x = np.random.default_rng(2).standard_normal((25, 8)).astype(np.float32)
    qc, qp = forest.query_classes(x)
    c3, p3, floor = forest.query_top(x, 2)
    np.testing.assert_array_equal(c3[:, :, 0], qc)
    np.testing.assert_allclose(p3[:, :, 0], qp, rtol=1e-6)
    assert (p3[:, :, 0] >= p3[:, :, 1]).all() and (p3[:, :, 1] >= floor).all()
    _, _, f_all = forest.query_top(x, 5)
    assert (f_all == 0).all()
    with pytest.raises(ValueError, match="t must be in"):
        forest.query_top(x, 6)
