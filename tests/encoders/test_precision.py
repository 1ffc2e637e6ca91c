"""Encoding precision: the bf16 path on real SciFact text, the `auto` probe (simulated timings)
and its cache, the one mixing rule (stores, queries, checkpoints), and the fidelity guard."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from treerank.encoders import SentenceEncoder
from treerank.encoders import precision as prec
from treerank.encoders.precision import (
    FIDELITY_BOUNDS,
    ONNX_FP32,
    ONNX_INT8,
    TORCH_BF16,
    TORCH_FP32,
    PrecisionMixError,
    check_mix,
    choose_path,
    resolve_path,
    run_probe,
    store_precision,
)
from treerank.readers.msmarco import read_msmarco
from treerank.readers.scifact import read_scifact
from treerank.store import EmbeddingStore, embed_split
from treerank.store.embed import embed_signature

BF16_MIN_COSINE = FIDELITY_BOUNDS["bf16"]  # 0.999, the documented bound


@pytest.fixture(scope="module")
def bf16_encoder():
    return SentenceEncoder(precision="bf16", progress=False)


# ----------------------------------------------------------------------------- bf16 path


def test_bf16_vectors_meet_the_bound_on_scifact(encoder, bf16_encoder, scifact_zip):
    split = read_scifact(scifact_zip, "test")
    texts = split.passage_texts[:24] + split.query_texts[:24]
    ref = encoder.encode_passages(texts)
    got = bf16_encoder.encode_passages(texts)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = prec.cosines(got, ref)
    assert cos.min() >= BF16_MIN_COSINE
    assert cos.min() < 1 - 1e-7  # it really computed in bf16 (not the fp32 path)
    # the guard's reference is the fp32 path whatever the encoder's precision
    np.testing.assert_allclose(bf16_encoder.encode_reference(texts), ref, atol=1e-5)
    assert bf16_encoder.precision == "bf16" and encoder.precision == "fp32"


def test_bf16_weights_option(encoder, scifact_zip):
    split = read_scifact(scifact_zip, "test")
    texts = split.passage_texts[:8]
    enc = SentenceEncoder(precision="bf16", bf16_weights=True, progress=False)
    assert enc.fingerprint == encoder.fingerprint  # the fp32 weights' identity
    assert next(enc.model.parameters()).dtype.is_floating_point
    assert str(next(enc.model.parameters()).dtype) == "torch.bfloat16"
    cos = prec.cosines(enc.encode_passages(texts), encoder.encode_passages(texts))
    assert cos.min() >= 0.99
    np.testing.assert_allclose(enc.encode_reference(texts), encoder.encode(texts), atol=1e-5)


def test_bad_precision_settings_are_refused():
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        SentenceEncoder(precision="fp16")
    with pytest.raises(ValueError, match="torch backend only"):
        SentenceEncoder(precision="bf16", backend="onnx")
    with pytest.raises(ValueError, match="bf16_weights needs precision 'bf16'"):
        SentenceEncoder(bf16_weights=True)


# ----------------------------------------------------------------------------- auto probe


def _forwards(noise: dict[str, float]):
    """Fake paths: fp32 vectors plus per-path noise (a degraded path has a low cosine)."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((32, 16)).astype(np.float32)
    out = {}
    for path in (TORCH_FP32, TORCH_BF16, ONNX_FP32, ONNX_INT8):
        eps = noise.get(path.name, 0.0)
        v = ref + eps * np.random.default_rng(1).standard_normal(ref.shape).astype(np.float32)
        out[path] = lambda v=v: v
    return out


def _timer(seconds: dict[str, float]):
    return lambda path, fn: seconds[path.name]


