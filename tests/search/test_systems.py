"""Systems and spec parsing on a tiny on-disk store in the real format."""

from __future__ import annotations

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.models.checkpoint import EncoderMismatchError, save_checkpoint
from treerank.models.cosine import CosineScorer
from treerank.search.fusion import rrf
from treerank.search.run import Run
from treerank.search.specs import SYSTEM_KINDS, BuildContext, build_system
from treerank.search.systems import BM25System, CheckpointSystem, DenseSystem, FusionSystem


@pytest.fixture
def store(tmp_path):
    return write_tiny_store(tmp_path / "test")


def test_cosine_system_ranks_all_passages(store) -> None:
    run = build_system("cosine").retrieve(store, k=100)
    assert run.ids.shape == (4, 8)
    assert run.ids[:, 0].tolist() == [1, 0, 2, 3]  # each query was built next to its passage
    q, p = np.asarray(store.queries), np.asarray(store.passages)
    np.testing.assert_allclose(run.scores, -np.sort(-(q @ p.T), axis=1), atol=1e-6)


def test_bm25_system_uses_texts(store) -> None:
    system = build_system("bm25:k1=1.2,b=0.75")
    assert isinstance(system, BM25System) and system.params.k1 == 1.2 and system.params.b == 0.75
    run = system.retrieve(store, k=3)
    assert run.ids[1, 0] == 0  # "dogs bark loudly" -> "the dog barked loudly at night"
    assert run.ids[2, 0] == 2 and run.ids[3, 0] == 3


def test_fusion_specs(store) -> None:
    s = build_system("rrf:bm25+cosine:k=10")
    assert isinstance(s, FusionSystem) and s.method == "rrf" and s.rrf_k == 10
    fused = s.retrieve(store, k=5)
    ref = rrf(
        build_system("bm25").retrieve(store, 1000),
        build_system("cosine").retrieve(store, 1000),
        k=5,
        rrf_k=10,
    )
    assert fused.ids.tolist() == ref.ids.tolist()
    lin = build_system("linear-fusion:bm25:k1=1.2+cosine:w=0.3,norm=zscore")
    assert isinstance(lin, FusionSystem) and lin.weight == 0.3 and lin.norm == "zscore"
    assert isinstance(lin.a, BM25System) and lin.a.params.k1 == 1.2
    assert isinstance(lin.b, DenseSystem)
    assert lin.retrieve(store, k=4).ids.shape == (4, 4)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("bm26", "unknown system kind 'bm26'; did you mean 'bm25'"),
        ("bm25:k2=3", "k1="),
        ("rrf:bm25", "two systems"),
        ("cosine:x=1", "no parameters"),
        ("bm25:k1=abc", "float"),
    ],
)
def test_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_system(spec)


def test_registry_table_lists_every_type() -> None:
    # (kinds registered by other modules, e.g. tuned-fusion from treerank.evaluation, may add to it)
    assert {
        "cosine",
        "bm25",
        "bm25+rm3",
        "rrf",
        "linear-fusion",
        "ckpt",
        "faiss",
        "rescore",
    } <= set(SYSTEM_KINDS)


def test_ckpt_dense_and_retrieving_models(store, tmp_path, monkeypatch) -> None:
    save_checkpoint(tmp_path / "cos", CosineScorer().to_checkpoint("fake", "sha256:fake"))
    s = build_system(f"ckpt:{tmp_path / 'cos'}")
    assert isinstance(s, CheckpointSystem)
    run = s.retrieve(store, k=8)
    assert run.ids.tolist() == build_system("cosine").retrieve(store, 8).ids.tolist()
    save_checkpoint(tmp_path / "other", CosineScorer().to_checkpoint("fake", "sha256:other"))
    with pytest.raises(EncoderMismatchError):
        build_system(f"ckpt:{tmp_path / 'other'}").retrieve(store, 8)

    class Retriever:  # a model of a family with its own search (the forest's shape)
        name = "forest"
        model_type = "toy-retriever"

        def retrieve(self, store, k=1000):
            return Run(
                "forest", np.zeros((store.n_queries, 1), np.int64), np.ones((store.n_queries, 1))
            )

    from treerank.search.specs import BuildContext
    from treerank.search.systems import CheckpointLoader

    class Loader(CheckpointLoader):  # injected: a family table that knows the retriever
        def load(self, path, expected_fingerprint=None, expected_precision=None):
            return Retriever()

    own = {"toy-retriever": lambda model, name, *, device: model}
    ctx = BuildContext(checkpoints=Loader(own_system=own.get))
    out = build_system(f"ckpt:{tmp_path / 'cos'}", ctx).retrieve(store, 8)
    assert out.ids.shape == (4, 1) and out.name == f"ckpt:{tmp_path / 'cos'}"


