"""The sharded search takes its process group as an argument; no process-global hook is read.

One process can check the argument path end to end: a one-rank gloo group (``W = 1``) runs the
real all-gather and merge, which must give exactly the one-process top-k; the two-process
equality is ``tests/distributed/test_search.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import treerank.distributed.context as context
from treerank.distributed.context import DistContext
from treerank.kernels.sharded import sharded_exact_search
from treerank.kernels.topk import exact_search
from treerank.models.cosine import CosineScorer
from treerank.search import systems
from treerank.search.specs import BuildContext, build_system
from treerank.search.systems import DenseSystem


def _vectors() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    q = rng.standard_normal((5, 8)).astype(np.float32)
    p = np.round(rng.standard_normal((40, 8)) * 2).astype(np.float32) / 2  # ties in the scores
    return q, p


@pytest.fixture
def one_rank(tmp_path: Path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        yield DistContext(0, 1, "gloo", torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def test_the_kernel_reads_no_global_hook() -> None:
    assert not hasattr(context, "use_search_hook") and not hasattr(context, "search_hook")


def test_a_one_rank_group_merges_to_the_one_process_top_k(one_rank: DistContext) -> None:
    q, p = _vectors()
    ref_ids, ref_scores = exact_search(q, p, k=7)
    ids, scores = sharded_exact_search(q, p, 7, ctx=one_rank)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores)
    # no group given: the one-process search, even while a group is running
    ids0, _ = sharded_exact_search(q, p, 7, ctx=None)
    np.testing.assert_array_equal(ids0, ref_ids)


def test_dense_systems_get_the_shard_from_build_system(monkeypatch) -> None:
    seen: list[object] = []

    def recording(queries, passages, k=1000, *, ctx=None, **kw):
        seen.append(ctx)
        return exact_search(queries, passages, k, **kw)

    monkeypatch.setattr(systems, "sharded_exact_search", recording)
    marker = DistContext(0, 2, "gloo", torch.device("cpu"))
    fused = build_system("rrf:bm25+cosine", BuildContext(shard=marker))
    assert isinstance(fused.b, DenseSystem) and fused.b.shard is marker

    class Store:
        n_passages = 40
        path = "mem"

    st = Store()
    q, p = _vectors()
    st.queries, st.passages = q, p  # type: ignore[attr-defined]
    got = DenseSystem(CosineScorer(), shard=marker).retrieve(st, 6)  # type: ignore[arg-type]
    ref = DenseSystem(CosineScorer()).retrieve(st, 6)  # type: ignore[arg-type]
    assert seen == [marker]
    np.testing.assert_array_equal(got.ids, ref.ids)
