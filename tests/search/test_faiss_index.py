"""FAISS indexes as systems on the real SciFact test store (5,183 passages, 300 queries)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treerank.kernels.topk import sort_rows
from treerank.models.checkpoint import EncoderMismatchError, save_checkpoint
from treerank.models.cosine import CosineScorer
from treerank.models.linear import LinearHead
from treerank.search.faiss_index import (
    FaissSystem,
    add_ivf_presized,
    build_index,
    default_nlist,
    faiss_system,
    list_indexes,
    parse_index_spec,
    read_index_meta,
    resolve_build,
)
from treerank.search.rescore import RescoreSystem
from treerank.search.specs import build_system
from treerank.search.systems import DenseSystem


def _recall(ids: np.ndarray, ref: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ids, ref, strict=True)]))


@pytest.fixture(scope="module")
def store(scifact_store):
    return scifact_store["test"]


@pytest.fixture(scope="module")
def exact(store):
    return DenseSystem(CosineScorer()).retrieve(store, 100)


def _system(spec: str, index_dir) -> FaissSystem | RescoreSystem:
    system = faiss_system(parse_index_spec(spec.removeprefix("faiss:"), spec), spec, index_dir)
    return system


def test_spec_parsing() -> None:
    s = parse_index_spec("ivfpq:nlist=64,m=16,nprobe=8,rescore=200")
    assert (s.kind, s.build, s.search, s.rescore, s.over) == (
        "ivfpq",
        {"nlist": 64, "m": 16, "nbits": 8, "opq": 20, "train_size": 0},
        {"nprobe": 8},
        200,
        "cosine",
    )
    assert parse_index_spec("binary").rescore == 1000  # binary rescoring is on by default
    assert parse_index_spec("hnsw").search == {"ef_search": 128}
    with pytest.raises(ValueError, match="unknown index kind 'annoy'.*hnsw"):
        parse_index_spec("annoy")
    with pytest.raises(
        ValueError, match="unknown index kind 'hnws'; did you mean 'hnsw'\\? known:"
    ):
        parse_index_spec("hnws:M=8")
    with pytest.raises(ValueError, match="'ivfpqf'; did you mean 'ivfpqfs'\\? known: flat, hnsw"):
        parse_index_spec("ivfpqf")
    with pytest.raises(ValueError, match="'nprobe=4' is not one of M=..."):
        parse_index_spec("hnsw:nprobe=4")
    with pytest.raises(ValueError, match="nlist='many' is not a int"):
        parse_index_spec("ivfflat:nlist=many")
    assert isinstance(build_system("faiss:binary"), RescoreSystem)
    assert isinstance(build_system("faiss:hnsw:M=8"), FaissSystem)


def test_resolve_build_records_the_training_sample_size() -> None:
    # train_size 0 -> max(50 nlist, 20,000), at most n; untrained kinds have no train_size
    ivf = resolve_build(parse_index_spec("ivfflat"), 5183).build
    assert ivf == {"nlist": 132, "train_size": 5183}
    big = resolve_build(parse_index_spec("ivfpq:m=16"), 1_000_000).build
    assert (big["nlist"], big["train_size"]) == (4000, 200_000)
    assert resolve_build(parse_index_spec("int8"), 1_000_000).build == {"train_size": 20_000}
    assert resolve_build(parse_index_spec("binary:train_size=900"), 500).build["train_size"] == 500
    assert resolve_build(parse_index_spec("fp16"), 500).build == {}


def test_default_nlist_scales_with_the_store(store, tmp_path, capfd) -> None:
    # round(4 sqrt(n)) clipped to [1, n // 39], by hand: 10 -> 13 > 0 -> 1; 100 -> 40 > 2;
    # 5,183 -> 288 > 132; 20,958 -> 579 > 537; 1M -> 4,000 < 25,641
    assert [default_nlist(n) for n in (10, 100, 5183, 20958, 1_000_000)] == [1, 2, 132, 537, 4000]
    assert parse_index_spec("ivfpqfs").build["nlist"] == 0
    assert resolve_build(parse_index_spec("ivfflat"), 5183).build["nlist"] == 132
    assert resolve_build(parse_index_spec("ivfflat:nlist=16"), 5183).build["nlist"] == 16
    assert resolve_build(parse_index_spec("hnsw"), 5183).build == {"M": 32, "ef_construction": 40}
    capfd.readouterr()
    auto = build_index(store, "ivfflat", index_dir=tmp_path)
    assert "WARNING clustering" not in capfd.readouterr().err  # FAISS: >= 39 points per list
    assert auto.meta["build"]["nlist"] == auto.index.nlist == 132
    assert build_index(store, "ivfflat:nlist=132", index_dir=tmp_path).path == auto.path
    explicit = build_index(store, "ivfflat:nlist=16", index_dir=tmp_path)
    assert explicit.meta["build"]["nlist"] == explicit.index.nlist == 16


def test_flat_equals_exact_search(store, exact, tmp_path) -> None:
    run = _system("faiss:flat", tmp_path).retrieve(store, 100)
    # Same sets and scores; ties ordered by ascending id on both sides.
    np.testing.assert_array_equal(run.ids, exact.ids)
    np.testing.assert_allclose(run.scores, exact.scores, atol=1e-5)


def test_ivfflat_probing_every_list_is_exact(store, exact, tmp_path) -> None:
    run = _system("faiss:ivfflat:nlist=32,nprobe=32", tmp_path).retrieve(store, 100)
    assert _recall(run.ids, exact.ids, 100) == 1.0
    few = _system("faiss:ivfflat:nlist=32,nprobe=1", tmp_path).retrieve(store, 100)
    assert 0.2 < _recall(few.ids, exact.ids, 10) < 1.0  # one list of 32: approximate
    assert (
        len([p for p in tmp_path.iterdir() if p.name.startswith("ivfflat-")]) == 1
    )  # nprobe: same index


def test_approximate_kinds_recall(store, exact, tmp_path) -> None:
    hnsw = _system("faiss:hnsw:M=16,ef_search=64", tmp_path).retrieve(store, 100)
    int8 = _system("faiss:int8", tmp_path).retrieve(store, 100)
    fp16 = _system("faiss:fp16", tmp_path).retrieve(store, 100)
    # PQ kept small (16 centroids per sub-quantizer): k-means training is the slow part
    pq = _system("faiss:ivfpq:nlist=16,m=16,nbits=4,nprobe=16,opq=0", tmp_path).retrieve(store, 100)
    pq_rs = _system("faiss:ivfpq:nlist=16,m=16,nbits=4,nprobe=16,opq=0,rescore=100", tmp_path)
    pq_rs_run = pq_rs.retrieve(store, 100)
    bits = _system("faiss:binary:rescore=0", tmp_path).retrieve(store, 100)
    bits_rs = _system("faiss:binary:rescore=500", tmp_path).retrieve(store, 100)
    r10 = {
        name: _recall(run.ids, exact.ids, 10)
        for name, run in [
            ("hnsw", hnsw),
            ("int8", int8),
            ("fp16", fp16),
            ("pq", pq),
            ("pq+rescore", pq_rs_run),
            ("binary", bits),
            ("binary+rescore", bits_rs),
        ]
    }
    assert r10["fp16"] > 0.995 and r10["int8"] > 0.97 and r10["hnsw"] > 0.95
    assert r10["pq+rescore"] > r10["pq"]
    assert r10["binary+rescore"] > 0.95 > r10["binary"]
    # rescored scores are exact cosines of the returned passages
    q = np.asarray(store.queries[:5])
    np.testing.assert_allclose(
        bits_rs.scores[:5, :3],
        np.einsum("qd,qkd->qk", q, np.asarray(store.passages)[bits_rs.ids[:5, :3]]),
        rtol=1e-5,
    )
    # binary scores are negated Hamming distances over 384 bits
    assert bits.scores.max() <= 0 and bits.scores.min() >= -384
    assert float(bits.scores[0, 0]).is_integer()


@pytest.mark.parametrize("factory", ["IVF16,Flat", "OPQ8,IVF16,PQ8x4"])
def test_presized_ivf_add_equals_faiss_add(store, factory: str) -> None:
    import faiss

    x = np.asarray(store.passages[:3000, :64], dtype=np.float32)
    trained = faiss.index_factory(64, factory, faiss.METRIC_INNER_PRODUCT)
    trained.train(x[:2000])
    reference, presized = faiss.clone_index(trained), faiss.clone_index(trained)
    reference.add(x)
    calls: list[int] = []
    add_ivf_presized(presized, x, lambda b: b, chunk_size=700, on_chunk=calls.append)
    assert calls == [700, 700, 700, 700, 200] and presized.ntotal == 3000
    a, b = faiss.extract_index_ivf(reference).invlists, faiss.extract_index_ivf(presized).invlists
    for lst in range(16):
        n = a.list_size(lst)
        assert b.list_size(lst) == n
        ids = [faiss.rev_swig_ptr(inv.get_ids(lst), n).copy() for inv in (a, b)]
        np.testing.assert_array_equal(ids[0], ids[1])
        size = n * a.code_size
        codes = [faiss.rev_swig_ptr(inv.get_codes(lst), size).copy() for inv in (a, b)]
        np.testing.assert_array_equal(codes[0], codes[1])
    faiss.extract_index_ivf(presized).nprobe = faiss.extract_index_ivf(reference).nprobe = 4
    np.testing.assert_array_equal(presized.search(x[:50], 10)[1], reference.search(x[:50], 10)[1])
    with pytest.raises(ValueError, match="trained, empty IVF"):
        add_ivf_presized(presized, x, lambda b: b)


def test_opq_rotation_is_trained(store, tmp_path) -> None:
    import faiss

    # 1 OPQ iteration with 4 sub-quantizers on 600 sampled passages: the rotation's cost (m
    # k-means of 256 centroids per iteration) is what makes OPQ slow; the defaults train 20.
    index = build_index(store, "ivfpq:nlist=8,m=4,nbits=4,opq=1,train_size=600", index_dir=tmp_path)
    opq = faiss.downcast_VectorTransform(faiss.downcast_index(index.index).chain.at(0))
    assert isinstance(opq, faiss.OPQMatrix) and opq.niter == 1 and opq.is_trained
    rot = faiss.vector_to_array(opq.A).reshape(384, 384)
    np.testing.assert_allclose(rot @ rot.T, np.eye(384), atol=1e-4)  # a trained rotation
    assert not np.allclose(rot, np.eye(384), atol=1e-2)
    assert index.meta["train_rows"] == 600


def test_cache_reuse_and_keys(store, tmp_path) -> None:
    a = build_index(store, "ivfflat:nlist=16,nprobe=2", index_dir=tmp_path)
    b = build_index(store, "ivfflat:nlist=16,nprobe=9", index_dir=tmp_path)  # search param only
    assert a.path == b.path and b.meta["created_unix"] == a.meta["created_unix"]
    c = build_index(store, "ivfflat:nlist=8", index_dir=tmp_path / "st" / "indexes")
    assert c.path != a.path
    assert [p for p, _ in list_indexes(tmp_path / "st")] == [c.path]
    # the default train_size (0) is recorded as the rows drawn: all 5,183 (< 20,000)
    assert read_index_meta(a.path)["build"] == {"nlist": 16, "train_size": 5183}
    assert build_index(store, "ivfflat:nlist=16,train_size=5183", index_dir=tmp_path).path == a.path
    assert a.meta["n_passages"] == store.n_passages == a.ntotal
    assert a.meta["train_rows"] == store.n_passages  # fewer passages than the default sample
    assert a.meta["encoder"]["fingerprint"] == store.encoder_fingerprint
    with pytest.raises(ValueError, match="cannot train nlist=100000"):
        build_index(store, "ivfflat:nlist=100000", index_dir=tmp_path)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="afile/idx: cannot write the index cache"):
        build_index(store, "flat", index_dir=tmp_path / "afile" / "idx")
    with pytest.raises(ValueError, match="must divide the dimension 384"):
        build_index(store, "ivfpq:nlist=8,m=7", index_dir=tmp_path)


def test_index_over_checkpoint_output(store, tmp_path) -> None:
    torch.manual_seed(0)
    head = LinearHead(store.dim)
    with torch.no_grad():
        head.query_tower.weight.add_(0.05 * torch.randn(store.dim, store.dim))
        head.passage_tower.weight.add_(0.05 * torch.randn(store.dim, store.dim))
    save_checkpoint(tmp_path / "ck", head.to_checkpoint("m", store.encoder_fingerprint))
    spec = f"faiss:flat:over=ckpt:{tmp_path / 'ck'}"
    run = _system(spec, tmp_path / "idx").retrieve(store, 50)
    ref = DenseSystem(head).retrieve(store, 50)
    np.testing.assert_array_equal(run.ids, ref.ids)
    np.testing.assert_allclose(run.scores, ref.scores, rtol=1e-4, atol=1e-4)
    save_checkpoint(tmp_path / "bad", head.to_checkpoint("m", "sha256:other"))
    with pytest.raises(EncoderMismatchError):
        _system(f"faiss:flat:over=ckpt:{tmp_path / 'bad'}", tmp_path / "idx").retrieve(store, 5)


def test_fastscan_pq_chunked_add_and_rescore(store, exact, tmp_path) -> None:
    import faiss

    # 16 lists all probed: the only loss is the 4-bit codes (96 sub-quantizers of 4 dims)
    spec = "ivfpqfs:nlist=16,m=96,nprobe=16"
    index = build_index(store, spec, index_dir=tmp_path, chunk_size=1000)  # 6 faiss adds
    assert isinstance(faiss.downcast_index(index.index), faiss.IndexIVFPQFastScan)
    assert index.ntotal == store.n_passages and index.meta["train_rows"] == store.n_passages
    # same codes as one faiss add of every passage into the same trained index
    x = CosineScorer().encode_passages(np.asarray(store.passages, dtype=np.float32))
    reference = faiss.index_factory(384, "IVF16,PQ96x4fs", faiss.METRIC_INNER_PRODUCT)
    reference.train(x)
    reference.add(x)
    faiss.extract_index_ivf(reference).nprobe = 16
    q = np.asarray(store.queries, dtype=np.float32)
    ids, scores = index.search(q, 10)
    ref_scores, ref_ids = reference.search(q, 10)
    np.testing.assert_array_equal(ids, sort_rows(ref_ids, ref_scores)[0])  # ties by id
    np.testing.assert_allclose(scores, np.sort(ref_scores, axis=1)[:, ::-1], rtol=1e-6)
    first = _system(f"faiss:{spec}", tmp_path).retrieve(store, 100)
    rescored = _system(f"faiss:{spec},rescore=300", tmp_path).retrieve(store, 100)
    r_first, r_rescored = _recall(first.ids, exact.ids, 10), _recall(rescored.ids, exact.ids, 10)
    assert r_first < 0.8 and r_rescored > 0.99  # measured 0.706 and 0.9997
    np.testing.assert_allclose(rescored.scores[:, :10], exact.scores[:, :10], atol=0.05)
    resident = _system(f"faiss:{spec},rescore=300,resident=1", tmp_path)
    assert isinstance(resident, RescoreSystem) and resident.release is False
    np.testing.assert_array_equal(resident.retrieve(store, 100).ids, rescored.ids)
    with pytest.raises(ValueError, match="m=7 sub-quantizers"):
        build_index(store, "ivfpqfs:nlist=8,m=7", index_dir=tmp_path)


def test_fastscan_pq_sq8_refine(store, exact, tmp_path) -> None:
    import faiss

    spec = "ivfpqfs:nlist=16,m=96,refine=8,nprobe=16"
    index = build_index(store, spec, index_dir=tmp_path, chunk_size=1000)
    assert isinstance(index.index, faiss.IndexRefine) and index.ntotal == store.n_passages
    # k_factor=1 re-ranks the fast-scan top k by the 8-bit codes (same set); 4 its top 4k
    plain = _system(f"faiss:{spec},k_factor=1", tmp_path).retrieve(store, 100)
    refined = _system(f"faiss:{spec},k_factor=4", tmp_path).retrieve(store, 100)
    r_plain, r_refined = _recall(plain.ids, exact.ids, 100), _recall(refined.ids, exact.ids, 100)
    assert r_plain < 0.8 and r_refined > 0.98  # measured 0.740 and 0.990 (Recall@100)
    # refined scores are SQ8 inner products: close to the exact cosines
    np.testing.assert_allclose(refined.scores[:, :10], exact.scores[:, :10], atol=0.02)
    with pytest.raises(ValueError, match="refine=4 must be 0"):
        build_index(store, "ivfpqfs:nlist=8,refine=4", index_dir=tmp_path)


def _nan_store(tmp_path, row: int = 3, record: bool | None = None):
    """The tiny 8-passage store with passage ``row`` NaN; ``record``: the meta ``finite`` field."""
    import json

    from tests.search.tiny_store import write_tiny_store
    from treerank.store import EmbeddingStore

    root = tmp_path / "nan"
    st = write_tiny_store(root)
    p = np.fromfile(root / "passages.bin", dtype="<f4").reshape(st.n_passages, st.dim)
    p[row, 2] = np.nan
    p.tofile(root / "passages.bin")
    if record is not None:
        meta = json.loads((root / "meta.json").read_text())
        meta["finite"] = record
        meta["first_non_finite_row"] = {"queries": None, "passages": None if record else row}
        (root / "meta.json").write_text(json.dumps(meta))
    return EmbeddingStore.open(root)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "int8", "binary", "ivfflat", "fp16"])
def test_nan_passage_is_refused_by_every_kind(kind, tmp_path) -> None:
    # FAISS alone drops it (flat, hnsw) or ranks it with a finite score (int8, binary)
    from treerank.kernels.topk import NonFiniteVectorError

    store = _nan_store(tmp_path)
    system = faiss_system(parse_index_spec(kind), index_dir=tmp_path / "idx")
    with pytest.raises(NonFiniteVectorError, match=r"nan/passages\.bin: passage row 3 holds a non"):
        system.retrieve(store, 5)
    assert not list((tmp_path / "idx").glob(f"{kind}-*"))  # nothing cached


def test_finiteness_record_is_trusted_and_a_record_of_bad_rows_refuses(tmp_path) -> None:
    from treerank.kernels.topk import NonFiniteVectorError, check_store_finite

    bad = _nan_store(tmp_path, row=6, record=False)
    with pytest.raises(NonFiniteVectorError, match="passage row 6"):
        build_index(bad, "flat", index_dir=tmp_path / "idx")
    # a store whose meta records finite vectors is not scanned (the record is the contract)
    trusted = _nan_store(tmp_path / "t", row=6, record=True)
    check_store_finite(trusted)  # no scan, no error


def test_nan_query_is_refused(store, tmp_path) -> None:
    from treerank.kernels.topk import NonFiniteVectorError

    index = build_index(store, "flat", index_dir=tmp_path)
    q = np.asarray(store.queries[:3], dtype=np.float32).copy()
    q[1, 0] = np.inf
    with pytest.raises(NonFiniteVectorError, match="query row 1"):
        index.search(q, 10)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hnsw:ef_search=0", "ef_search must be >= 1, got 0"),
        ("hnsw:ef_construction=0", "ef_construction must be >= 1, got 0"),
        ("hnsw:M=1", "M must be >= 2, got 1"),
        ("ivfflat:nprobe=0", "nprobe must be >= 1, got 0"),
        ("ivfflat:nlist=8,nprobe=9", "nprobe must be <= nlist .* got nprobe=9"),
        ("ivfpq:nbits=0", r"nbits must be in \[1, 16\], got 0"),
        ("ivfpq:nbits=17", r"nbits must be in \[1, 16\], got 17"),
        ("ivfpq:m=0", "m must be >= 1, got 0"),
        ("ivfpq:nbits=8,train_size=100", r"train_size must be >= 256 .*2\*\*8 = 256"),
        ("ivfflat:nlist=64,train_size=10", "train_size must be >= 64"),
        ("ivfpqfs:k_factor=0", "k_factor must be >= 1, got 0"),
        ("ivfpqfs:refine=9", r"refine must be in \[0, 8\], got 9"),
        ("flat:rescore=-5", "rescore must be >= 0, got -5"),
        ("flat:resident=2", r"resident must be in \[0, 1\], got 2"),
    ],
)
def test_parameter_ranges_are_checked_at_parse(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"bad system spec 'faiss:{spec}': .*{message}"):
        parse_index_spec(spec)


def test_small_ef_search_still_returns_k_hits(store, exact, tmp_path) -> None:
    index = build_index(store, "hnsw:M=16", index_dir=tmp_path)
    ids, _ = index.search(np.asarray(store.queries[:20]), 10, {"ef_search": 1})
    assert (ids >= 0).all() and ids.shape == (20, 10)


def test_pq_on_a_small_store_is_a_clear_error(tmp_path) -> None:
    from tests.search.tiny_store import write_tiny_store

    store = write_tiny_store(tmp_path / "tiny")  # 8 passages, 16 dims
    with pytest.raises(
        ValueError,
        match=r"faiss:ivfpq cannot be trained on 8 passages: .*2\*\*8 = 256 points; use "
        r"nbits<=3 \(8 centroids\), or faiss:ivfflat / faiss:flat",
    ):
        build_index(store, "ivfpq:m=4", index_dir=tmp_path / "idx")
    built = build_index(store, "ivfpq:m=4,nbits=3,opq=0", index_dir=tmp_path / "idx")
    assert built.ntotal == 8 and built.meta["finite"] is True
    with pytest.raises(ValueError, match="ivfpqfs cannot be trained on 8 passages"):
        build_index(store, "ivfpqfs:m=4", index_dir=tmp_path / "idx")
