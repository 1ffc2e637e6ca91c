"""The forest's stage gradients in blocks equal the whole-tensor losses, in bounded memory."""

from __future__ import annotations

import pytest
import torch

from treerank.forest.config import ForestTrainConfig
from treerank.forest.losses import (
    EPS,
    not_retrievable_loss,
    sharpness_loss,
    uniformity_loss,
    weighted_mean,
)
from treerank.forest.stages import StageInputs, stage_backward, stage_gradient

G, NQ, NP, C = 2, 13, 17, 5


def _inputs(seed: int = 0, nq: int = NQ, n_p: int = NP, e_pos: int = 10, e_neg: int = 23):
    gen = torch.Generator().manual_seed(seed)
    wanted = torch.zeros(G, n_p, dtype=torch.bool)
    pos_p = torch.randint(0, n_p // 2, (e_pos,), generator=gen)
    wanted[:, pos_p] = True
    return StageInputs(
        qmask=(torch.rand(G, nq, generator=gen) < 0.7).float(),
        pmask=(torch.rand(G, n_p, generator=gen) < 0.8).float(),
        wanted=wanted,
        pos_q=torch.randint(0, nq, (e_pos,), generator=gen),
        pos_p=pos_p,
        pos_w=torch.rand(G, e_pos, generator=gen) + 0.5,
        neg_q=torch.randint(0, nq, (e_neg,), generator=gen),
        neg_p=torch.randint(0, n_p, (e_neg,), generator=gen),
        neg_w=(torch.rand(G, e_neg, generator=gen) < 0.8).float() * 0.7,
    )


def _reference(stage: str, cfg: ForestTrainConfig, g: StageInputs, z, target=None):
    """The whole-tensor loss (the formulas of forest_losses), summed over the group."""

    def query_terms(pq):
        w = g.qmask
        pbar = (pq * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp_min(EPS)
        t = cfg.trainer
        out = t.uniformity_weight * uniformity_loss(pbar, t.uniformity)
        return out + t.sharpness_weight * sharpness_loss(pq, w)

    def passage_terms(pp, neg_class):
        t = cfg.trainer
        out = t.nr_penalty * weighted_mean(pp[..., -1], g.pmask)
        out = out + t.nr_weight * not_retrievable_loss(
            pp, g.neg_p, neg_class, g.neg_w, g.wanted, g.pmask
        )
        real = pp[..., :-1] * g.pmask.unsqueeze(-1)
        pbar = real.sum(1) / real.sum((1, 2)).clamp_min(EPS).unsqueeze(-1)
        return out + t.passage_uniformity_weight * uniformity_loss(pbar, t.uniformity)

    rows = torch.arange(G).unsqueeze(1)
    if stage == "query":
        return query_terms(torch.softmax(z[0], -1)).sum()
    if stage == "passage":
        logp = torch.log_softmax(z[0], -1)
        lp_pos = logp[rows, g.pos_p.unsqueeze(0), target[:, g.pos_q]]
        lp_neg = logp[rows, g.neg_p.unsqueeze(0), target[:, g.neg_q]]
        out = weighted_mean(-lp_pos, g.pos_w)
        out = out + weighted_mean(-torch.log1p(-lp_neg.exp().clamp_max(1 - 1e-6)), g.neg_w)
        return (out + passage_terms(logp.exp(), target[:, g.neg_q])).sum()
    pq, pp = torch.softmax(z[0], -1), torch.softmax(z[1], -1)
    s_pos = (pq[:, g.pos_q] * pp[:, g.pos_p, :-1]).sum(-1)
    s_neg = (pq[:, g.neg_q] * pp[:, g.neg_p, :-1]).sum(-1)
    out = weighted_mean(-torch.log(s_pos.clamp_min(EPS)), g.pos_w)
    out = out + weighted_mean(-torch.log1p(-s_neg.clamp_max(1 - 1e-6)), g.neg_w)
    out = out + query_terms(pq)
    return (out + passage_terms(pp, pq.argmax(-1)[:, g.neg_q])).sum()


CFG = ForestTrainConfig.of(nr_weight=0.5, nr_penalty=0.3, sharpness_weight=0.5)


@pytest.mark.parametrize("stage", ["query", "passage", "joint"])
@pytest.mark.parametrize("chunk", [4, 1000])
@pytest.mark.parametrize("uniformity", ["entropy", "gini"])
def test_blocked_stage_gradient_equals_whole_tensor_loss(stage, chunk, uniformity) -> None:
    cfg = CFG.replace(uniformity=uniformity)
    g = _inputs()
    gen = torch.Generator().manual_seed(1)
    zq = 2 * torch.randn(G, NQ, C, generator=gen)
    zp = 2 * torch.randn(G, NP, C + 1, generator=gen)
    zp[..., -1] -= 1.0
    z = {"query": [zq], "passage": [zp], "joint": [zq, zp]}[stage]
    target = torch.randint(0, C, (G, NQ), generator=gen)
    leaves = [t.clone().requires_grad_(True) for t in z]
    ref = _reference(stage, cfg, g, leaves, target)
    ref.backward()
    grads = [torch.zeros_like(t) for t in z]
    value = stage_gradient(stage, cfg, g, z, grads, chunk, target=target)
    assert value == pytest.approx(float(ref.detach()), rel=1e-5)
    for leaf, grad in zip(leaves, grads, strict=True):
        assert leaf.grad is not None and leaf.grad.abs().max() > 0
        torch.testing.assert_close(grad, leaf.grad, rtol=1e-4, atol=1e-6)


def _max_saved(fn) -> int:
    """Elements of the largest tensor autograd keeps for a backward pass while ``fn`` runs."""
    sizes = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def test_stage_gradient_memory_is_bounded_by_the_chunk() -> None:
    """No autograd graph of the blocked joint round holds more than a block: ``G x chunk x
    (C + 1)`` elements, against ``G x nP x (C + 1)`` for the whole-tensor loss."""
    nq, n_p, chunk = 400, 3000, 50
    g = _inputs(nq=nq, n_p=n_p, e_pos=400, e_neg=3000)
    z = [torch.randn(G, nq, C), torch.randn(G, n_p, C + 1)]
    grads = [torch.zeros_like(t) for t in z]
    blocked = _max_saved(lambda: stage_gradient("joint", CFG, g, z, grads, chunk))
    assert 0 < blocked <= G * chunk * (C + 1)
    leaves = [t.clone().requires_grad_(True) for t in z]
    whole = _max_saved(lambda: _reference("joint", CFG, g, leaves).backward())
    assert whole >= G * n_p * (C + 1)


def test_unknown_stage_and_missing_target_are_errors() -> None:
    g = _inputs()
    z = [torch.zeros(G, NP, C + 1)]
    with pytest.raises(ValueError, match="needs the query classes"):
        stage_gradient("passage", CFG, g, z, [torch.zeros_like(z[0])], 4)
    with pytest.raises(ValueError, match="unknown stage"):
        stage_gradient("sideways", CFG, g, z, [torch.zeros_like(z[0])], 4)


@pytest.mark.parametrize("stage", ["query", "passage", "joint"])
def test_dropping_examples_no_pair_weighs_changes_no_loss_or_gradient(stage) -> None:
    """``in_bag_examples`` (what ``build_group`` applies) keeps the loss and the gradient of
    every stage: an example with weight 0 in every pair of the group adds exactly nothing."""
    import dataclasses

    import numpy as np

    from treerank.forest.data import in_bag_examples

    g = _inputs(seed=3, e_pos=40, e_neg=90)
    # out-of-bag examples: zero weight in both pairs for a third of the columns
    pos_w, neg_w = g.pos_w.clone(), g.neg_w.clone()
    pos_w[:, ::3] = 0.0
    neg_w[:, 1::3] = 0.0
    full = dataclasses.replace(g, pos_w=pos_w, neg_w=neg_w)
    kept = {}
    for side, (q, p, w) in {
        "pos": (g.pos_q, g.pos_p, pos_w),
        "neg": (g.neg_q, g.neg_p, neg_w),
    }.items():
        kq, kp, kw = in_bag_examples(q.numpy(), p.numpy(), w.numpy())
        assert kw.shape[1] == int((w > 0).any(0).sum()) < w.shape[1]
        assert np.all((kw > 0).any(0))
        kept[side] = (torch.from_numpy(kq), torch.from_numpy(kp), torch.from_numpy(kw))
    small = dataclasses.replace(
        g,
        pos_q=kept["pos"][0],
        pos_p=kept["pos"][1],
        pos_w=kept["pos"][2],
        neg_q=kept["neg"][0],
        neg_p=kept["neg"][1],
        neg_w=kept["neg"][2],
    )
    gen = torch.Generator().manual_seed(4)
    zq = 2 * torch.randn(G, NQ, C, generator=gen)
    zp = 2 * torch.randn(G, NP, C + 1, generator=gen)
    z = {"query": [zq], "passage": [zp], "joint": [zq, zp]}[stage]
    target = torch.randint(0, C, (G, NQ), generator=gen)
    out = []
    for inputs in (full, small):
        grads = [torch.zeros_like(t) for t in z]
        value = stage_gradient(stage, CFG, inputs, z, grads, 7, target=target)
        out.append((value, grads))
    assert out[1][0] == pytest.approx(out[0][0], rel=1e-6)
    for a, b in zip(out[0][1], out[1][1], strict=True):
        assert a.abs().max() > 0
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("stage", ["query", "passage", "joint"])
def test_streamed_sides_equal_the_whole_computation_with_dropout(stage) -> None:
    """The trainer's sides above their one-block size (3 blocks of 5 rows here) recompute the
    logits of every block and of gathered rows with the dropout masks drawn at the start of the
    step: the loss and the parameter gradients equal the whole-tensor loss on the whole logits
    (same masks), within float32 summation-order tolerance."""
    from treerank.forest.model import draw_dropout_masks, stacked_forward
    from treerank.forest.trainer import _Side

    d, hidden, chunk, drop = 6, 4, 5, 0.25
    g = _inputs(seed=3)
    gen = torch.Generator().manual_seed(7)
    xq, xp = torch.randn(NQ, d, generator=gen), torch.randn(G, NP, d, generator=gen)
    params = {
        "q": [torch.randn(G, d, hidden, generator=gen), torch.randn(G, hidden, C, generator=gen)],
        "p": [
            torch.randn(G, d, hidden, generator=gen),
            torch.randn(G, hidden, C + 1, generator=gen),
        ],
    }
    biases = {
        k: [torch.zeros(G, hidden), torch.zeros(G, w[-1].shape[2])] for k, w in params.items()
    }
    target = torch.randint(0, C, (G, NQ), generator=gen)
    cfg = CFG.replace(passage_uniformity_weight=0.4, dropout=drop)

    def sides(ws, bs):
        q = _Side(
            lambda lo, hi: xq[lo:hi].unsqueeze(0).expand(G, -1, -1),
            lambda i: xq[torch.from_numpy(i)].unsqueeze(0).expand(G, -1, -1),
            NQ,
            ws["q"],
            bs["q"],
        )
        p = _Side(
            lambda lo, hi: xp[:, lo:hi], lambda i: xp[:, torch.from_numpy(i)], NP, ws["p"], bs["p"]
        )
        return {"query": [q], "passage": [p], "joint": [q, p]}[stage]

    def leaves():
        return (
            {k: [w.clone().requires_grad_(True) for w in v] for k, v in params.items()},
            {k: [b.clone().requires_grad_(True) for b in v] for k, v in biases.items()},
        )

    # streamed: several blocks, masks from the bank
    ws, bs = leaves()
    gens = [torch.Generator().manual_seed(100 + i) for i in range(G)]
    streamed = sides(ws, bs)
    for s in streamed:
        s.begin(drop, gens, chunk)
        assert s.leaf is None and s.bank is not None  # the streaming path, not the one-block one
    value = stage_backward(stage, cfg, g, streamed, chunk, target=target)
    for s in streamed:
        s.finish()

    # whole: the same masks (drawn block by block from the same streams), logits at once
    wr, br = leaves()
    gens = [torch.Generator().manual_seed(100 + i) for i in range(G)]
    z = []
    for s, key in zip(streamed, {"query": "q", "passage": "p", "joint": "qp"}[stage], strict=True):
        blocks = [
            draw_dropout_masks(gens, min(lo + chunk, s.n) - lo, s.widths, drop)
            for lo in range(0, s.n, chunk)
        ]
        masks = [torch.cat([b[i] for b in blocks], 1) for i in range(2)]
        x = xq.unsqueeze(0).expand(G, -1, -1) if key == "q" else xp
        z.append(stacked_forward(x, wr[key], br[key], dropout=drop, masks=masks))
    ref = _reference(stage, cfg, g, z, target)
    ref.backward()
    assert value == pytest.approx(float(ref.detach()), rel=1e-5)
    for key in {"query": "q", "passage": "p", "joint": "qp"}[stage]:
        for a, b in zip(ws[key] + bs[key], wr[key] + br[key], strict=True):
            assert b.grad is not None and b.grad.abs().max() > 0
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_streamed_joint_step_holds_no_whole_side() -> None:
    """With the trainer's streaming sides (400 queries, 3,000 passage rows, 50-row blocks), no
    tensor autograd keeps is larger than a block (``G x chunk x max(d, C + 1)`` elements), and
    no whole ``(G, n, C)`` logits tensor is formed (the sides hold no leaf)."""
    from treerank.forest.trainer import _Side

    nq, n_p, chunk, d = 400, 3000, 50, 8
    g = _inputs(nq=nq, n_p=n_p, e_pos=400, e_neg=3000)
    gen = torch.Generator().manual_seed(2)
    xq, xp = torch.randn(nq, d, generator=gen), torch.randn(G, n_p, d, generator=gen)
    qw = [torch.randn(G, d, C, generator=gen).requires_grad_(True)]
    pw = [torch.randn(G, d, C + 1, generator=gen).requires_grad_(True)]
    qb = [torch.zeros(G, C, requires_grad=True)]
    pb = [torch.zeros(G, C + 1, requires_grad=True)]
    q = _Side(
        lambda lo, hi: xq[lo:hi],
        lambda i: xq[torch.from_numpy(i)],
        nq,
        qw,
        qb,
    )
    p = _Side(lambda lo, hi: xp[:, lo:hi], lambda i: xp[:, torch.from_numpy(i)], n_p, pw, pb)
    gens = [torch.Generator().manual_seed(i) for i in range(G)]
    for s in (q, p):
        s.begin(0.2, gens, chunk)
        assert s.leaf is None
    biggest = _max_saved(lambda: stage_backward("joint", CFG, g, [q, p], chunk))
    assert 0 < biggest <= G * chunk * max(d, C + 1)
    assert qw[0].grad is not None and pw[0].grad is not None