def test_auto_never_picks_a_path_slower_than_fp32():
    # bf16 slower than fp32 (a CPU without bf16 units): every other path slower too
    slow = {"torch/fp32": 1.0, "torch/bf16": 1.8, "onnx/fp32": 1.1, "onnx-int8": 1.01}
    choice = run_probe(_forwards({}), timer=_timer(slow))
    assert choice.path == TORCH_FP32 and choice.ratio == 1.0
    # equal time is not faster
    assert choose_path({"torch/fp32": 1.0, "torch/bf16": 1.0}, {"torch/bf16": 1.0}).path == (
        TORCH_FP32
    )
    # the fastest path wins when it meets its bound
    fast = {"torch/fp32": 1.0, "torch/bf16": 0.4, "onnx/fp32": 0.9, "onnx-int8": 0.5}
    choice = run_probe(_forwards({}), timer=_timer(fast))
    assert choice.path == TORCH_BF16 and choice.ratio == pytest.approx(2.5)
    assert choice.seconds == fast


def test_auto_skips_a_fast_path_that_breaks_its_bound():
    fast = {"torch/fp32": 1.0, "torch/bf16": 0.6, "onnx/fp32": 0.9, "onnx-int8": 0.3}
    # int8 noise: cosine far below 0.99, bf16 noise: below 0.999 but above 0.99
    choice = run_probe(_forwards({"onnx-int8": 0.5, "torch/bf16": 0.03}), timer=_timer(fast))
    assert choice.min_cosine["onnx-int8"] < FIDELITY_BOUNDS["int8"]
    assert FIDELITY_BOUNDS["int8"] < choice.min_cosine["torch/bf16"] < FIDELITY_BOUNDS["bf16"]
    assert choice.path == ONNX_FP32 and choice.ratio == pytest.approx(1 / 0.9)


class _FakeEncoder:
    def __init__(self, fingerprint: str, seconds: dict[str, float]) -> None:
        self.fingerprint = fingerprint
        self.probed = 0
        self._fw = _forwards({})
        self._seconds = seconds

    def probe_forward(self, path):
        self.probed += 1
        return self._fw[path]


def test_auto_choice_is_cached_and_invalidated(tmp_path, monkeypatch):
    monkeypatch.setenv("TREERANK_CACHE", str(tmp_path))
    monkeypatch.setattr(prec, "_onnx_available", lambda: True)
    seconds = {"torch/fp32": 1.0, "torch/bf16": 0.5, "onnx/fp32": 0.8, "onnx-int8": 0.7}
    versions = {"torch": "2.0", "onnxruntime": "1.0"}
    enc = _FakeEncoder("sha256:aaa", seconds)
    timer = _timer(seconds)

    first = resolve_path(enc, "auto", "auto", timer=timer, versions=versions)
    assert first.path == TORCH_BF16 and not first.cached and enc.probed == 4
    doc = json.loads((tmp_path / "encode-path.json").read_text())
    (key,) = doc
    assert json.loads(key)["weights"] == "sha256:aaa" and json.loads(key)["threads"] >= 1
    assert json.loads(key)["cpu_flags"]  # the CPU's flags are part of the key

    again = resolve_path(enc, "auto", "auto", timer=timer, versions=versions)
    assert again.cached and again.path == TORCH_BF16 and enc.probed == 4  # nothing measured
    assert again.ratio == pytest.approx(2.0)

    other = _FakeEncoder("sha256:bbb", seconds)  # other weights: measured again
    resolve_path(other, "auto", "auto", timer=timer, versions=versions)
    assert other.probed == 4
    newer = {**versions, "torch": "2.1"}  # a library upgrade: measured again
    resolve_path(enc, "auto", "auto", timer=timer, versions=newer)
    assert enc.probed == 8
    assert len(json.loads((tmp_path / "encode-path.json").read_text())) == 3


def test_auto_candidates_follow_the_setting_and_the_store_space():
    names = [p.name for p in prec.candidate_paths("auto", "auto")]
    assert names == ["torch/fp32", "torch/bf16", "onnx/fp32", "onnx-int8"]
    assert [p.name for p in prec.candidate_paths("torch", "auto")] == ["torch/fp32", "torch/bf16"]
    fp32_space = [p.name for p in prec.candidate_paths("auto", "auto", ["fp32", "bf16"])]
    assert fp32_space == ["torch/fp32", "torch/bf16", "onnx/fp32"]
    # one candidate: nothing to measure
    only = resolve_path(_FakeEncoder("x", {}), "onnx-int8", "auto", allowed=["int8"])
    assert only.path == ONNX_INT8 and only.seconds == {}


