"""Exact streaming search: parity with FAISS IndexFlatIP, tie order, chunking, constant scorer."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from treerank.kernels.topk import decode_keys, exact_search, rank_keys, topk_desc
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _assert_same_as_faiss(
    ids: np.ndarray, scores: np.ndarray, q: np.ndarray, p: np.ndarray, k: int
) -> None:
    index = faiss.IndexFlatIP(p.shape[1])
    index.add(p)
    ref_s, ref_i = index.search(q, k)
    np.testing.assert_allclose(scores, ref_s, atol=1e-5)
    # ids equal wherever the reference score is not tied with a neighbour (FAISS lists ties by
    # descending id, treerank by ascending id); tied positions must hold the same set
    for r in range(q.shape[0]):
        distinct = np.ones(k, bool)
        gaps = np.abs(np.diff(ref_s[r])) < 1e-6
        distinct[1:] &= ~gaps
        distinct[:-1] &= ~gaps
        assert (ids[r][distinct] == ref_i[r][distinct]).all()


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("chunk_size", [97, 1000, 10_000])
def test_parity_with_faiss_flat_ip(backend: str, chunk_size: int) -> None:
    rng = np.random.default_rng(1)
    p, q = _unit(rng, 3000, 24), _unit(rng, 37, 24)
    ids, scores = exact_search(q, p, k=100, chunk_size=chunk_size, backend=backend, query_batch=16)
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == (37, 100)
    _assert_same_as_faiss(ids, scores, q, p, 100)


def test_memmap_input_and_k_clipped(tmp_path) -> None:
    rng = np.random.default_rng(2)
    p = _unit(rng, 50, 8)
    p.tofile(tmp_path / "p.bin")
    mm = np.memmap(tmp_path / "p.bin", dtype=np.float32, mode="r", shape=(50, 8))
    q = _unit(rng, 3, 8)
    ids, scores = exact_search(q, mm, k=1000, chunk_size=16)
    assert ids.shape == (3, 50)  # k clipped to the number of passages
    assert sorted(ids[0].tolist()) == list(range(50))
    np.testing.assert_allclose(scores, np.sort(q @ p.T, axis=1)[:, ::-1], atol=1e-6)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_ties_break_by_ascending_passage_id_across_chunks(backend: str) -> None:
    # passages 0..9 score 1, 10..19 score 2, 20..29 score 1 again: chunks of 7 split every group
    p = np.zeros((30, 2), np.float32)
    p[:, 0] = 1.0
    p[10:20, 0] = 2.0
    q = np.array([[1.0, 0.0]], np.float32)
    ids, scores = exact_search(q, p, k=15, chunk_size=7, backend=backend)
    assert ids[0].tolist() == list(range(10, 20)) + [0, 1, 2, 3, 4]
    assert scores[0].tolist() == [2.0] * 10 + [1.0] * 5


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_memmap_ties_across_the_cut_take_the_full_rescoring_and_keep_the_id_order(
    tmp_path, backend: str
) -> None:
    # every score ties: no query has the margin, so every one is rescored over all passages,
    # chunk by chunk from the memory map (its pages released after each chunk)
    p = np.ones((300, 4), np.float32)
    p.tofile(tmp_path / "p.bin")
    mm = np.memmap(tmp_path / "p.bin", dtype=np.float32, mode="r", shape=p.shape)
    q = np.ones((3, 4), np.float32)
    ids, scores = exact_search(q, mm, k=20, chunk_size=64, query_batch=2, backend=backend)
    assert ids.tolist() == [list(range(20))] * 3
    assert scores.tolist() == [[4.0] * 20] * 3


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_constant_scorer_earns_its_id_order_mrr_not_one(backend: str) -> None:
    # every passage gets the same score; relevant passages are 3 (query 0) and 42 (query 1)
    p = np.ones((100, 4), np.float32)
    q = np.ones((2, 4), np.float32)
    ids, _ = exact_search(q, p, k=50, chunk_size=16, backend=backend)
    assert ids.tolist() == [list(range(50))] * 2
    qrels = Qrels(np.array([[3], [42]]), np.array([[1], [1]]))
    r = evaluate_run(ids, qrels, ("mrr@10", "recall@50"))
    assert r.mean["mrr@10"] == pytest.approx((1 / 4 + 0) / 2)
    assert r.mean["mrr@10"] < 1.0
    assert r.mean["recall@50"] == 1.0


def test_passage_transform_applied_per_chunk() -> None:
    rng = np.random.default_rng(3)
    p = rng.standard_normal((500, 6)).astype(np.float32)
    q = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    seen: list[int] = []

    def tower(x: np.ndarray) -> np.ndarray:
        seen.append(x.shape[0])
        return x @ w

    ids, scores = exact_search(q, p, k=20, chunk_size=128, passage_transform=tower)
    # one call per chunk, then one per query batch on the preselected rows (4 queries x 36)
    assert seen == [128, 128, 128, 116, 4 * 36]
    full = q @ (p @ w).T
    np.testing.assert_allclose(scores, -np.sort(-full, axis=1)[:, :20], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dimension"):
        exact_search(q, p, k=5)


def test_rank_keys_roundtrip_and_order() -> None:
    s = np.array([[0.5, -0.0, 0.0, -np.inf, 3.0, -2.5]], np.float32)
    i = np.array([[4, 9, 2, -1, 7, 1]])
    ids, vals = decode_keys(np.sort(rank_keys(i, s), axis=1))
    assert ids.tolist() == [[7, 4, 2, 9, 1, -1]]
    assert vals.tolist() == [[3.0, 0.5, 0.0, 0.0, -2.5, -np.inf]]


def test_topk_desc_rejects_nan_and_handles_small_rows() -> None:
    with pytest.raises(ValueError, match="NaN"):
        topk_desc(np.array([[1.0, np.nan, 0.0]], np.float32), 2)
    ids, vals = topk_desc(np.array([[1.0, 3.0, 3.0]], np.float32), 5, id_offset=10)
    assert ids.tolist() == [[11, 12, 10]] and vals.tolist() == [[3.0, 3.0, 1.0]]


def test_release_pages_only_touches_read_only_memmaps(tmp_path) -> None:
    from treerank.kernels.topk import release_pages

    x = np.arange(4096 * 8, dtype=np.float32).reshape(-1, 8)
    assert not release_pages(x, 0, x.shape[0])  # anonymous memory is never released
    x.tofile(tmp_path / "x.bin")
    mm = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="r", shape=x.shape)
    assert float(mm[:].sum()) == float(x.sum())
    assert release_pages(mm, 0, x.shape[0])
    np.testing.assert_array_equal(mm[100:200], x[100:200])  # data faults back in unchanged
    rw = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="r+", shape=x.shape)
    assert not release_pages(rw, 0, x.shape[0])


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_vectors_raise_the_same_error_on_every_backend(tmp_path, backend, bad) -> None:
    # issue 10, item 7: faiss silently dropped or ranked a NaN passage, torch raised
    from tests.search.tiny_store import write_tiny_store
    from treerank.kernels.topk import NonFiniteVectorError
    from treerank.search.specs import BuildContext, build_system

    root = tmp_path / "test"
    write_tiny_store(root)
    p = np.fromfile(root / "passages.bin", "<f4").reshape(8, 16)
    p[5, 3] = bad
    p[2] = 0.0  # a zero vector is fine: it scores 0
    p.tofile(root / "passages.bin")
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(root)
    with pytest.raises(NonFiniteVectorError, match=rf"{root}: passage row 5 holds a non-finite"):
        build_system("cosine", BuildContext(backend=backend)).retrieve(store, 8)
    with pytest.raises(NonFiniteVectorError, match="passage row 5"):
        exact_search(np.ones((1, 16), np.float32), p, k=3, chunk_size=4, backend=backend)
    q = np.ones((2, 16), np.float32)
    q[1, 0] = bad
    with pytest.raises(NonFiniteVectorError, match=r"vectors: query row 1"):
        exact_search(q, np.ones((4, 16), np.float32), k=2, backend=backend)
    p[5, 3] = 0.5
    p.tofile(root / "passages.bin")
    run = build_system("cosine", BuildContext(backend=backend)).retrieve(
        EmbeddingStore.open(root), 8
    )
    assert run.scores[0, run.ids[0].tolist().index(2)] == 0.0  # the zero vector scores 0


def test_pair_scores_do_not_depend_on_the_batch() -> None:
    from treerank.kernels.topk import pair_scores

    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 384)).astype(np.float32)
    p = rng.standard_normal((300, 384)).astype(np.float32)
    full = pair_scores(q, p)
    ref = (q.astype(np.float64) @ p.astype(np.float64).T).astype(np.float32)
    np.testing.assert_allclose(full, ref, rtol=0, atol=1e-5)  # float64 reference, float32 out
    perm = rng.permutation(300)
    # the same pairs in another order, another batch and as per-query rows: the same bits
    np.testing.assert_array_equal(pair_scores(q[2:3], p[perm])[0], full[2, perm])
    rows = np.stack([p[perm[:40]] for _ in range(5)])
    np.testing.assert_array_equal(pair_scores(q, rows), full[:, perm[:40]])


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_exact_search_is_the_exact_top_k_of_pair_scores(backend: str) -> None:
    from treerank.kernels.topk import pair_scores

    rng = np.random.default_rng(4)
    q = rng.standard_normal((40, 64)).astype(np.float32)
    p = rng.standard_normal((3000, 64)).astype(np.float32)
    # near-ties across the cut: copies of rows a few ulps apart, and exact duplicates
    p[1000:1300] = p[:300] * np.float32(1 + 2**-23)
    p[2000:2100] = p[:100]
    ids, scores = exact_search(q, p, k=50, chunk_size=700, backend=backend)
    s = pair_scores(q, p)
    ref_ids, ref_scores = topk_desc(s, 50)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores)
    # a constant scorer (every margin is zero) takes the full rescoring path
    ids0, _ = exact_search(np.ones((3, 64), np.float32), np.ones((500, 64), np.float32), k=5)
    np.testing.assert_array_equal(ids0, np.tile(np.arange(5), (3, 1)))
