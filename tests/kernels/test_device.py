"""The device setting (treerank.kernels.device) and exact search on a device."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from treerank.kernels import device as device_mod
from treerank.kernels import topk as topk_mod
from treerank.kernels.device import (
    DEFAULT_DEVICE,
    Device,
    DeviceError,
    parse_device,
    resolve_device,
)
from treerank.kernels.topk import chunk_topk_tensor, cpu_search_backend, exact_search

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TREERANK_CACHE", str(tmp_path / "cache"))


def test_device_spellings_parse_once_and_resolve():
    assert parse_device("cpu") == parse_device(" CPU ") == Device("cpu") == DEFAULT_DEVICE
    assert parse_device("cuda:3", check=False) == Device("cuda", 3)
    assert str(Device("cuda", 3)) == "cuda:3" and str(Device("auto")) == "auto"
    assert resolve_device(Device("cpu")) == torch.device("cpu")
    expected = torch.device("cuda", 0) if CUDA else torch.device("cpu")
    assert resolve_device(Device("auto")) == expected
    assert Device("auto").resolved_text() == str(expected)
    assert Device("cuda", 1).resolved_text() == "cuda:1"  # not resolved: itself


def test_the_one_resolution_takes_only_a_parsed_device():
    # text is parsed once at the edge (parse_device); the library never parses it again
    for raw in ("cpu", None, torch.device("cpu")):
        with pytest.raises(DeviceError, match="expected a parsed Device"):
            resolve_device(raw)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "mps", "", "cuda:-1"])
def test_unknown_device_is_refused(bad):
    with pytest.raises(DeviceError, match="device"):
        parse_device(bad, check=False)


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_says_so(spec):
    with pytest.raises(
        DeviceError, match=r"cuda requested but torch.cuda.is_available\(\) is False"
    ):
        parse_device(spec)
    parse_device(spec, check=False)  # the spelling alone is fine (a config for another machine)


@needs_cuda
def test_cuda_index_out_of_range():
    with pytest.raises(DeviceError, match="torch sees"):
        parse_device(f"cuda:{torch.cuda.device_count()}")


def test_cpu_backend_is_measured_once_and_cached(tmp_path, monkeypatch):
    calls = []
    real = topk_mod._time_backend

    def counting(*a, **kw):
        calls.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(topk_mod, "_time_backend", counting)
    small = {"n_queries": 16, "n_passages": 512, "dim": 8, "k": 5, "repeats": 1}
    first = cpu_search_backend(**small)
    assert first in ("torch", "faiss")
    assert sorted(calls) == ["faiss", "torch"]
    doc = json.loads((tmp_path / "cache" / "search-backend.json").read_text())
    (entry,) = doc.values()
    assert entry["backend"] == first and set(entry["seconds"]) == {"faiss", "torch"}
    assert cpu_search_backend(**small) == first
    assert len(calls) == 2  # the second call read the cache
    cpu_search_backend(refresh=True, **small)
    assert len(calls) == 4


def test_unwritable_cache_only_means_measuring(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TREERANK_CACHE", str(blocker / "sub"))
    assert cpu_search_backend(n_queries=8, n_passages=256, dim=4, k=3, repeats=1) in (
        "torch",
        "faiss",
    )


def _vectors(nq=40, n=900, d=12, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nq, d), dtype=np.float32)
    p = rng.standard_normal((n, d), dtype=np.float32)
    p[300:420] = p[7]  # a block of exact ties crossing chunk and k boundaries
    q[5] = 0.0  # a constant scorer row: every score ties
    return q, p


@pytest.mark.parametrize("backend", ["faiss", "torch", "auto"])
def test_device_cpu_equals_default_path(backend):
    q, p = _vectors()
    ref = exact_search(q, p, k=150, chunk_size=250, backend=backend)
    for dev in (Device("cpu"), Device("auto")) if not CUDA else (Device("cpu"),):
        got = exact_search(q, p, k=150, chunk_size=250, backend=backend, device=dev)
        assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    assert np.array_equal(ref[0][5], np.arange(150))  # ties by ascending id


@pytest.mark.parametrize("k", [1, 60, 250, 400])
def test_tensor_kernel_matches_reference(k):
    """The GPU chunk kernel, run on the CPU: scores within 1e-5 of the reference, the same ids
    except where two scores are within float32 rounding of each other (two kernels, torch's
    matmul and the reference's BLAS, may order such a tie differently: which one depends on
    the thread count an earlier test left torch with)."""
    q, p = _vectors()
    block = p[100:350]
    ref_ids, ref_vals = exact_search(q, block, k=k)
    ids, vals = chunk_topk_tensor(torch.from_numpy(q), block, k, 100, 7)
    np.testing.assert_allclose(vals, ref_vals, atol=1e-5)
    differ = ids != ref_ids + 100
    assert differ.mean() < 0.5  # the same ranking, up to near-ties
    assert np.all(np.abs(vals[differ] - ref_vals[differ]) < 1e-5)


@needs_cuda
@pytest.mark.parametrize("k", [1, 100])
def test_cuda_search_agrees_with_cpu(k):
    q, p = _vectors(nq=64, n=5000, d=32)
    cpu_ids, cpu_vals = exact_search(q, p, k=k, chunk_size=1200)
    gpu_ids, gpu_vals = exact_search(q, p, k=k, chunk_size=1200, device=Device("cuda"))
    np.testing.assert_allclose(gpu_vals, cpu_vals, atol=1e-5)
    differ = gpu_ids != cpu_ids
    # ids may differ only where the two scores are within float32 rounding of each other
    assert np.all(np.abs(gpu_vals[differ] - cpu_vals[differ]) < 1e-5)
    assert np.array_equal(gpu_ids[5], np.arange(k))


@pytest.mark.skipif(CUDA, reason="machine without CUDA")
def test_exact_search_cuda_refused_before_work():
    q, p = _vectors()
    with pytest.raises(DeviceError):
        exact_search(q, p, k=3, device=Device("cuda"))


def test_dense_system_and_fusion_pass_the_device():
    from tests.training.conftest import make_toy_store
    from treerank.search.specs import BuildContext, build_system
    from treerank.search.systems import DenseSystem

    store = make_toy_store()
    ref = build_system("cosine").retrieve(store, k=20)
    on = BuildContext(device=Device("auto"))
    sys_auto = build_system("cosine", on)
    assert isinstance(sys_auto, DenseSystem) and sys_auto.device == Device("auto")
    got = sys_auto.retrieve(store, k=20)
    if not CUDA:  # auto on a CPU machine is the CPU path exactly
        assert np.array_equal(got.ids, ref.ids) and np.array_equal(got.scores, ref.scores)
    fused = build_system("rrf:cosine+cosine", on)
    assert all(s.device == Device("auto") for s in (fused.a, fused.b))  # type: ignore[attr-defined]


def test_serve_refuses_a_bad_device_before_opening_the_store(tmp_path):
    from treerank.serve.service import SearchService, ServiceConfig

    with pytest.raises(DeviceError, match="expected a parsed Device"):
        SearchService(ServiceConfig(store=tmp_path / "missing", device="gpu"))  # type: ignore[arg-type]
    if not CUDA:
        with pytest.raises(DeviceError, match="cuda requested"):
            SearchService(ServiceConfig(store=tmp_path / "missing", device=Device("cuda")))


def test_one_default_everywhere():
    """The CLI option, the experiment YAML and every library signature default to one
    value (the CPU); nothing inspects signatures to decide whether to pass a device."""
    import inspect

    from treerank.cli.options import device_option
    from treerank.forest.index import ForestSystem
    from treerank.search.specs import BuildContext
    from treerank.search.systems import DenseSystem
    from treerank.training.heads import train_linear

    assert device_option().default == str(DEFAULT_DEVICE) == "cpu"
    assert BuildContext().device == DEFAULT_DEVICE
    for fn in (exact_search, DenseSystem, ForestSystem, train_linear):
        assert inspect.signature(fn).parameters["device"].default is DEFAULT_DEVICE
    assert not hasattr(device_mod, "takes_device")


# -------------------------------------------------- issue 36: one typed Device, one probe key
def test_parse_device_gives_one_typed_value():
    from treerank.kernels.device import Device, parse_device

    assert parse_device("cpu") == Device("cpu") and str(parse_device(" CPU ")) == "cpu"
    auto = parse_device("auto")
    assert auto == Device("auto") and auto.concrete() == Device("cuda" if CUDA else "cpu")
    assert auto.torch() == resolve_device(Device("auto"))
    for bad in ("gpu", "cuda:x", "mps", ""):
        with pytest.raises(DeviceError, match="device"):
            parse_device(bad)
    if not CUDA:  # checked at parse time: the CLI refuses before any work
        for spec in ("cuda", "cuda:7", "CUDA", " Cuda:0 "):
            with pytest.raises(DeviceError, match="cuda requested"):
                parse_device(spec)
    else:
        assert str(parse_device("CUDA:0")) == "cuda:0"


def test_probe_key_holds_what_changes_the_choice(monkeypatch):
    """The measured kernel choice is keyed by the probe's shape and the thread counts too: a
    measurement at 16 x 512 x 8 or with another thread count is never reused for another."""
    small = {"n_queries": 16, "n_passages": 512, "dim": 8, "k": 5, "repeats": 1}
    key = topk_mod._probe_key(small)
    assert topk_mod._probe_key(dict(small)) == key
    assert topk_mod._probe_key({**small, "n_passages": 16_384}) != key
    assert topk_mod._probe_key({**small, "dim": 384}) != key
    assert "numpy=" in key and "cpus=" in key and "faiss_threads=" in key
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert topk_mod._probe_key(small) != key
    finally:
        torch.set_num_threads(threads)
