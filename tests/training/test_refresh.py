"""Model-refreshed negatives: the audit sets the guard, the pool follows, fit calls it on time."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.training.refresh import NegativeRefresher
from treerank.training.sampler import ContrastiveSampler
from treerank.training.trainer import TrainerConfig, fit

# 4 queries, 8 passages; query i's positive is passage i
CAND = np.arange(4, dtype=np.int32)[:, None]
LAB = np.ones((4, 1), dtype=np.uint8)


def test_refresh_guard_comes_from_the_audit():
    sampler = ContrastiveSampler(CAND, LAB, batch_size=2, n_hard=1)
    assert sampler.hard_pool is None
    # every query's positive sits at rank 1 or 2 of the miner: f(1) = f(2) = 1/2, then 0
    ranked = np.array(
        [[0, 4, 5, 6, 7], [4, 1, 5, 6, 7], [2, 4, 5, 6, 7], [5, 3, 4, 6, 7]], dtype=np.int64
    )
    ref = NegativeRefresher(sampler, CAND, LAB, lambda m: ranked, max_rate=0.3, pool_depth=10)
    info = ref(None, step=7)
    assert info["guard_depth"] == 2 and info["fn_rate_at_1"] == 0.5
    assert info["fn_rate_in_pool"] == 0.0
    # pool = ranks 3..5 minus labelled ones
    np.testing.assert_array_equal(sampler.hard_pool, [[5, 6, 7]] * 3 + [[4, 6, 7]])
    # a looser tolerance keeps the top ranks (labelled ones still removed)
    NegativeRefresher(sampler, CAND, LAB, lambda m: ranked, max_rate=0.6, pool_depth=2)(None, 8)
    np.testing.assert_array_equal(sampler.hard_pool, [[4, 5], [4, 5], [4, 5], [5, 4]])


def test_fit_calls_refresh_every_n_steps(scifact_store):
    import torch

    from treerank.models.linear import LinearHead

    st = scifact_store["train"]
    cand, lab = np.asarray(st.candidates), np.asarray(st.labels)
    sampler = ContrastiveSampler(cand, lab, batch_size=32, n_hard=2)
    calls = []

    def mine(model):  # the current model's exact ranking (brute force on 5,183 passages)
        q = model.encode_queries(np.asarray(st.queries, dtype=np.float32))
        p = model.encode_passages(np.asarray(st.passages, dtype=np.float32))
        calls.append(1)
        return np.argsort(-(q @ p.T), axis=1, kind="stable")[:, :20]

    ref = NegativeRefresher(sampler, cand, lab, mine, max_rate=0.05, pool_depth=10)
    torch.manual_seed(0)
    cfg = TrainerConfig(max_steps=12, refresh_every=5, patience=None, log_every=1)
    res = fit(
        LinearHead(st.dim), sampler, st.queries, st.passages, cfg, refresh=ref, progress=False
    )
    assert len(calls) == 2 and [h["step"] for h in ref.history] == [5, 10]
    logged = [r for r in res.records if r["kind"] == "refresh"]
    assert [r["step"] for r in logged] == [5, 10] and logged[0]["guard_depth"] >= 1
    assert sampler.hard_pool is not None and sampler.hard_pool.shape == (st.n_queries, 10)


def test_refresh_on_rate_change_re_mines_only_when_the_audit_moves():
    """With ``rate_change``, a call audits the audit queries and re-mines the pool only when
    f(1) moved by more than the tolerance or the guard depth changed."""
    sampler = ContrastiveSampler(CAND, LAB, batch_size=2, n_hard=1)
    # stage 0: positives at rank 1 or 2 (f(1) = 1/2, guard 2); stage 1: a near copy (one
    # negative reordered, same audit); stage 2: every positive at rank 1 (f(1) = 1, guard 1)
    stages = [
        np.array([[0, 4, 5, 6, 7], [4, 1, 5, 6, 7], [2, 4, 5, 6, 7], [5, 3, 4, 6, 7]]),
        np.array([[0, 4, 6, 5, 7], [4, 1, 5, 6, 7], [2, 4, 5, 6, 7], [5, 3, 4, 6, 7]]),
        np.array([[0, 4, 5, 6, 7], [1, 4, 5, 6, 7], [2, 4, 5, 6, 7], [3, 5, 4, 6, 7]]),
    ]
    state = {"stage": 0, "full": 0, "audit": 0}

    def mine(model):
        state["full"] += 1
        return stages[state["stage"]]

    def audit_mine(model):  # audit rows = queries 0..3, the same ranking
        state["audit"] += 1
        return stages[state["stage"]]

    ref = NegativeRefresher(
        sampler,
        CAND,
        LAB,
        mine,
        max_rate=0.3,
        pool_depth=10,
        rate_change=0.1,
        audit_mine=audit_mine,
    )
    first = ref(None, step=5)  # the first call always mines
    assert first["refreshed"] and first["fn_rate_at_1"] == 0.5 and state["full"] == 1
    pool = sampler.hard_pool.copy()
    state["stage"] = 1
    same = ref(None, step=10)  # f(1) and guard unchanged: no re-mining, the pool stays
    assert not same["refreshed"] and state == {"stage": 1, "full": 1, "audit": 1}
    np.testing.assert_array_equal(sampler.hard_pool, pool)
    state["stage"] = 2
    moved = ref(None, step=15)  # f(1) 0.5 -> 1.0: re-mined, new guard, new pool
    assert moved["refreshed"] and moved["fn_rate_at_1"] == 1.0 and moved["guard_depth"] == 1
    assert state["full"] == 2 and state["audit"] == 2
    np.testing.assert_array_equal(sampler.hard_pool, [[4, 5, 6, 7]] * 3 + [[5, 4, 6, 7]])
    assert [h["step"] for h in ref.history] == [5, 15]
    assert [c["step"] for c in ref.checks] == [10, 15]
    # a tolerance wider than the change still re-mines when the guard depth changes
    ref2 = NegativeRefresher(
        ContrastiveSampler(CAND, LAB, batch_size=2, n_hard=1),
        CAND,
        LAB,
        lambda m: stages[2 if ref2.history else 0],
        max_rate=0.3,
        pool_depth=10,
        rate_change=0.9,
    )
    ref2(None, 1)
    assert ref2(None, 2)["refreshed"]  # |1.0 - 0.5| < 0.9, but guard 2 -> 1
    with pytest.raises(ValueError, match="rate_change"):
        NegativeRefresher(sampler, CAND, LAB, mine, rate_change=-0.1)
