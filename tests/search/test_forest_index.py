"""Forest inverted lists and search: brute-force parity, ties, adding passages."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from treerank.forest.index import (
    ForestHits,
    ForestIndex,
    ForestSystem,
    build_inverted_lists,
    class_entropy,
)
from treerank.forest.model import Forest, ForestConfig


def brute_force(qc, qp, pc, pp, k):
    """Reference: full (nq, n) match-count and secondary matrices, lexsorted per query."""
    match = (qc[:, None, :] == pc[None, :, :]) & (pc[None, :, :] >= 0)  # (nq, n, M)
    counts = match.sum(-1)
    sec = np.where(match, qp[:, None, :].astype(np.float64) * pp[None, :, :], 0.0).sum(-1)
    ids = np.full((len(qc), k), -1)
    for i in range(len(qc)):
        order = np.lexsort((np.arange(pc.shape[0]), -sec[i], -counts[i]))
        order = order[counts[i, order] > 0][:k]
        ids[i, : len(order)] = order
    return ids, counts, sec


# ---- Reference: the pre-kernel scipy path (dense (B, n) counts, partition over every passage),
# kept verbatim so that the compiled kernel is checked to return exactly its ranking.
def posting_matrices(
    offsets: np.ndarray, ids: np.ndarray, list_probs: np.ndarray, n_passages: int
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The CSR index as two sparse ``(M*C, n_passages)`` matrices sharing its ``ids``.

    Returns:
        ``(ones float32, probs float64)``: entry ``(l, p)`` is 1 / ``P_m(c | p)`` when passage
        ``p`` is in list ``l = m * C + c``.
    """
    n_lists = len(offsets) - 1
    indptr = offsets.astype(np.int32) if offsets[-1] < 2**31 else offsets
    ones = sp.csr_matrix(
        (np.ones(ids.size, np.float32), ids, indptr), shape=(n_lists, n_passages), copy=False
    )
    probs = sp.csr_matrix(
        (np.asarray(list_probs, np.float64), ids, indptr), shape=(n_lists, n_passages), copy=False
    )
    return ones, probs


