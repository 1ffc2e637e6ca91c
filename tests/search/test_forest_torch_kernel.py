"""The torch counting kernel of the forest search against the numba kernel, exactly.

Both kernels accumulate the secondary score in float64 in model order and form the key the
same way, so the comparison is exact: the same ids, counts, secondary scores and keys (no
tolerance). The torch kernel runs here on the CPU (``backend="torch"``); the CUDA tests at the
end run it on a GPU and are skipped without one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import treerank.forest.torch_kernel as ftk
from tests.search.test_forest_index import random_tables, saved_random_forest
from tests.search.test_forest_probes import tables
from treerank.forest import index as forest_index
from treerank.forest.index import (
    ForestIndex,
    ForestSystem,
    count_kernel,
)
from treerank.forest.kernel import ID_BLOCK
from treerank.forest.model import SCORINGS, Forest, ForestConfig, ForestSearch
from treerank.kernels.device import Device, DeviceError

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

SEED_FIELDS = ("ids", "counts", "secondary", "scanned")


def test_numba_block_default_is_the_kernels() -> None:
    assert forest_index.ID_BLOCK == forest_index._ID_BLOCK == ID_BLOCK


@pytest.mark.parametrize(("seed", "m", "c", "k"), [(0, 12, 6, 25), (1, 7, 3, 400), (2, 30, 4, 1)])
def test_seed_search_torch_equals_numba(seed, m, c, k) -> None:
    """t = K = 1, the shipped order: few classes, so counts tie massively and the secondary
    score and the id decide; k = 400 > passages reaches the -1 padding."""
    qc, qp, pc, pp, c = random_tables(seed, m=m, c=c)
    index = ForestIndex.build(pc, pp, c)
    a = index.search(qc, qp, k)
    b = index.search(qc, qp, k, backend="torch", device=Device("cpu"))
    for f in SEED_FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    np.testing.assert_array_equal(a.scores(m), b.scores(m))
    assert b.keys is None and (a.ids >= 0).any()


def test_seed_search_small_query_blocks(monkeypatch) -> None:
    """The query block only bounds memory."""
    qc, qp, pc, pp, c = random_tables(4, nq=23, n=301)
    index = ForestIndex.build(pc, pp, c)
    ref = index.search(qc, qp, 40)
    monkeypatch.setattr(ftk, "CPU_BLOCK_ELEMENTS", 5 * 301)  # 5 queries per block
    got = index.search(qc, qp, 40, backend="torch")
    for f in SEED_FIELDS:
        np.testing.assert_array_equal(getattr(ref, f), getattr(got, f), err_msg=f)


@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize(("seed", "t", "kk"), [(0, 2, 2), (1, 3, 1), (2, 1, 3)])
def test_probes_every_scoring_torch_equals_numba(scoring, seed, t, kk) -> None:
    """Multi-probe (t) and multi-assignment (K), every scoring: identical ids, keys, counts."""
    qc, qp, floor, pc, pp = tables(seed, nq=20, n=260, m=5, c=6, t=t, kk=max(kk, 2))
    pc, pp = pc[:, :, :kk], pp[:, :, :kk]
    index = ForestIndex.build(pc, pp, 6)
    a = index.search_probes(qc, qp, floor, 60, scoring)
    b = index.search_probes(qc, qp, floor, 60, scoring, backend="torch")
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.scanned, b.scanned)
    assert (b.secondary == 0).all() and (a.ids >= 0).sum() > 100


def test_kernel_argument_errors() -> None:
    z = torch.zeros
    with pytest.raises(ValueError, match="probe 2 does not divide 3 lists"):
        ftk.count_topk_torch(z(2), z(0), z(0), z(1, 3), z(1, 3), 2, 5, 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        ftk.count_topk_torch(z(2), z(0), z(0), z(1, 3), z(1, 3), 1, 5, 0)
    with pytest.raises(ValueError, match="differ"):
        ftk.count_topk_torch(z(2), z(0), z(0), z(1, 3), z(2, 3), 1, 5, 3)
    assert ftk.default_block_elements(torch.device("cpu")) == ftk.CPU_BLOCK_ELEMENTS


def test_adding_passages_refreshes_the_lists() -> None:
    qc, qp, pc, pp, c = random_tables(5, n=200)
    index = ForestIndex.build(pc[:120], pp[:120], c)
    index.search(qc, qp, 30, backend="torch")  # caches the (n = 120) table
    index.add(pc[120:], pp[120:])
    full = ForestIndex.build(pc, pp, c).search(qc, qp, 30)
    np.testing.assert_array_equal(index.search(qc, qp, 30, backend="torch").ids, full.ids)


@pytest.mark.parametrize(
    "search",
    [ForestSearch(), ForestSearch(probe=2, assign=2, scoring="shipped"), ForestSearch(probe=2)],
)
def test_forest_system_torch_backend_equals_default(search) -> None:
    rng = np.random.default_rng(2)
    forest = Forest.random(ForestConfig(n_models=9, n_classes=4, dim=8), seed=3).with_search(search)
    store = _Store(
        rng.standard_normal((17, 8)).astype(np.float32),
        rng.standard_normal((150, 8)).astype(np.float32),
    )
    ref = ForestSystem(forest, chunk_size=40).retrieve(store, 60)
    got = ForestSystem(forest, chunk_size=40, device=Device("cpu"), backend="torch").retrieve(
        store, 60
    )
    np.testing.assert_array_equal(ref.ids, got.ids)
    np.testing.assert_array_equal(ref.scores, got.scores)


def test_count_kernel_choices() -> None:
    assert count_kernel() == (torch.device("cpu"), "numba")
    assert count_kernel(Device("cpu"), "torch") == (torch.device("cpu"), "torch")
    with pytest.raises(ValueError, match="unknown counting backend 'faiss'; known: auto"):
        count_kernel(Device("cpu"), "faiss")
    with pytest.raises(ValueError, match="unknown counting backend"):
        ForestSystem(Forest.random(ForestConfig(2, 3, 4)), backend="gpu")


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_cuda_refused_before_work_without_cuda() -> None:
    forest = Forest.random(ForestConfig(2, 3, 4))
    with pytest.raises(DeviceError, match="cuda requested"):
        ForestSystem(forest, device=Device("cuda"))
    with pytest.raises(DeviceError, match="cuda requested"):
        forest.query_classes(np.zeros((2, 4), np.float32), device=Device("cuda"))


def test_ckpt_system_passes_the_device_to_the_forest(tmp_path) -> None:
    """``build_system("ckpt:...", BuildContext(device=..., checkpoints=CHECKPOINTS))`` (the
    evaluate stage's call) builds the forest's system on that device."""
    from treerank.families import CHECKPOINTS
    from treerank.search.specs import BuildContext, build_system

    forest, store = saved_random_forest(tmp_path / "f", 4, 5, 6, 50)
    on_cpu = BuildContext(device=Device("cpu"), checkpoints=CHECKPOINTS)
    system = build_system(f"ckpt:{tmp_path / 'f'}", on_cpu)
    inner = system.system_for(store)  # type: ignore[attr-defined]
    assert isinstance(inner, ForestSystem) and inner.device == Device("cpu")
    np.testing.assert_array_equal(
        system.retrieve(store, 50).ids, ForestSystem(forest).retrieve(store, 50).ids
    )
    if not CUDA:
        with pytest.raises(DeviceError, match="cuda requested"):
            on_cuda = BuildContext(device=Device("cuda"), checkpoints=CHECKPOINTS)
            build_system(f"ckpt:{tmp_path / 'f'}", on_cuda).system_for(  # type: ignore[attr-defined]
                store
            )


class _Store:
    def __init__(self, q: np.ndarray, p: np.ndarray) -> None:
        self.queries, self.passages = q, p

    def iter_passage_chunks(self, chunk_size):
        for s in range(0, len(self.passages), chunk_size):
            yield s, self.passages[s : s + chunk_size]


# ---- on a GPU (skipped without CUDA) ---------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("scoring", SCORINGS)
def test_cuda_counting_equals_cpu(scoring) -> None:
    """Same class tables, counted on the GPU and by the numba kernel: identical ids and keys."""
    qc, qp, floor, pc, pp = tables(6, nq=40, n=3000, m=6, c=5, t=2, kk=2)
    index = ForestIndex.build(pc, pp, 5)
    a = index.search_probes(qc, qp, floor, 100, scoring)
    b = index.search_probes(qc, qp, floor, 100, scoring, device=Device("cuda"))
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.keys, b.keys)
    q1, p1 = qc[:, :, 0], qp[:, :, 0]
    one = ForestIndex.build(pc[:, :, 0], pp[:, :, 0], 5)
    a1, b1 = one.search(q1, p1, 100), one.search(q1, p1, 100, device=Device("cuda"))
    for f in SEED_FIELDS:
        np.testing.assert_array_equal(getattr(a1, f), getattr(b1, f), err_msg=f)
    assert count_kernel(Device("cuda")) == (torch.device("cuda", 0), "torch")
    with pytest.raises(ValueError, match="the numba kernel runs on the CPU only"):
        one.search(q1, p1, 100, device=Device("cuda"), backend="numba")


@needs_cuda
def test_cuda_forest_system_agrees_with_cpu() -> None:
    """Classification on the GPU (float32 softmax) may differ from the CPU's in the last bits:
    the argmax classes agree (>= 99.9% of the decisions), the class probabilities within 1e-6
    where they do, and the runs rank the same passages except where two secondary scores are
    within float32 rounding (the run scores at a differing rank within 1e-5)."""
    rng = np.random.default_rng(7)
    forest = Forest.random(ForestConfig(n_models=16, n_classes=8, dim=32), seed=1)
    q = rng.standard_normal((50, 32)).astype(np.float32)
    p = rng.standard_normal((2000, 32)).astype(np.float32)
    for cpu_side, gpu_side in (
        (forest.query_classes(q), forest.query_classes(q, device=Device("cuda"))),
        (forest.passage_classes(p), forest.passage_classes(p, device=Device("cuda"))),
    ):
        same = cpu_side[0] == gpu_side[0]
        assert same.mean() >= 0.999
        np.testing.assert_allclose(cpu_side[1][same], gpu_side[1][same], rtol=0, atol=1e-6)
    store = _Store(q, p)
    cpu = ForestSystem(forest).retrieve(store, 100)
    gpu = ForestSystem(forest, device=Device("cuda")).retrieve(store, 100)
    differ = cpu.ids != gpu.ids
    assert differ.mean() < 0.05
    gap = np.abs(cpu.scores[differ] - gpu.scores[differ])
    assert float(gap.max(initial=0.0)) < 1e-5
