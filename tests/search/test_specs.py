"""System specs parse once into typed frozen nodes: round trips, ranges in the nodes, names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.models.checkpoint import save_checkpoint
from treerank.models.cosine import CosineScorer
from treerank.search.specs import (
    SYSTEM_KINDS,
    AdaptiveFusionSpec,
    BM25Spec,
    BuildContext,
    CheckpointSpec,
    CosineSpec,
    CrossEncoderSpec,
    DBSpec,
    FaissSpec,
    LinearFusionSpec,
    RescoreSpec,
    RM3Spec,
    RRFSpec,
    SystemSpec,
    TunedFusionSpec,
    build_system,
    parse_spec,
)
from treerank.search.systems import BM25System, FusionSystem

SPECS = [
    ("cosine", CosineSpec),
    ("bm25", BM25Spec),
    ("bm25:k1=1.2,b=0.75", BM25Spec),
    ("bm25:method=robertson", BM25Spec),
    ("bm25+rm3:fb_docs=5,fb_terms=20,orig_weight=0.3,k1=1.2", RM3Spec),
    ("rrf:bm25+cosine", RRFSpec),
    ("rrf:bm25+cosine:k=10,depth=50", RRFSpec),
    ("rrf:bm25+rm3+cosine", RRFSpec),
    ("rrf:cosine+rrf:bm25+cosine", RRFSpec),
    ("linear-fusion:bm25:k1=1.2+cosine:w=0.3,norm=zscore", LinearFusionSpec),
    ("tuned-fusion:bm25+cosine:method=rrf,queries=all,grid=5,on=cv", TunedFusionSpec),
    ("adaptive-fusion:bm25+cosine:max_queries=2,grid=3", AdaptiveFusionSpec),
    ("faiss:flat", FaissSpec),
    ("faiss:hnsw:M=16,ef_search=64", FaissSpec),
    ("faiss:ivfpq:nlist=64,nprobe=8,rescore=200,resident=1", FaissSpec),
    ("faiss:binary:over=ckpt:/some/head", FaissSpec),
    ("rescore:bm25", RescoreSpec),
    ("rescore:faiss:ivfpq:nlist=64,nprobe=8:depth=50", RescoreSpec),
    ("rescore:faiss:binary:depth=300,scorer=ckpt:runs/a:b", RescoreSpec),
    ("rescore:bm25:depth=5,scorer=ce:/some/ce", RescoreSpec),
    ("rescore:bm25:depth=20,scorer=ce:/some/ce,batch=64,precision=auto", RescoreSpec),
    ("rrf:cosine+rescore:bm25:depth=50:k=60", RRFSpec),
    ("db:/tmp/qd:collection", DBSpec),
    ("db:http://localhost:6333", DBSpec),
]


@pytest.mark.parametrize(("text", "cls"), SPECS)
def test_every_kind_round_trips(text: str, cls: type[SystemSpec]) -> None:
    node = parse_spec(text)
    assert type(node) is cls and node.name == text
    again = parse_spec(node.render())
    assert again == node and again.render() == node.render()


def test_round_trip_covers_every_registered_kind(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "m", CosineScorer().to_checkpoint("fake", "sha256:fake"))
    covered = {cls.kind for _, cls in SPECS} | {parse_spec(f"ckpt:{tmp_path / 'm'}").kind}
    assert covered == set(SYSTEM_KINDS)
    node = parse_spec(f"ckpt:{tmp_path / 'm'}")
    assert node == CheckpointSpec(tmp_path / "m") and parse_spec(node.render()) == node


def test_defaults_render_away_and_values_are_typed() -> None:
    node = parse_spec("bm25:k1=0.9,b=0.4")  # the defaults, spelled out
    assert node == BM25Spec() and node.render() == "bm25" and node.name == "bm25:k1=0.9,b=0.4"
    rrf = parse_spec("rrf:bm25:k1=1.2+cosine:k=10")
    assert rrf == RRFSpec(BM25Spec(k1=1.2), CosineSpec(), k=10)
    assert isinstance(rrf, RRFSpec) and rrf.k == 10 and isinstance(rrf.k, int)
    # B's own parameter tail would read as the fusion's: the rendering says which is which
    nested = RRFSpec(CosineSpec(), RescoreSpec(BM25Spec(), depth=50))
    assert nested.render() == "rrf:cosine+rescore:bm25:depth=50:depth=1000"
    assert parse_spec(nested.render()) == nested
    # a left side that is a fusion with parameters parses at the first cut that parses
    left = parse_spec("rrf:rrf:bm25+cosine:k=10+cosine")
    assert left == RRFSpec(RRFSpec(BM25Spec(), CosineSpec(), k=10), CosineSpec())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RRFSpec(BM25Spec(), CosineSpec(), k=0), r"'rrf:bm25\+cosine:k=0'.*k must be > 0"),
        (lambda: LinearFusionSpec(w=1.5), r"w must be in \[0.0, 1.0\], got 1.5"),
        (lambda: LinearFusionSpec(norm="rank"), "norm must be one of minmax, zscore"),
        (lambda: BM25Spec(b=2.0), r"b must be in \[0.0, 1.0\], got 2.0"),
        (lambda: BM25Spec(k1=float("nan")), "k1=nan is not a finite number"),
        (lambda: RM3Spec(fb_docs=0), "RM3 needs fb_docs >= 1"),
        (lambda: RescoreSpec(depth=0), "depth must be >= 1, got 0"),
        (lambda: RescoreSpec(precision="bf16"), "apply to scorer=ce:<dir> only"),
        (lambda: parse_spec("rescore:bm25:batch=8"), "apply to scorer=ce:<dir> only"),
        (lambda: parse_spec("rescore:bm25:scorer=ce:/c,precision=fp16"), "one of fp32, bf16, auto"),
        (lambda: parse_spec("rescore:bm25:scorer=ce:/c,batch=0"), "batch must be >= 1, got 0"),
        (lambda: TunedFusionSpec(grid=1), "grid must be >= 2, got 1"),
        (lambda: TunedFusionSpec(metric="ndcg@x"), "ndcg@x"),
    ],
)
def test_a_node_made_in_code_is_range_checked(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ckpt:", "expected ckpt:<checkpoint dir>"),
        ("ckpt:/no/such/dir", r"config.json: missing \(no such directory\)"),
        ("rescore:", "expected rescore:<first stage>"),
        ("rescore:bm25:scorer=bm25", "scorer must be cosine, ckpt:<dir> or ce:<dir>"),
        ("rescore:bm25:depth=5,scorer=ce:", "scorer='ce:': expected ce:<dir>"),
        ("faiss:flat:over=ce:/x", "over must be cosine or ckpt:<dir>"),
        ("faiss:hnws", "did you mean 'hnsw'"),
        ("db:", "expected db:<folder or url>"),
        ("tuned-fusion:bm25+cosine:queries=some", "queries must be one of heldout, all"),
        ("rrf:bm25+nope", "unknown system kind"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_a_node_builds_the_system_its_text_builds(tmp_path: Path) -> None:
    store = write_tiny_store(tmp_path / "s")
    text = "linear-fusion:bm25:k1=1.2+cosine:w=0.3,norm=zscore"
    from_text, from_node = build_system(text), build_system(parse_spec(text))
    assert isinstance(from_node, FusionSystem) and from_node.name == text
    assert from_text.retrieve(store, 4).ids.tolist() == from_node.retrieve(store, 4).ids.tolist()
    made = LinearFusionSpec(BM25Spec(k1=1.2), CosineSpec(), w=0.3, norm="zscore")
    assert made == parse_spec(text) and build_system(made).name == made.render() == text
    assert isinstance(build_system(made).a, BM25System)  # type: ignore[attr-defined]


def test_scorers_are_typed_nodes() -> None:
    node = parse_spec("rescore:bm25:scorer=ce:/models/ce")
    assert isinstance(node, RescoreSpec) and node.scorer == CrossEncoderSpec(Path("/models/ce"))
    assert node.children() == (BM25Spec(), CrossEncoderSpec(Path("/models/ce")))
    faiss = parse_spec("faiss:binary:over=ckpt:/h")
    assert isinstance(faiss, FaissSpec) and faiss.over == CheckpointSpec(Path("/h"))


def test_the_build_context_reaches_dense_systems() -> None:
    from treerank.kernels.device import Device

    system = build_system(
        "cosine", BuildContext(chunk_size=3, backend="torch", device=Device("cpu"))
    )
    assert system.chunk_size == 3 and system.backend == "torch"  # type: ignore[attr-defined]
    assert system.device == Device("cpu")  # type: ignore[attr-defined]


def test_a_spec_error_names_the_kind_whose_body_is_bad() -> None:
    from treerank.search.specs import SpecError

    for text, kind in (
        ("ckpt:/no/such", "ckpt"),
        ("rrf:ckpt:/no/such+cosine", "rrf"),
        ("a/b", None),
    ):
        with pytest.raises(SpecError) as err:
            parse_spec(text)
        assert err.value.kind == kind
