"""ONNX Runtime backends against the PyTorch reference on real SciFact text; the export cache;
refused module stacks; the backend recorded in stores and checked by search and serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers.sentence_transformer.modules import Dense, Pooling

from treerank.encoders import SentenceEncoder
from treerank.encoders import onnx_runtime as ort_mod
from treerank.encoders.backend import get_backend
from treerank.encoders.onnx_runtime import UnsupportedModelError, cached_export, supported_stack
from treerank.kernels.device import Device
from treerank.readers.msmarco import read_msmarco
from treerank.readers.scifact import read_scifact
from treerank.search.query import EncoderMismatchError, load_store_encoder
from treerank.store import EmbeddingStore, embed_split
from treerank.store.embed import embed_signature
from treerank.store.reuse import reusable_stores

FP32_ATOL = 1e-5  # max abs difference per vector component, onnx fp32 vs torch
INT8_MIN_COSINE = 0.99


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """One export cache for the module: each backend is exported once."""
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def onnx_encoder(onnx_cache):
    return SentenceEncoder(backend="onnx", cache_dir=onnx_cache)


@pytest.fixture(scope="module")
def int8_encoder(onnx_cache, onnx_encoder):
    return SentenceEncoder(backend="onnx-int8", cache_dir=onnx_cache)


@pytest.fixture(scope="module")
def scifact_texts(scifact_zip, encoder):
    """40 SciFact passages (the 10 longest, cut by truncation, and 30 ordinary ones) and 40
    queries."""
    split = read_scifact(scifact_zip, "test")
    lengths = encoder.token_lengths(split.passage_texts[:2000], truncation=False)
    longest = np.argsort(-lengths)[:10]
    assert lengths[longest].min() > encoder.max_seq_length  # these hit truncation
    passages = [split.passage_texts[i] for i in longest] + split.passage_texts[:30]
    return passages, split.query_texts[:40]


def test_onnx_fp32_equals_torch(encoder, onnx_encoder, scifact_texts):
    passages, queries = scifact_texts
    for kind, texts in (("passage", passages), ("query", queries)):
        ref = encoder.encode(texts, kind)
        ours = onnx_encoder.encode(texts, kind)
        assert ours.dtype == np.float32 and ours.shape == ref.shape == (40, 384)
        diff = np.abs(ours - ref).max(axis=1)
        assert diff.max() <= FP32_ATOL, (kind, diff.max())
    # one padded batch of very different lengths: the mask is honoured by the exported graph
    mixed = [queries[0], passages[0], "x"]
    diff = np.abs(onnx_encoder.encode_batch(mixed).vectors - encoder.encode_batch(mixed).vectors)
    assert diff.max() <= FP32_ATOL
    assert onnx_encoder.fingerprint == encoder.fingerprint  # same weights, same identity


def test_onnx_int8_cosine(encoder, int8_encoder, scifact_texts):
    passages, queries = scifact_texts
    for kind, texts in (("passage", passages), ("query", queries)):
        ref = encoder.encode(texts, kind)
        ours = int8_encoder.encode(texts, kind)
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
        cos = (ours * ref).sum(1)
        assert cos.min() >= INT8_MIN_COSINE, (kind, cos.min())
        assert cos.mean() < 0.99999  # really quantised, not the fp32 graph
    assert int8_encoder.onnx_path.stat().st_size < 0.8 * _fp32_path(int8_encoder).stat().st_size


def _fp32_path(enc):
    key = json.loads((enc.onnx_path.parent / "key.json").read_text())
    assert key["quantization"]["per_channel"] is True and key["quantization"]["weight_type"]
    return next(
        p / "model.onnx"
        for p in enc.onnx_path.parent.parent.iterdir()
        if (p / "key.json").is_file()
        and json.loads((p / "key.json").read_text())["quantization"] is None
    )


def test_export_cache_reused_and_invalidated(encoder, onnx_encoder, onnx_cache, monkeypatch):
    path = onnx_encoder.onnx_path
    assert path is not None and path.parent.parent == onnx_cache  # cache_dir is the root
    mtime = path.stat().st_mtime_ns
    before = dict(ort_mod.EXPORTS)
    again = SentenceEncoder(backend="onnx", cache_dir=onnx_cache)
    assert again.onnx_path == path and path.stat().st_mtime_ns == mtime
    assert dict(ort_mod.EXPORTS) == before  # nothing exported the second time
    key = json.loads((path.parent / "key.json").read_text())
    assert key["fingerprint"] == encoder.fingerprint and key["opset"] == ort_mod.OPSET

    # another onnxruntime version: a new entry, exported once, the old one left alone
    real = ort_mod._versions()
    monkeypatch.setattr(ort_mod, "_versions", lambda: {**real, "onnxruntime": "0.0.0-test"})
    pooling = supported_stack(encoder.model, "minilm", prompts=False)
    inputs = onnx_encoder._onnx.inputs
    other = cached_export(
        encoder.model, encoder.fingerprint, pooling, inputs, get_backend("onnx"), onnx_cache
    )
    assert other != path and other.is_file() and path.stat().st_mtime_ns == mtime
    assert ort_mod.EXPORTS["fp32"] == before.get("fp32", 0) + 1
    assert json.loads((other.parent / "key.json").read_text())["onnxruntime"] == "0.0.0-test"
    # another opset: another entry too
    k1 = ort_mod.export_key(encoder.fingerprint, pooling, inputs, None)
    k2 = ort_mod.export_key(encoder.fingerprint, pooling, inputs, None, opset=18)
    k3 = ort_mod.export_key("sha256:" + "0" * 64, pooling, inputs, None)
    assert len({k1.digest, k2.digest, k3.digest}) == 3
    assert not list(onnx_cache.glob(".*"))  # no temporary directory left behind


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TREERANK_CACHE", str(tmp_path / "tc"))
    assert ort_mod.onnx_cache_dir() == tmp_path / "tc" / "onnx"
    monkeypatch.delenv("TREERANK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ort_mod.onnx_cache_dir() == tmp_path / "xdg" / "treerank" / "onnx"


def test_unsupported_stacks_are_refused(encoder):
    transformer, pooling = encoder.model[0], encoder.model[1]
    assert supported_stack(encoder.model, "m", prompts=False) == ort_mod.PoolingSpec("mean", True)
    with pytest.raises(UnsupportedModelError, match=r"module 2 \(Dense\)"):
        supported_stack([transformer, pooling, Dense(384, 64)], "m", prompts=False)
    with pytest.raises(UnsupportedModelError, match="pooling_mode 'weightedmean'"):
        supported_stack([transformer, Pooling(384, pooling_mode="weightedmean")], "m", False)
    with pytest.raises(UnsupportedModelError, match=r"module 0 \(Pooling\)"):
        supported_stack([pooling], "m", prompts=False)
    no_prompt = Pooling(384, pooling_mode="mean", include_prompt=False)
    assert supported_stack([transformer, no_prompt], "m", prompts=False).mode == "mean"
    with pytest.raises(UnsupportedModelError, match="include_prompt=False"):
        supported_stack([transformer, no_prompt], "m", prompts=True)
    cls = supported_stack([transformer, Pooling(384, pooling_mode="cls")], "m", False)
    assert cls == ort_mod.PoolingSpec("cls", False)


def test_unknown_backend_and_device():
    with pytest.raises(ValueError, match="unknown encoder backend 'onnx-fp16'"):
        SentenceEncoder(backend="onnx-fp16")
    with pytest.raises(ValueError, match="CPU only"):
        SentenceEncoder(backend="onnx", device=Device("cuda"))


@pytest.fixture(scope="module")
def small_split(msmarco_parquet):
    return read_msmarco(msmarco_parquet, "validation", limit=2)


@pytest.fixture(scope="module")
def backend_stores(small_split, encoder, int8_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("backend-stores")
    embed_split(small_split, encoder, root / "fp32" / "validation", progress=False)
    embed_split(small_split, int8_encoder, root / "int8" / "validation", progress=False)
    return EmbeddingStore.open(root / "fp32" / "validation"), EmbeddingStore.open(
        root / "int8" / "validation"
    )


def test_meta_records_backend(backend_stores, encoder, onnx_encoder, int8_encoder):
    fp32, int8 = backend_stores
    assert fp32.meta["encoder"]["backend"] == "torch"
    assert fp32.meta["encoder"]["quantization"] is None
    q = int8.meta["encoder"]["quantization"]
    assert int8.meta["encoder"]["backend"] == "onnx-int8"
    assert q["method"] == "dynamic" and q["weight_type"] == "QInt8" and q["per_channel"] is True
    assert int8.encoder_fingerprint == fp32.encoder_fingerprint  # the weights' identity
    # fp32 backends share the signature (and that of stores written before backends existed)
    data = fp32.meta["data_sha256"]
    assert embed_signature(data, onnx_encoder) == embed_signature(data, encoder)
    assert fp32.meta["signature"] == embed_signature(data, encoder)
    assert embed_signature(data, int8_encoder) != fp32.meta["signature"]
    cos = (np.asarray(int8.passages) * np.asarray(fp32.passages)).sum(1)
    assert cos.min() >= INT8_MIN_COSINE


def test_passage_reuse_needs_same_precision(backend_stores, encoder):
    fp32, int8 = backend_stores
    fp, prompt, length = encoder.fingerprint, None, encoder.max_seq_length
    sibling_of_int8 = int8.path.parent / "train"
    assert reusable_stores(sibling_of_int8, fp, prompt, length, precision="int8") == [int8.path]
    assert reusable_stores(sibling_of_int8, fp, prompt, length, precision="fp32") == []
    sibling_of_fp32 = fp32.path.parent / "train"
    assert reusable_stores(sibling_of_fp32, fp, prompt, length, precision="fp32") == [fp32.path]


def test_search_uses_and_checks_the_store_backend(backend_stores, onnx_cache, monkeypatch):
    fp32, int8 = backend_stores
    # refused before any model is loaded, naming both backends and the store
    with pytest.raises(EncoderMismatchError, match=r"'onnx-int8' \(int8\).*'torch' \(fp32\)"):
        load_store_encoder(int8, backend="torch")
    with pytest.raises(EncoderMismatchError, match=r"'torch' \(fp32\).*'onnx-int8' \(int8\)"):
        load_store_encoder(fp32, backend="onnx-int8")
    # the store's own backend by default; onnx fp32 serves a torch store
    monkeypatch.setenv("TREERANK_CACHE", str(onnx_cache))
    enc = load_store_encoder(int8, None)
    assert enc.backend.name == "onnx-int8"
    assert load_store_encoder(fp32, backend="onnx").backend.name == "onnx"


def test_serve_refuses_other_precision(backend_stores, encoder, int8_encoder):
    from treerank.serve.service import SearchService, ServiceConfig

    fp32, int8 = backend_stores
    with pytest.raises(EncoderMismatchError, match="int8 and fp32 vectors"):
        SearchService(ServiceConfig(store=int8.path), encoder=encoder)
    with pytest.raises(EncoderMismatchError, match="int8 and fp32 vectors"):
        SearchService(ServiceConfig(store=fp32.path), encoder=int8_encoder)
    service = SearchService(ServiceConfig(store=int8.path), encoder=int8_encoder)
    hits = service.search([int8.query_texts()[0]], k=3)
    assert service.info()["encoder"]["backend"] == "onnx-int8"
    assert len(hits) == 1


def test_cli_search_refuses_other_precision(backend_stores):
    from typer.testing import CliRunner

    from treerank.cli.main import app

    fp32, int8 = backend_stores
    runner = CliRunner()
    res = runner.invoke(app, ["search", "--store", str(int8.path), "-q", "x", "--backend", "onnx"])
    assert res.exit_code == 2 and "int8 and fp32 vectors" in res.output, res.output
    assert "--backend onnx-int8" in res.output
    res = runner.invoke(app, ["search", "--store", str(fp32.path), "-q", "x", "--backend", "gpu"])
    assert res.exit_code == 2 and "unknown encoder backend 'gpu'" in res.output, res.output


# ------------------------------------------------------------------ issue 36: what the key holds
def test_export_key_holds_everything_that_changes_the_output(encoder, onnx_encoder, monkeypatch):
    """Every input of the export (model config, tokenizer, modules, prompts, truncation, each
    library version) changes the key: a cached graph is never reused for a changed one."""
    pooling = supported_stack(encoder.model, "minilm", prompts=False)
    inputs = onnx_encoder._onnx.inputs
    parts = ort_mod.model_parts(encoder.model)
    assert set(parts) == {"config", "tokenizer", "modules"}
    encoder.token_lengths(["a b c d"], truncation=False)  # tokenizer calls change per-call state
    encoder.token_lengths(["a b c d"])
    assert ort_mod.model_parts(encoder.model) == parts  # ... which is not the tokenizer
    enc = {"query_prompt": None, "passage_prompt": None, "max_seq_length": 256}

    def digest(parts=parts, encoding=enc, q=None) -> str:
        return ort_mod.export_key(
            encoder.fingerprint, pooling, inputs, q, parts=parts, encoding=encoding
        ).digest

    base = digest()
    assert digest() == base  # deterministic
    variants = [
        digest(parts={**parts, "config": "0" * 64}),
        digest(parts={**parts, "tokenizer": "0" * 64}),
        digest(parts={**parts, "modules": "0" * 64}),
        digest(encoding={**enc, "query_prompt": "query: "}),
        digest(encoding={**enc, "passage_prompt": "passage: "}),
        digest(encoding={**enc, "max_seq_length": 32}),
        digest(q=get_backend("onnx-int8").quantization),
    ]
    real = ort_mod._versions()
    for lib in ("torch", "transformers", "sentence_transformers", "onnx", "onnxruntime"):
        monkeypatch.setattr(ort_mod, "_versions", lambda lib=lib: {**real, lib: "0.0.0-test"})
        variants.append(digest())
    monkeypatch.setattr(ort_mod, "_versions", lambda: real)
    assert len({base, *variants}) == len(variants) + 1
    key = json.loads((onnx_encoder.onnx_path.parent / "key.json").read_text())
    assert key["parts"] == parts and key["transformers"] == real["transformers"]
    assert key["model_bytes"] == onnx_encoder.onnx_path.stat().st_size


def test_changed_config_with_identical_weights_gets_its_own_export(
    encoder, onnx_encoder, onnx_cache, tmp_path
):
    """The field case: a copy of MiniLM whose config says ``hidden_act: relu`` (same weights,
    same fingerprint) reused the first model's cached graph (cosine distance 0.17 to its own
    torch vectors). Now it gets its own export, equal to its torch vectors."""
    from treerank.encoders.sentence import default_model_path

    copy = tmp_path / "minilm-relu"
    shutil.copytree(default_model_path(), copy)
    cfg = json.loads((copy / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu"
    moved = SentenceEncoder(copy, progress=False)  # the same files elsewhere: the same parts
    assert ort_mod.model_parts(moved.model) == ort_mod.model_parts(encoder.model)
    (copy / "config.json").write_text(json.dumps({**cfg, "hidden_act": "relu"}))
    torch_relu = SentenceEncoder(copy, progress=False)
    onnx_relu = SentenceEncoder(copy, backend="onnx", cache_dir=onnx_cache, progress=False)
    assert onnx_relu.fingerprint == encoder.fingerprint  # the weights are the same
    assert onnx_relu.onnx_path != onnx_encoder.onnx_path
    texts = ["what is the boiling point of water", "coffee contains caffeine"]
    want = torch_relu.encode_passages(texts)
    assert np.abs(onnx_relu.encode_passages(texts) - want).max() <= FP32_ATOL
    gelu = onnx_encoder.encode_passages(texts)
    assert (1 - (gelu * want).sum(axis=1)).max() > 0.01  # the two models really differ


DAMAGE = {
    "half file": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "zero bytes": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(bytes(reversed(p.read_bytes()))),  # same size
    "model deleted, key kept": lambda p: p.unlink(),
    "key.json garbage": lambda p: (p.parent / "key.json").write_text("{not json"),
    "key.json deleted": lambda p: (p.parent / "key.json").unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_detected_and_rebuilt(damage, tmp_path):
    """Before: a raw ONNX Runtime traceback, or ``Directory not empty`` on every later run."""
    pooling = ort_mod.PoolingSpec("mean", True)
    key = ort_mod.export_key("sha256:" + "1" * 64, pooling, ("input_ids",), None)
    made: list[Path] = []

    def make(path: Path) -> None:
        made.append(path)
        path.write_bytes(b"graph-bytes-" * 1000)

    first = ort_mod._build(tmp_path, key, make)
    assert ort_mod._build(tmp_path, key, make) == first and len(made) == 1  # reused when whole
    DAMAGE[damage](first)
    assert ort_mod.entry_problem(first.parent, key) is not None
    with pytest.warns(UserWarning, match="damaged ONNX export cache entry"):
        again = ort_mod._build(tmp_path, key, make)
    assert again == first and len(made) == 2
    assert again.read_bytes() == b"graph-bytes-" * 1000
    assert ort_mod.entry_problem(first.parent, key) is None
    assert [p.name for p in tmp_path.iterdir()] == [key.digest]  # nothing left aside


def test_damaged_real_export_is_rebuilt_before_onnx_runtime_sees_it(
    onnx_encoder, tmp_path, monkeypatch
):
    entry = onnx_encoder.onnx_path.parent
    cache = tmp_path / "cache"
    shutil.copytree(entry, cache / entry.name)
    DAMAGE["half file"](cache / entry.name / "model.onnx")
    before = ort_mod.EXPORTS["fp32"]
    with pytest.warns(UserWarning, match=r"model\.onnx has \d+ bytes"):
        enc = SentenceEncoder(backend="onnx", cache_dir=cache, progress=False)
    assert ort_mod.EXPORTS["fp32"] == before + 1
    texts = ["a damaged cache entry", "is rebuilt"]
    assert np.abs(enc.encode_passages(texts) - onnx_encoder.encode_passages(texts)).max() < 1e-6