# ----------------------------------------------------------------------------- mixing rule


def test_mixing_rule():
    for a, b in [("fp32", "bf16"), ("bf16", "fp32"), ("int8", "int8"), ("bf16", "bf16")]:
        check_mix("store", a, b)
    for a, b in [("fp32", "int8"), ("int8", "bf16")]:
        with pytest.raises(PrecisionMixError, match=r"store: .* lie in different spaces"):
            check_mix("store", a, b)
    with pytest.raises(PrecisionMixError, match="unknown vector precision 'fp16'"):
        check_mix("store", "fp32", "fp16")
    assert store_precision({}) == "fp32"  # stores written before backends existed
    assert store_precision({"backend": "onnx-int8"}) == "int8"
    assert store_precision({"backend": "torch", "precision": "bf16"}) == "bf16"
    with pytest.raises(ValueError, match="encoder.precision 'fp8' unknown"):
        store_precision({"precision": "fp8"})


@pytest.fixture(scope="module")
def small_split(msmarco_parquet):
    return read_msmarco(msmarco_parquet, "validation", limit=2)


@pytest.fixture(scope="module")
def bf16_store(small_split, bf16_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16-store") / "validation"
    embed_split(small_split, bf16_encoder, out, progress=False)
    return EmbeddingStore.open(out)


def test_bf16_store_meta_and_queries(bf16_store, encoder, bf16_encoder):
    from treerank.search.query import EncoderMismatchError, check_query_backend

    enc = bf16_store.meta["encoder"]
    assert enc["precision"] == "bf16" and enc["backend"] == "torch"
    assert enc["bf16_weights"] is False and enc["auto"] is None
    fid = enc["fidelity"]
    n_checked = min(64, bf16_store.n_queries) + min(64, bf16_store.n_passages)
    assert fid["checked"] == n_checked and fid["breaches"] == []
    assert BF16_MIN_COSINE <= fid["min_cosine"] < 1.0 and fid["bound"] == 0.999
    assert bf16_store.meta["stats"]["fidelity_checked"] == n_checked
    # the precision changes the signature (resume never mixes fp32 and bf16 batches)
    assert bf16_store.meta["signature"] == embed_signature(
        bf16_store.meta["data_sha256"], bf16_encoder
    )
    assert bf16_store.meta["signature"] != embed_signature(bf16_store.meta["data_sha256"], encoder)
    # fp32 queries against a bf16 store are allowed; int8 ones are not
    check_query_backend(bf16_store, encoder)
    from types import SimpleNamespace

    from treerank.encoders.backend import get_backend

    int8 = SimpleNamespace(backend=get_backend("onnx-int8"), precision="int8")
    with pytest.raises(EncoderMismatchError, match="int8 and bf16 vectors lie in different"):
        check_query_backend(bf16_store, int8)


def test_search_encodes_queries_in_the_store_precision(bf16_store):
    from treerank.search.query import load_store_encoder

    enc = load_store_encoder(bf16_store)
    assert enc.precision == "bf16"
    assert load_store_encoder(bf16_store, precision="fp32").precision == "fp32"


def test_checkpoint_precision_is_checked_for_every_store(tmp_path):
    from tests.search.tiny_store import write_tiny_store
    from treerank.models.checkpoint import load_checkpoint, save_checkpoint
    from treerank.models.linear import LinearHead
    from treerank.search.specs import build_system

    head = LinearHead(16)
    save_checkpoint(tmp_path / "fp32", head.to_checkpoint("fake", "sha256:fake"))
    save_checkpoint(
        tmp_path / "rec", head.to_checkpoint("fake", "sha256:fake", encoder_precision="fp32")
    )
    assert load_checkpoint(tmp_path / "rec").encoder_precision == "fp32"
    load_checkpoint(tmp_path / "rec", "sha256:fake", "bf16")  # fp32 and bf16 mix
    with pytest.raises(PrecisionMixError, match="trained on .*fp32.*int8 and fp32"):
        load_checkpoint(tmp_path / "rec", "sha256:fake", "int8")
    # a checkpoint written before precisions existed is flagged, not refused
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_checkpoint(tmp_path / "fp32", "sha256:fake", "int8")
    assert any("records no training precision" in str(w.message) for w in caught)
    # evaluate / search / serve: a checkpoint system on an int8 store is refused
    store = write_tiny_store(tmp_path / "store")
    meta = json.loads((store.path / "meta.json").read_text())
    meta["encoder"]["backend"] = "onnx-int8"
    (store.path / "meta.json").write_text(json.dumps(meta))
    int8_store = EmbeddingStore.open(store.path)
    with pytest.raises(PrecisionMixError, match="int8 and fp32"):
        build_system(f"ckpt:{tmp_path / 'rec'}").retrieve(int8_store, 3)


# ----------------------------------------------------------------------------- fidelity guard


class _Degraded(SentenceEncoder):
    """A bf16 encoder whose passage rows 0 and 2 of every batch are pushed off their vector."""

    def encode_batch(self, texts, kind="passage"):
        res = super().encode_batch(texts, kind)
        if kind == "passage":
            v = res.vectors.copy()
            rng = np.random.default_rng(0)
            for i in (0, 2):
                if i < len(v):
                    v[i] = v[i] + 0.3 * rng.standard_normal(v.shape[1]).astype(np.float32)
                    v[i] /= np.linalg.norm(v[i])
            res.vectors = v
        return res


def test_fidelity_guard_reports_a_breach_and_falls_back_to_fp32(small_split, encoder, tmp_path):
    bad = _Degraded(precision="bf16", progress=False)
    out = tmp_path / "validation"
    with pytest.warns(UserWarning, match=r"fidelity guard \(bf16\).*BREACH: [1-9]"):
        embed_split(small_split, bad, out, progress=False, reuse=False)
    store = EmbeddingStore.open(out)
    fid = store.meta["encoder"]["fidelity"]
    assert fid["breaches"] and fid["min_cosine"] < 0.999 and fid["action"] == "fp32-fallback"
    assert store.meta["stats"]["fidelity_breaches"] == len(fid["breaches"])
    rows = np.array([b["row"] for b in fid["breaches"] if b["kind"] == "passage"])
    assert all(b["cosine"] < 0.999 for b in fid["breaches"])
    texts = [small_split.passage_texts[i] for i in rows]
    fp32 = encoder.encode_passages(texts)
    # the breaching rows now hold their fp32 vectors (cosine 1 to float rounding)
    assert prec.cosines(np.asarray(store.passages)[rows], fp32).min() > 1 - 1e-5


def test_cli_evaluate_refuses_an_fp32_head_on_an_int8_store(tmp_path):
    from typer.testing import CliRunner

    from tests.search.tiny_store import write_tiny_store
    from treerank.cli.main import app
    from treerank.models.checkpoint import save_checkpoint
    from treerank.models.linear import LinearHead

    head = LinearHead(16).to_checkpoint("fake", "sha256:fake", encoder_precision="fp32")
    save_checkpoint(tmp_path / "head", head)
    store = write_tiny_store(tmp_path / "test")
    meta = json.loads((store.path / "meta.json").read_text())
    meta["encoder"]["backend"] = "onnx-int8"
    (store.path / "meta.json").write_text(json.dumps(meta))
    args = ["evaluate", "--store", str(store.path), "--k", "5", "--metric", "ndcg@5"]
    args += ["--permutations", "20", "--no-progress", "--system", f"ckpt:{tmp_path / 'head'}"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "int8 and fp32 vectors lie in different spaces" in " ".join(res.output.split())
