"""Data-parallel training: 2 gloo processes with batch B == 1 process with batch 2B."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.distributed import workers
from tests.distributed.helpers import torchrun
from treerank.training.trainer import compute_loss, fit


def _reference(store, family: str) -> dict[str, np.ndarray]:
    """One process, global batch 2B: the first batch's loss and gradients, and a 3-step fit."""
    torch.set_num_threads(1)
    model = workers.make_model(family, store.dim)
    batch = next(iter(workers.make_sampler(store, 2 * workers.B).epoch(0)))
    q = torch.from_numpy(np.asarray(store.queries)[batch.query_rows])
    p = torch.from_numpy(np.asarray(store.passages)[batch.passage_rows])
    loss, _ = compute_loss(model, batch, q, p, symmetric_weight=0.5)
    loss.backward()
    out = {f"grad/{n}": prm.grad.numpy().copy() for n, prm in model.named_parameters()}
    out["loss"] = np.array(float(loss.detach()))
    out["batch_shape"] = np.array(batch.size)
    model = workers.make_model(family, store.dim)
    res = fit(
        model,
        workers.make_sampler(store, 2 * workers.B),
        store.queries,
        store.passages,
        workers.trainer_config(),
        progress=False,
    )
    out.update({f"state/{k}": v.numpy().copy() for k, v in model.state_dict().items()})
    out["fit_losses"] = np.array([r["loss"] for r in res.records if r["kind"] == "train"])
    return out


@pytest.fixture(scope="module")
def two_process_run(scifact_store, tmp_path_factory):
    """One torchrun of 2 gloo processes training both families; its exit status and outputs."""
    out = tmp_path_factory.mktemp("dist-train")
    proc = torchrun(["train", str(scifact_store["train"].path), str(out), "linear", "mlp", "drt"])
    return proc, out


def test_processes_exit_cleanly(two_process_run):
    proc, _ = two_process_run
    assert proc.returncode == 0, proc.stderr[-3000:]  # torchrun: 0 only if both ranks exit 0
    assert "Traceback" not in proc.stderr and "abort" not in proc.stderr.lower()


@pytest.mark.parametrize("family", ["linear", "mlp", "drt"])
def test_two_processes_equal_one_process_with_double_batch(scifact_store, two_process_run, family):
    proc, out = two_process_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = scifact_store["train"]
    ref = _reference(store, family)
    ranks = [dict(np.load(out / f"{family}-rank{r}.npz")) for r in (0, 1)]
    grad_keys = [k for k in ref if k.startswith("grad/")]
    # the learned temperature acts after the gather: its gradient must not be counted twice
    assert ("grad/log_scale" in grad_keys) == (family == "linear")
    assert int(ref["batch_shape"][1]) > 2 * workers.B  # hard negatives widen M past 2B
    for rank in ranks:
        np.testing.assert_array_equal(rank["batch_shape"], ref["batch_shape"])
        assert abs(float(rank["loss"]) - float(ref["loss"])) < 1e-5
        for k in grad_keys:
            assert np.abs(ref[k]).max() > 1e-4, k  # a gradient that is really there
            np.testing.assert_allclose(rank[k], ref[k], rtol=0, atol=1e-5, err_msg=k)
        np.testing.assert_allclose(rank["fit_losses"], ref["fit_losses"], rtol=0, atol=1e-5)
        assert len(ref["fit_losses"]) == workers.FIT_STEPS
        for k in (k for k in ref if k.startswith("state/")):
            np.testing.assert_allclose(rank[k], ref[k], rtol=0, atol=1e-5, err_msg=k)
    for k in grad_keys:  # DDP left the same averaged gradient on both ranks
        np.testing.assert_array_equal(ranks[0][k], ranks[1][k])
    assert int(ranks[0]["comm_bytes"]) > 0
