"""Forest training on a torch device: ``Device("cpu")`` is the CPU path exactly; a GPU run agrees
with the CPU within a stated tolerance (skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.conftest import make_toy_store
from tests.training.test_forest import SMALL, sectioned
from treerank.forest.trainer import train_forest
from treerank.kernels.device import Device, DeviceError

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# every device-sensitive path: dropout masks (whole side and packed per block), a hidden layer,
# several row blocks, the not-retrievable terms, the passage balance term, boosting over groups
BUSY = {
    **SMALL,
    "n_models": 3,
    "group_size": 2,
    "dropout": 0.3,
    "hidden": [6],
    "chunk_size": 23,
    "nr_weight": 1.0,
    "passage_uniformity_weight": 0.5,
    "steps_query": 6,
    "steps_passage": 6,
    "steps_joint": 4,
}

GPU_WEIGHT_ATOL = 1e-3
"""Largest |w_gpu - w_cpu| of a trained pair: the same draws on both devices, float32 on both,
only the order of the reductions differs (the CPU's own block-size change moves the weights by
< 2e-5, ``test_blocked_full_batch_gradient_equals_one_block``)."""


def _state(forest):
    return forest.state_dict()


@pytest.mark.parametrize("mode", ["joint", "alternate"])
def test_device_cpu_is_the_default_path_exactly(mode) -> None:
    store = make_toy_store()
    cfg = sectioned({**BUSY, "joint_mode": mode})
    ref = train_forest(store, cfg, progress=False)
    got = train_forest(store, cfg, progress=False, device=Device("cpu"))
    a, b = _state(ref.model), _state(got.model)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
        assert b[key].device.type == "cpu"
    pairs = [(r, g) for r, g in zip(ref.records, got.records, strict=True) if r["kind"] == "pair"]
    for r, g in pairs:
        assert r["loss_joint"] == g["loss_joint"] and r["train_match_rate"] == g["train_match_rate"]


@pytest.mark.skipif(CUDA, reason="auto is cuda on this machine")
def test_device_auto_without_cuda_is_the_cpu() -> None:
    store = make_toy_store()
    cfg = sectioned({**SMALL, "n_models": 1, "group_size": 1})
    a = _state(train_forest(store, cfg, progress=False).model)
    b = _state(train_forest(store, cfg, progress=False, device=Device("auto")).model)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_cuda_refused_before_any_work_without_cuda() -> None:
    class Untouchable:  # any read of the store fails: the refusal comes first
        def __getattr__(self, name):
            raise AssertionError(f"the store was read ({name}) before the device was checked")

    with pytest.raises(DeviceError, match="cuda requested but torch.cuda.is_available"):
        train_forest(Untouchable(), sectioned(SMALL), progress=False, device=Device("cuda"))
    with pytest.raises(DeviceError, match="expected a parsed Device, got str 'gpu'"):
        train_forest(Untouchable(), sectioned(SMALL), progress=False, device="gpu")  # type: ignore[arg-type]


@needs_cuda
def test_cuda_pair_agrees_with_cpu() -> None:
    """One pair (no boosting feedback between groups) on the GPU and on the CPU: the same
    init, bags, negatives and dropout masks, weights within ``GPU_WEIGHT_ATOL``."""
    store = make_toy_store()
    cfg = sectioned({**BUSY, "n_models": 1, "group_size": 1})
    cpu = train_forest(store, cfg, progress=False, device=Device("cpu"))
    gpu = train_forest(store, cfg, progress=False, device=Device("cuda"))
    a, b = _state(cpu.model), _state(gpu.model)
    for key in a:
        assert b[key].device.type == "cpu"  # the trained forest comes back on the CPU
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=GPU_WEIGHT_ATOL)
    qa, _ = cpu.model.query_classes(store.queries)
    qb, _ = gpu.model.query_classes(store.queries)
    assert (qa == qb).mean() >= 0.98


@needs_cuda
def test_cuda_group_with_boosting_trains() -> None:
    """Several groups on the GPU (boosting bookkeeping classified there): a usable forest whose
    training match rate is the CPU's within 0.1."""
    store = make_toy_store()
    cfg = sectioned(BUSY)
    cpu = train_forest(store, cfg, progress=False, device=Device("cpu")).summary
    gpu = train_forest(store, cfg, progress=False, device=Device("cuda")).summary
    assert np.isfinite(gpu["final_train_match_rate_mean"])
    assert abs(gpu["final_train_match_rate_mean"] - cpu["final_train_match_rate_mean"]) <= 0.1


def test_pipeline_passes_the_device_to_the_trainer_and_the_validator(tmp_path, monkeypatch):
    """``train_model(device=)`` reaches ``train_forest`` and the held-out validator's
    ForestSystem (the forest's train stage; its stage key holds the device:
    ``tests/pipeline/test_stage_graph.py``)."""
    import treerank.forest.index as fi
    import treerank.forest.trainer as tf
    from treerank.tasks.train import train_model

    seen: dict[str, list] = {"train": [], "system": []}
    real_train, real_init = tf.train_forest, fi.ForestSystem.__init__

    def spy_train(*args, device=None, **kw):  # declares device=, as train_forest does
        seen["train"].append(device)
        return real_train(*args, device=device, **kw)

    def spy_init(self, *args, device=None, **kw):
        seen["system"].append(device)
        real_init(self, *args, device=device, **kw)

    import dataclasses

    from treerank.families import FAMILIES, FamilyEntry, family

    forest = family("forest")  # the family holds train_forest itself: replace its entry
    spied = dataclasses.replace(forest, trainer=spy_train)
    monkeypatch.setitem(FAMILIES, "forest", FamilyEntry("forest", True, lambda: spied))
    monkeypatch.setattr(fi.ForestSystem, "__init__", spy_init)
    cfg = sectioned({**SMALL, "n_models": 2, "validation": {"fraction": 0.25, "k": 20}})
    res = train_model(
        "forest", make_toy_store(), cfg, tmp_path / "m", progress=False, device=Device("cpu")
    )
    assert seen["train"] == [Device("cpu")]
    assert seen["system"] and set(seen["system"]) == {Device("cpu")}
    assert [p["n_models"] for p in res.summary["curve"]] == [1, 2]