def test_shared_cache_runs_each_system_once(store, monkeypatch) -> None:
    ctx = BuildContext(cache={})
    fused = build_system("rrf:bm25+cosine", ctx)
    bm25 = build_system("bm25", ctx)
    assert (
        isinstance(fused, FusionSystem)
        and fused.a is bm25
        and fused.b is build_system("cosine", ctx)
    )
    calls = []
    real = type(bm25.index_for(store)).search

    def counting(self, texts, k=1000, batch=256):
        calls.append(k)
        return real(self, texts, k, batch)

    monkeypatch.setattr(type(bm25.index_for(store)), "search", counting)
    bm25._memo = type(bm25._memo)()
    deep = fused.retrieve(store, k=8)
    shallow = bm25.retrieve(store, k=3)
    assert calls == [8]  # clipped to the 8 passages, computed once
    assert shallow.ids.tolist() == bm25.retrieve(store, 8).ids[:, :3].tolist()
    assert deep.k == 8


def test_a_system_kind_is_one_registered_node_class(store, monkeypatch) -> None:
    from dataclasses import dataclass
    from typing import ClassVar

    from treerank.search.specs import SystemSpec, param, register_system_kind

    class Constant:  # ranks passages in id order: the contract's tie rule for a constant scorer
        def __init__(self, name: str) -> None:
            self.name = name

        def retrieve(self, store, k=1000):
            k = min(k, store.n_passages)
            ids = np.tile(np.arange(k, dtype=np.int64), (store.n_queries, 1))
            return Run(self.name, ids, np.zeros(ids.shape, np.float32))

    @dataclass(frozen=True)
    class ConstSpec(SystemSpec):
        kind: ClassVar[str] = "const"
        summary: ClassVar[str] = "constant scorer"
        syntax: ClassVar[str] = "const[:offset=0]"

        offset: int = param(0, low=0)

        def make(self, ctx):
            return Constant(self.name)

    monkeypatch.setitem(SYSTEM_KINDS, "const", ConstSpec)
    register_system_kind(ConstSpec, replace=True)
    assert build_system("const").retrieve(store, 3).ids[0].tolist() == [0, 1, 2]
    fused = build_system("rrf:const+cosine")  # usable inside other kinds at once
    assert fused.retrieve(store, 3).ids.shape == (store.n_queries, 3)
    with pytest.raises(ValueError, match="offset must be >= 0, got -1"):
        build_system("const:offset=-1")  # the generic parameter parsing and range check
    with pytest.raises(ValueError, match="already registered"):
        register_system_kind(ConstSpec)
    with pytest.raises(ValueError, match=r"unknown system kind 'nope'; known: .*, const\b"):
        build_system("nope")
    with pytest.raises(ValueError, match=r"'cnst'; did you mean 'const'\?"):
        build_system("cnst")


def test_uses_trained_model_is_a_tree_query(tmp_path) -> None:
    from treerank.search.specs import (
        CheckpointSpec,
        CosineSpec,
        RescoreSpec,
        RRFSpec,
        parse_spec,
        system_uses_trained_model,
        uses_trained_model,
    )

    ckpt = CheckpointSpec(tmp_path / "model")  # a node made in code: nothing is read
    assert uses_trained_model(ckpt)
    assert not uses_trained_model(parse_spec("cosine"))
    assert not uses_trained_model(parse_spec("rrf:bm25+cosine"))
    assert uses_trained_model(RRFSpec(parse_spec("bm25"), ckpt))  # a fusion with a trained side
    assert uses_trained_model(parse_spec("rescore:bm25:scorer=ckpt:/some/dir"))
    assert uses_trained_model(parse_spec("rescore:bm25:scorer=ce:/some/dir"))
    assert uses_trained_model(parse_spec("faiss:flat:over=ckpt:/some/dir"))
    assert not uses_trained_model(parse_spec("rescore:faiss:hnsw:scorer=cosine"))
    assert not uses_trained_model(RescoreSpec(CosineSpec()))
    # a built system answers through the node it was built from
    assert system_uses_trained_model(CheckpointSystem(tmp_path / "model"))
    assert not system_uses_trained_model(build_system("rrf:bm25+cosine"))
    assert system_uses_trained_model(build_system(RescoreSpec(CosineSpec(), scorer=ckpt)))