def match_scores(
    postings: tuple[sp.csr_matrix, sp.csr_matrix],
    query_classes: np.ndarray,
    query_probs: np.ndarray,
    n_classes: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Match counts and secondary scores of a block of queries against every passage.

    A query is a sparse one-hot row over the ``M * C`` lists (one list per model), so the
    accumulation over its ``M`` inverted lists is one sparse x sparse product (scipy's compiled
    CSR kernel): it touches exactly the ``~ M * n / C`` posting entries of the query's lists.

    Args:
        postings: from :func:`posting_matrices`.
        query_classes: ``int (B, M)`` query classes in ``[0, C)``.
        query_probs: ``float32 (B, M)`` their probabilities.
        n_classes: C.

    Returns:
        ``(counts int32 (B, n_passages), secondary float64 (B, n_passages))``; ``secondary =
        sum over matching models of P_m(c | q) * P_m(c | p)``.
    """
    b, m = query_classes.shape
    n_lists = postings[0].shape[0]
    cols = (np.arange(m, dtype=np.int64)[None, :] * n_classes + query_classes).ravel()
    indptr = np.arange(0, b * m + 1, m, dtype=np.int64)
    q_ones = sp.csr_matrix((np.ones(b * m, np.float32), cols, indptr), shape=(b, n_lists))
    q_probs = sp.csr_matrix(
        (np.asarray(query_probs, np.float64).ravel(), cols, indptr), shape=(b, n_lists)
    )
    counts = (q_ones @ postings[0]).toarray().astype(np.int32)
    secondary = (q_probs @ postings[1]).toarray()
    return counts, secondary


def topk_lexicographic(
    counts: np.ndarray, secondary: np.ndarray, k: int, n_models: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top ``k`` passages per row by (count desc, secondary desc, passage id asc).

    Args:
        counts: ``int (B, n)`` match counts.
        secondary: ``float64 (B, n)`` secondary scores, ``0 <= secondary <= counts``.
        k: depth.
        n_models: M (to fold the two keys into one exact float64 key).

    Returns:
        ``(ids int64 (B, k), counts int32 (B, k), secondary float64 (B, k))``; rows padded with
        ``-1`` / ``0`` / ``0.0`` past the passages with at least one match.
    """
    bsz, n = counts.shape
    out_ids = np.full((bsz, k), -1, dtype=np.int64)
    out_counts = np.zeros((bsz, k), dtype=np.int32)
    out_sec = np.zeros((bsz, k), dtype=np.float64)
    kk = min(k, n)
    if kk == 0 or bsz == 0:
        return out_ids, out_counts, out_sec
    key = counts + secondary / (n_models + 1)
    thr = -np.partition(-key, kk - 1, axis=1)[:, kk - 1]
    gt = key > thr[:, None]
    eq = key == thr[:, None]
    need = kk - gt.sum(axis=1)
    take = gt | (eq & (np.cumsum(eq, axis=1) <= need[:, None]))
    cols = np.nonzero(take)[1].reshape(bsz, kk)
    sel_key = np.take_along_axis(key, cols, axis=1)
    order = np.lexsort((cols, -sel_key), axis=-1)
    cols = np.take_along_axis(cols, order, axis=1)
    c = np.take_along_axis(counts, cols, axis=1)
    s = np.take_along_axis(secondary, cols, axis=1)
    hit = c > 0
    out_ids[:, :kk] = np.where(hit, cols, -1)
    out_counts[:, :kk] = np.where(hit, c, 0)
    out_sec[:, :kk] = np.where(hit, s, 0.0)
    return out_ids, out_counts, out_sec


def scipy_search(index, qc, qp, k):
    postings = posting_matrices(index.offsets, index.ids, index.probs, index.n_passages)
    counts, sec = match_scores(postings, qc, qp, index.n_classes)
    return topk_lexicographic(counts, sec, k, index.n_models)


def random_tables(seed=0, nq=40, n=300, m=12, c=6, nr=0.15):
    rng = np.random.default_rng(seed)
    qc = rng.integers(0, c, size=(nq, m)).astype(np.int32)
    qp = rng.random((nq, m)).astype(np.float32)
    pc = rng.integers(0, c, size=(n, m)).astype(np.int32)
    pc[rng.random((n, m)) < nr] = -1
    pp = np.where(pc >= 0, rng.random((n, m)), 0).astype(np.float32)
    return qc, qp, pc, pp, c


def test_build_inverted_lists_hand_fixture() -> None:
    classes = np.array([[0, 1], [1, -1], [0, 0]])
    probs = np.array([[0.9, 0.8], [0.7, 0.0], [0.6, 0.5]], dtype=np.float32)
    off, ids, pr = build_inverted_lists(classes, probs, n_classes=2)
    # lists: (m0,c0)=[0,2] (m0,c1)=[1] (m1,c0)=[2] (m1,c1)=[0]
    np.testing.assert_array_equal(off, [0, 2, 3, 4, 5])
    np.testing.assert_array_equal(ids, [0, 2, 1, 2, 0])
    np.testing.assert_allclose(pr, [0.9, 0.6, 0.7, 0.5, 0.8])
    with pytest.raises(ValueError, match="classes must lie"):
        build_inverted_lists(np.array([[2]]), np.array([[1.0]]), n_classes=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_equals_brute_force_match_count(seed) -> None:
    qc, qp, pc, pp, c = random_tables(seed)
    index = ForestIndex.build(pc, pp, c)
    k = pc.shape[0]
    hits = index.search(qc, qp, k)
    ref_ids, counts, sec = brute_force(qc, qp, pc, pp, k)
    np.testing.assert_array_equal(hits.ids, ref_ids)
    for i in range(len(qc)):
        got = hits.ids[i][hits.ids[i] >= 0]
        np.testing.assert_array_equal(hits.counts[i, : len(got)], counts[i, got])
        np.testing.assert_allclose(hits.secondary[i, : len(got)], sec[i, got], rtol=1e-12)
    # truncated depth = prefix of the full ranking
    np.testing.assert_array_equal(index.search(qc, qp, 10).ids, ref_ids[:, :10])


def test_search_small_blocks_equal_one_block(monkeypatch) -> None:
    qc, qp, pc, pp, c = random_tables(5)
    index = ForestIndex.build(pc, pp, c)
    one = index.search(qc, qp, 25)
    import treerank.forest.index as fi

    monkeypatch.setattr(fi, "_QUERY_BLOCK", 1)  # one query per kernel call
    many = index.search(qc, qp, 25)
    np.testing.assert_array_equal(one.ids, many.ids)
    for block in (1, 7, 64):  # passage ids accumulated in blocks of 1, 7, 64 ids
        monkeypatch.setattr(fi, "_ID_BLOCK", block)
        blocked = index.search(qc, qp, 25)
        np.testing.assert_array_equal(one.ids, blocked.ids)
        np.testing.assert_array_equal(one.secondary, blocked.secondary)


def test_ties_are_broken_by_secondary_then_ascending_id() -> None:
    # 1 model, 1 class used: every passage matches with count 1. Passages 3 and 1 have the
    # highest passage prob (equal), then 0, 2, 4 tie exactly -> ascending id.
    pc = np.zeros((5, 1), dtype=np.int32)
    pp = np.array([[0.5], [0.9], [0.5], [0.9], [0.5]], dtype=np.float32)
    index = ForestIndex.build(pc, pp, n_classes=2)
    q = np.zeros((3, 1), dtype=np.int32)
    qp = np.ones((3, 1), dtype=np.float32)
    hits = index.search(q, qp, 5)
    np.testing.assert_array_equal(hits.ids, [[1, 3, 0, 2, 4]] * 3)
    # k cutting through a tie keeps the smallest ids
    np.testing.assert_array_equal(index.search(q, qp, 3).ids, [[1, 3, 0]] * 3)
    # a query of the other class matches nothing: all padding
    miss = index.search(np.ones((1, 1), np.int32), np.ones((1, 1), np.float32), 3)
    np.testing.assert_array_equal(miss.ids, [[-1, -1, -1]])
    assert np.all(np.isneginf(miss.scores(1)))


def test_search_is_deterministic_under_query_reordering() -> None:
    qc, qp, pc, pp, c = random_tables(7, m=4, c=3)  # few models, few classes: heavy ties
    index = ForestIndex.build(pc, pp, c)
    a = index.search(qc, qp, 50)
    perm = np.random.default_rng(0).permutation(len(qc))
    b = index.search(qc[perm], qp[perm], 50)
    np.testing.assert_array_equal(a.ids[perm], b.ids)


def test_adding_passages_equals_building_at_once() -> None:
    qc, qp, pc, pp, c = random_tables(3)
    full = ForestIndex.build(pc, pp, c)
    inc = ForestIndex.build(pc[:120], pp[:120], c)
    new_ids = inc.add(pc[120:200], pp[120:200])
    np.testing.assert_array_equal(new_ids, np.arange(120, 200))
    inc.add(pc[200:], pp[200:])
    assert inc.n_passages == full.n_passages
    np.testing.assert_array_equal(inc.offsets, full.offsets)
    np.testing.assert_array_equal(inc.ids, full.ids)
    np.testing.assert_array_equal(inc.probs, full.probs)
    np.testing.assert_array_equal(inc.search(qc, qp, 30).ids, full.search(qc, qp, 30).ids)


def test_new_passages_are_retrieved_without_retraining() -> None:
    forest = Forest.random(ForestConfig(n_models=16, n_classes=4, dim=8), seed=0)
    rng = np.random.default_rng(0)
    old = rng.standard_normal((50, 8)).astype(np.float32)
    index = ForestIndex.build(*forest.passage_classes(old), n_classes=4)
    new = rng.standard_normal((3, 8)).astype(np.float32)
    ids = index.add(*forest.passage_classes(new))
    # a query equal to a new passage matches it under every model that indexes it
    qc, qp = forest.query_classes(new)
    hits = index.search(qc, qp, 1)
    np.testing.assert_array_equal(hits.ids[:, 0], ids)
    np.testing.assert_array_equal(hits.counts[:, 0], 16)


def test_tie_stats_hand_fixture() -> None:
    ids = np.array([[0, 1, 2], [0, 1, 2], [0, 1, -1]])
    counts = np.array([[3, 2, 2], [3, 3, 3], [3, 1, 0]], dtype=np.int32)
    sec = np.array([[1.0, 0.5, 0.4], [1.0, 0.9, 0.9], [1.0, 0.2, 0.0]])
    st = ForestHits(ids, counts, sec).tie_stats(at=2)
    assert st["count_tie"] == pytest.approx(2 / 3)  # rows 0 and 1
    assert st["secondary_tie"] == pytest.approx(1 / 3)  # row 1
    assert st["mean_tied_at_boundary"] == pytest.approx((2 + 3 + 1) / 3)
    with pytest.raises(ValueError, match="k > 3"):
        ForestHits(ids, counts, sec).tie_stats(at=3)


def test_class_entropy_and_stats() -> None:
    classes = np.array([[0, 0], [1, 0], [0, -1], [1, 0]])
    ent = class_entropy(classes, 2)
    np.testing.assert_allclose(ent, [np.log(2), 0.0])
    st = ForestIndex.build(classes, np.ones((4, 2), np.float32), 2).stats()
    np.testing.assert_allclose(st["passage_class_entropy"], ent)
    assert st["not_retrievable_fraction"] == pytest.approx(1 / 8)
    assert st["passages_never_indexed"] == 0


class _Store:
    def __init__(self, q, p):
        self.queries, self.passages = q, p

    def iter_passage_chunks(self, chunk_size):
        for s in range(0, len(self.passages), chunk_size):
            yield s, self.passages[s : s + chunk_size]


def test_forest_system_run_matches_index_search() -> None:
    rng = np.random.default_rng(1)
    forest = Forest.random(ForestConfig(n_models=8, n_classes=3, dim=6), seed=1, name="f")
    store = _Store(
        rng.standard_normal((10, 6)).astype(np.float32),
        rng.standard_normal((70, 6)).astype(np.float32),
    )
    system = ForestSystem(forest, chunk_size=16)  # several chunks -> incremental add
    run = system.retrieve(store, k=80)
    ref = ForestIndex.build(*forest.passage_classes(store.passages), 3).search(
        *forest.query_classes(store.queries), 80
    )
    np.testing.assert_array_equal(run.ids, ref.ids)
    assert run.name == "f" and run.ids.shape == (10, 80) and run.ids[0, -1] == -1
    sizes = system.index.list_sizes()
    qc, _ = forest.query_classes(store.queries)
    assert system.balance_stats()["mean_postings_scanned_per_query"] == pytest.approx(
        sizes[np.arange(8)[None, :], qc].sum(1).mean()
    )
    finite = np.where(np.isfinite(run.scores), run.scores, -1.0)
    assert np.all(np.diff(finite, axis=1) <= 0)
    np.testing.assert_array_equal(np.isneginf(run.scores), run.ids < 0)


def test_dense_view_inner_product_equals_index_ranking() -> None:
    """Forest.encode_queries @ encode_passages.T = count + secondary / (M + 1)."""
    rng = np.random.default_rng(4)
    forest = Forest.random(ForestConfig(n_models=10, n_classes=3, dim=5, nr_threshold=0.5), seed=4)
    # make the not-retrievable outcome fire for some passages
    forest.passage_weights[0][:, :, -1] = (
        torch.randn(10, 5, generator=torch.Generator().manual_seed(0)) * 6
    )
    q = rng.standard_normal((12, 5)).astype(np.float32)
    p = rng.standard_normal((90, 5)).astype(np.float32)
    pc, pp = forest.passage_classes(p)
    assert (pc < 0).any()
    qc, qp = forest.query_classes(q)
    index = ForestIndex.build(pc, pp, 3)
    hits = index.search(qc, qp, 90)
    dense = forest.encode_queries(q).astype(np.float64) @ forest.encode_passages(p).T
    ok = hits.ids >= 0
    expect = hits.counts + hits.secondary / 11
    np.testing.assert_allclose(
        np.take_along_axis(dense, np.where(ok, hits.ids, 0), 1)[ok], expect[ok], rtol=1e-6
    )
    _, counts, _ = brute_force(qc, qp, pc, pp, 90)
    np.testing.assert_array_equal(np.floor(dense + 1e-6), counts)


def saved_random_forest(path, seed: int, n_models: int, n_queries: int, n_passages: int):
    """A random forest (C = 3 over 4-d vectors) saved as a checkpoint at ``path`` (encoder
    fingerprint ``"fp"``), and a random store of that fingerprint to rank."""
    from treerank.models.checkpoint import save_checkpoint

    rng = np.random.default_rng(seed)
    forest = Forest.random(ForestConfig(n_models=n_models, n_classes=3, dim=4), seed=seed, name="f")
    save_checkpoint(path, forest.to_checkpoint("enc", "fp"))
    store = _Store(
        rng.standard_normal((n_queries, 4)).astype(np.float32),
        rng.standard_normal((n_passages, 4)).astype(np.float32),
    )
    store.encoder_fingerprint = "fp"  # type: ignore[attr-defined]
    return forest, store


def test_ckpt_system_spec_uses_forest_search(tmp_path) -> None:
    from treerank.families import CHECKPOINTS
    from treerank.search.specs import BuildContext, build_system

    forest, store = saved_random_forest(tmp_path / "f", 2, 6, 5, 40)
    ctx = BuildContext(checkpoints=CHECKPOINTS)
    run = build_system(f"ckpt:{tmp_path / 'f'}", ctx).retrieve(store, 40)
    np.testing.assert_array_equal(run.ids, ForestSystem(forest).retrieve(store, 40).ids)


@pytest.mark.parametrize(
    ("seed", "m", "c", "k"),
    [(0, 12, 6, 40), (1, 4, 2, 300), (2, 3, 3, 7), (3, 20, 50, 5)],  # heavy ties .. sparse lists
)
def test_kernel_returns_exactly_the_scipy_ranking(seed, m, c, k) -> None:
    qc, qp, pc, pp, _ = random_tables(seed, m=m, c=c)
    # exact ties in the secondary score too: quantised probabilities
    pp = np.round(pp * 4) / 4
    qp = np.round(qp * 2) / 2
    index = ForestIndex.build(pc, pp.astype(np.float32), c)
    ref_ids, ref_counts, ref_sec = scipy_search(index, qc, qp.astype(np.float32), k)
    import treerank.forest.index as fi

    for block in (fi.ID_BLOCK, 50):
        fi._ID_BLOCK = block
        try:
            hits = index.search(qc, qp.astype(np.float32), k)
        finally:
            fi._ID_BLOCK = fi.ID_BLOCK
        np.testing.assert_array_equal(hits.ids, ref_ids)
        np.testing.assert_array_equal(hits.counts, ref_counts)
        np.testing.assert_array_equal(hits.secondary, ref_sec)  # bit-identical float64
    # the torch kernel (the GPU path, run on the CPU here): the same ranking, bit for bit
    hits_t = index.search(qc, qp.astype(np.float32), k, backend="torch")
    np.testing.assert_array_equal(hits_t.ids, ref_ids)
    np.testing.assert_array_equal(hits_t.counts, ref_counts)
    np.testing.assert_array_equal(hits_t.secondary, ref_sec)
    sizes = index.list_sizes()
    np.testing.assert_array_equal(hits.scanned, sizes[np.arange(m)[None, :], qc].sum(1))


def test_kernel_equals_scipy_ranking_on_real_scifact(scifact_store) -> None:
    """A random forest over the real SciFact vectors: same ranking, ties included."""
    st = scifact_store["test"]
    p = np.asarray(st.passages, dtype=np.float32)
    q = np.asarray(st.queries[:60], dtype=np.float32)
    forest = Forest.random(ForestConfig(n_models=16, n_classes=8, dim=p.shape[1]), seed=3)
    index = ForestIndex.build(*forest.passage_classes(p), n_classes=8)
    qc, qp = forest.query_classes(q)
    hits = index.search(qc, qp, 100)
    ref_ids, ref_counts, ref_sec = scipy_search(index, qc, qp, 100)
    np.testing.assert_array_equal(hits.ids, ref_ids)
    np.testing.assert_array_equal(hits.counts, ref_counts)
    np.testing.assert_array_equal(hits.secondary, ref_sec)
    assert (np.diff(hits.counts, axis=1) == 0).mean() > 0.3  # the fixture really is tie-heavy
