"""Trainers on a device, and training data read through the memory map in blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.conftest import ToyStore, make_toy_store
from treerank.kernels import rows as rows_mod
from treerank.kernels.device import Device, DeviceError
from treerank.kernels.rows import RowSource, StackedRows
from treerank.models.linear import LinearHead
from treerank.models.mlp import MLPHead
from treerank.training.drt import train_drt
from treerank.training.heads import train_head

CUDA = torch.cuda.is_available()
CFG = {"seed": 3, "data": {"batch_size": 16}, "trainer": {"epochs": 2, "patience": None}}
DRT_CFG = {
    "seed": 1,
    "model": {"k": 4, "slot_dim": 8, "hidden": 32, "slot_dropout": 0.25},
    "data": {"batch_size": 16},
    "trainer": {"epochs": 2, "patience": None},
}


class GuardedRows:
    """A store array that serves row gathers only: a full read, a slice or a gather of more
    than ``max_rows`` rows fails the test; counts the rows it served."""

    def __init__(self, array: np.ndarray, max_rows: int) -> None:
        self._a, self.max_rows = array, max_rows
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, 2
        self.rows_served = 0

    def __array__(self, *a, **kw):
        raise AssertionError("the whole array was read")

    def __getitem__(self, idx):
        if not isinstance(idx, np.ndarray) or idx.ndim != 1:
            raise AssertionError(f"not a row gather: {type(idx).__name__}")
        if idx.size > self.max_rows:
            raise AssertionError(f"{idx.size} rows read at once (max {self.max_rows})")
        self.rows_served += int(idx.size)
        return self._a[idx]


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_equal_states(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("head_class", [LinearHead, MLPHead])
def test_device_cpu_equals_default(head_class):
    store = make_toy_store()
    a = train_head(head_class, store, CFG, progress=False)
    b = train_head(head_class, store, CFG, progress=False, device=Device("cpu"))
    _assert_equal_states(_state(a.model), _state(b.model))


def test_device_auto_on_cpu_machine_equals_default():
    if CUDA:
        pytest.skip("auto is the GPU here")
    store = make_toy_store()
    a = train_drt(store, DRT_CFG, progress=False)
    b = train_drt(store, DRT_CFG, progress=False, device=Device("auto"))
    _assert_equal_states(_state(a.model), _state(b.model))


@pytest.mark.skipif(CUDA, reason="machine without CUDA")
def test_cuda_refused_without_cuda():
    with pytest.raises(DeviceError, match="cuda"):
        train_head(LinearHead, make_toy_store(), CFG, progress=False, device=Device("cuda"))


@pytest.mark.parametrize("trainer", ["linear", "mlp", "drt"])
def test_row_gathers_never_read_the_split_whole(trainer):
    """Training through row gathers only (batch-sized) gives byte-identical weights."""
    base = make_toy_store()
    q, p = base.queries, base.passages
    gq, gp = GuardedRows(q, max_rows=16), GuardedRows(p, max_rows=16 * 2)
    guarded = ToyStore(gq, gp, base.candidates, base.labels)  # type: ignore[arg-type]

    def run(store):
        if trainer == "drt":
            return train_drt(store, DRT_CFG, progress=False)
        return train_head(
            LinearHead if trainer == "linear" else MLPHead, store, CFG, progress=False
        )

    ref, got = run(base), run(guarded)
    _assert_equal_states(_state(ref.model), _state(got.model))
    assert gq.rows_served > 0 and gp.rows_served > 0


def test_memmap_split_above_the_limit_is_gathered_identically(tmp_path, monkeypatch):
    base = make_toy_store()
    paths = {}
    for name in ("queries", "passages"):
        arr = getattr(base, name)
        path = tmp_path / f"{name}.bin"
        arr.tofile(path)
        paths[name] = np.memmap(path, dtype=np.float32, mode="r", shape=arr.shape)
    mm = ToyStore(paths["queries"], paths["passages"], base.candidates, base.labels)
    ref = train_head(MLPHead, base, CFG, progress=False)
    monkeypatch.setattr(rows_mod, "IN_MEMORY_BYTES", 0)  # every split "larger than memory"
    got = train_head(MLPHead, mm, CFG, progress=False)
    _assert_equal_states(_state(ref.model), _state(got.model))


def test_row_source_gathers_and_releases(tmp_path):
    a = np.arange(64 * 5, dtype=np.float32).reshape(64, 5)
    a.tofile(tmp_path / "a.bin")
    mm = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="r", shape=a.shape)
    src = RowSource(mm, in_memory_bytes=0, release_bytes=40)
    assert not src.in_memory
    rows = np.array([5, 3, 5, 63, -1])
    np.testing.assert_array_equal(src.gather(rows), a[rows])
    np.testing.assert_array_equal(src[2:4], a[2:4])
    assert src.rows_read == 4 + 2  # unique rows per gather
    assert RowSource(mm).in_memory and not isinstance(RowSource(mm).array, np.memmap)
    with pytest.raises(IndexError):
        src.gather(np.array([64]))


def test_stacked_rows():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = -np.arange(6, dtype=np.float32).reshape(2, 3)
    s = StackedRows(a, b)
    assert s.shape == (6, 3)
    rows = np.array([5, 0, 4, 3])
    np.testing.assert_array_equal(s[rows], np.concatenate([a, b])[rows])
    np.testing.assert_array_equal(np.asarray(s), np.concatenate([a, b]))
    with pytest.raises(ValueError, match="dims differ"):
        StackedRows(a, np.zeros((2, 4), np.float32))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("trainer", ["linear", "drt"])
def test_cuda_training_agrees_with_cpu(trainer):
    """Same init, same batches, same dropout masks: weights within 1e-4 after two epochs."""
    store = make_toy_store()

    def run(device):
        if trainer == "drt":
            return train_drt(store, DRT_CFG, progress=False, device=device)
        return train_head(LinearHead, store, CFG, progress=False, device=device)

    a, b = _state(run("cpu").model), _state(run("cuda").model)
    for k in a:
        assert b[k].device.type == "cpu"
        torch.testing.assert_close(b[k], a[k], atol=1e-4, rtol=1e-4)
