"""The loss gradients of a forest's three training stages, computed in bounded memory.

Every stage of :mod:`treerank.forest.trainer` is one full-batch gradient step. Its loss is a sum
of three kinds of terms over the group's logits ``zq (G, nq, C)`` (query models) and
``zp (G, nP, C + 1)`` (passage models, last column: not retrievable):

* **per-row terms** (sharpness, the not-retrievable cross-entropy, its penalty): a weighted sum
  over rows with a normaliser that does not depend on the parameters (a bag size, a target
  count);
* **per-example terms** (a selected or non-selected (query, passage) example): a weighted sum over
  examples of a function of one query row and one passage row;
* **global terms** (the uniformity of the bag-mean class distribution of queries, and of
  passages): a function of a small statistic ``s (G, C)`` that is itself a weighted sum over rows.

:func:`stage_backward` computes the loss value and back-propagates it block by block through
the sides' logits (:class:`Side`), which a side recomputes from its input rows on demand: per-row
and global terms in two passes over ``chunk``-row blocks (statistics, classes and the
not-retrievable targets without autograd, then ``dL/ds`` by autograd on the ``(G, C)`` statistic,
then each block with autograd, a global term contributing ``sum_i ds_i/dz_i . dL/ds`` per row),
and example terms over ``chunk``-example blocks whose query and passage rows are gathered. No
``(G, n, C)`` tensor is formed: every autograd graph covers one block, ``O(G * chunk * C)``, and
the only full-length tensors are ``(G, n)`` (masks, classes, targets) and ``(G, E)`` (example
weights). The gradients equal those of the whole-tensor loss (tested against it, with several
blocks); :func:`stage_gradient` is the same on given logits (``dL/dz``).

Every tensor lives on the device of the stage inputs (:class:`StageInputs`, the sides' logits):
the CPU or a CUDA device, float32 accumulation on both.

The formulas are those of :mod:`treerank.forest.losses` (uniformity, sharpness,
not-retrievable) and of the module docstring of :mod:`treerank.forest.trainer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from treerank.forest.config import ForestTrainConfig
from treerank.forest.losses import EPS, uniformity_loss

__all__ = ["Side", "StageInputs", "TensorSide", "stage_backward", "stage_gradient"]

STAGES = ("query", "passage", "joint")


@dataclass
class StageInputs:
    """The example tables of a group (a :class:`treerank.forest.data.PairGroup`'s
    fields, indices into the group's query rows and passage rows)."""

    qmask: Tensor  # float32 (G, nq) bag of queries
    pmask: Tensor  # float32 (G, nP) bag of passages
    wanted: Tensor  # bool (G, nP) the row is a positive of some training query
    pos_q: Tensor  # int64 (E+,)
    pos_p: Tensor  # int64 (E+,)
    pos_w: Tensor  # float32 (G, E+)
    neg_q: Tensor  # int64 (E-,)
    neg_p: Tensor  # int64 (E-,)
    neg_w: Tensor  # float32 (G, E-)


class Side(Protocol):
    """One side's logits (query models: ``width = C``; passage models: ``C + 1``) for any rows.

    ``logits(rows)`` returns ``float32 (G, len(rows), width)``; under autograd, a backward pass
    through it reaches the side's parameters (or whatever the caller wants the gradient of).
    ``rows`` is a ``slice`` (a contiguous block) or an ``int64`` tensor (gathered rows).
    """

    n: int

    def logits(self, rows: slice | Tensor) -> Tensor: ...


def _blocks(n: int, chunk: int) -> list[slice]:
    return [slice(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]


def _leaf(t: Tensor) -> Tensor:
    return t.detach().requires_grad_(True)


def _gathered(side: Side, rows: Tensor) -> Tensor:
    """``side.logits`` of the gathered ``rows`` (each distinct row computed once)."""
    uniq, inverse = torch.unique(rows, return_inverse=True)
    return side.logits(uniq)[:, inverse]


def _uniformity_grad(
    cfg: ForestTrainConfig, stat: Tensor, weight: float, total: Tensor | None = None
) -> tuple[float, Tensor]:
    """``weight * uniformity(stat / total)`` summed over the group (``total (G,)``, default
    ``stat.sum(-1)``), and its gradient with respect to the ``(G, C)`` statistic ``stat``."""
    s = _leaf(stat)
    if total is None:
        pbar = s / s.sum(-1, keepdim=True).clamp_min(EPS)
    else:
        pbar = s / total[:, None]
    loss = (weight * uniformity_loss(pbar, cfg.trainer.uniformity)).sum()
    loss.backward()
    assert s.grad is not None
    return float(loss.detach()), s.grad


def _query_rows(
    cfg: ForestTrainConfig, g: StageInputs, q: Side, chunk: int
) -> tuple[float, Tensor]:
    """Uniformity (global) and sharpness (per row) of the query softmax on the bag, back-
    propagated block by block; returns the value and the argmax classes ``int64 (G, nq)``."""
    w = g.qmask
    wsum = w.sum(1).clamp_min(EPS)  # (G,)
    blocks = _blocks(q.n, chunk)
    stat = torch.zeros(w.shape[0], 0, device=w.device)
    classes = torch.empty(w.shape, dtype=torch.int64, device=w.device)
    with torch.no_grad():  # pass 1: the statistic (G, C) = wsum * pbar, and the classes
        for b in blocks:
            p = torch.softmax(q.logits(b), -1)
            part = (p * w[:, b, None]).sum(1)
            stat = part if stat.shape[1] == 0 else stat + part
            classes[:, b] = p.argmax(-1)
    value, g_stat = _uniformity_grad(cfg, stat, cfg.trainer.uniformity_weight, wsum)
    for b in blocks:  # pass 2: every block's share of the gradient
        z = q.logits(b)
        log_c = math.log(z.shape[-1])
        p = torch.softmax(z, -1)
        out = (p * w[:, b, None] * g_stat[:, None, :]).sum()  # chain rule through the stat
        if cfg.trainer.sharpness_weight > 0:
            ent = -(p * torch.log(p.clamp_min(EPS))).sum(-1) / log_c  # (G, b)
            term = (cfg.trainer.sharpness_weight * (ent * w[:, b]).sum(-1) / wsum).sum()
            value += float(term.detach())
            out = out + term
        if out.requires_grad:
            out.backward()
    return value, classes


def _passage_rows(
    cfg: ForestTrainConfig, g: StageInputs, ps: Side, neg_class: Tensor, chunk: int
) -> float:
    """The passage side's per-row and global terms (not-retrievable cross-entropy and penalty,
    passage balance over the ``C`` real classes), back-propagated block by block.

    ``neg_class``: ``int64 (G, E-)`` the class of each non-selected example's query (the
    not-retrievable targets: :func:`treerank.forest.losses.not_retrievable_targets`).
    """
    pm = g.pmask
    n_g, n_p = pm.shape
    blocks = _blocks(n_p, chunk)
    use_nr, use_pen = cfg.trainer.nr_weight > 0, cfg.trainer.nr_penalty > 0
    use_bal = cfg.trainer.passage_uniformity_weight > 0
    if not (use_nr or use_pen or use_bal):
        return 0.0
    value = 0.0
    with torch.no_grad():  # pass 1: current classes (NR targets) and the balance statistic
        stat = torch.zeros(n_g, 0, device=pm.device)
        cls = torch.empty(n_g, n_p, dtype=torch.int64, device=pm.device)
        for b in blocks:
            pp = torch.softmax(ps.logits(b), -1)
            cls[:, b] = pp[..., :-1].argmax(-1)
            if use_bal:
                part = (pp[..., :-1] * pm[:, b, None]).sum(1)
                stat = part if stat.shape[1] == 0 else stat + part
        if use_nr:
            meets = ((cls[:, g.neg_p] == neg_class) & (g.neg_w > 0)).float()  # (G, E-)
            met = torch.zeros(n_g, n_p, device=pm.device).index_add_(1, g.neg_p, meets) > 0
            target = (met & ~g.wanted & (pm > 0)).float()
            keep = (g.wanted & (pm > 0)).float()
            t_sum, k_sum = target.sum(-1).clamp_min(EPS), keep.sum(-1).clamp_min(EPS)
        pm_sum = pm.sum(-1).clamp_min(EPS)
    del cls
    g_stat = None
    if use_bal:
        v, g_stat = _uniformity_grad(cfg, stat, cfg.trainer.passage_uniformity_weight)
        value += v
    for b in blocks:  # pass 2
        pp = torch.softmax(ps.logits(b), -1)
        p_nr = pp[..., -1]
        term = torch.zeros((), device=pm.device)
        if use_pen:
            term = term + (cfg.trainer.nr_penalty * (p_nr * pm[:, b]).sum(-1) / pm_sum).sum()
        if use_nr:
            pull = (-torch.log(p_nr.clamp_min(EPS)) * target[:, b]).sum(-1) / t_sum
            push = (-torch.log1p(-p_nr.clamp_max(1 - 1e-6)) * keep[:, b]).sum(-1) / k_sum
            term = term + (cfg.trainer.nr_weight * (pull + push)).sum()
        value += float(term.detach())
        out = term
        if g_stat is not None:
            out = out + (pp[..., :-1] * pm[:, b, None] * g_stat[:, None, :]).sum()
        if out.requires_grad:
            out.backward()
    return value


def _passage_examples(
    cfg: ForestTrainConfig, g: StageInputs, ps: Side, target: Tensor, chunk: int
) -> float:
    """Step B's example terms: ``-log P_p(class(q))`` on selected examples and
    ``-negative_weight-weighted log(1 - P_p(class(q)))`` on non-selected ones, with
    ``target (G, nq)`` the query models' argmax classes; ``chunk`` examples per block."""
    value = 0.0
    for idx_q, idx_p, w, positive in (
        (g.pos_q, g.pos_p, g.pos_w, True),
        (g.neg_q, g.neg_p, g.neg_w, False),
    ):
        w_sum = w.sum(-1).clamp_min(EPS)  # (G,)
        for b in _blocks(len(idx_p), chunk):
            z = _gathered(ps, idx_p[b])  # (G, b, C + 1)
            lp = torch.log_softmax(z, -1).gather(-1, target[:, idx_q[b], None]).squeeze(-1)
            nll = -lp if positive else -torch.log1p(-lp.exp().clamp_max(1 - 1e-6))
            term = ((nll * w[:, b]).sum(-1) / w_sum).sum()
            if term.requires_grad:
                term.backward()
            value += float(term.detach())
    return value


def _joint_examples(g: StageInputs, q: Side, ps: Side, chunk: int) -> float:
    """The joint round's example terms on the soft collision probability
    ``s = sum_c P_q(c) P_p(c)``: ``-log s`` (selected), ``-log(1 - s)`` (non-selected, weights
    already scaled by ``negative_weight``); ``chunk`` examples per block, both sides gathered."""
    value = 0.0
    for idx_q, idx_p, w, positive in (
        (g.pos_q, g.pos_p, g.pos_w, True),
        (g.neg_q, g.neg_p, g.neg_w, False),
    ):
        w_sum = w.sum(-1).clamp_min(EPS)
        for b in _blocks(len(idx_p), chunk):
            a, c = _gathered(q, idx_q[b]), _gathered(ps, idx_p[b])
            s = (torch.softmax(a, -1) * torch.softmax(c, -1)[..., :-1]).sum(-1)  # (G, b)
            if positive:
                nll = -torch.log(s.clamp_min(EPS))
            else:
                nll = -torch.log1p(-s.clamp_max(1 - 1e-6))
            term = ((nll * w[:, b]).sum(-1) / w_sum).sum()
            if term.requires_grad:
                term.backward()
            value += float(term.detach())
    return value


def stage_backward(
    stage: str,
    cfg: ForestTrainConfig,
    g: StageInputs,
    sides: Sequence[Side],
    chunk: int,
    target: Tensor | None = None,
) -> float:
    """The loss of one stage, back-propagated block by block through the sides' logits.

    No ``(G, n, C)`` tensor is formed: every term is computed on ``chunk`` rows (per-row and
    global terms, in two passes: statistics without autograd, then the gradient) or ``chunk``
    examples (their query and passage rows gathered) at a time, and each block's backward pass
    adds its share into the parameters' ``.grad``; the sum is the whole-batch gradient (tested
    against the whole-tensor loss).

    Args:
        stage: ``"query"`` (step A: query uniformity + sharpness; ``sides = [q]``),
            ``"passage"`` (step B: example terms against the query classes ``target``,
            not-retrievable and passage balance; ``sides = [p]``) or ``"joint"`` (collision
            terms, query terms, passage terms with the current query classes;
            ``sides = [q, p]``).
        cfg: the trainer's hyperparameters (loss weights).
        g: the group's example tables.
        sides: :class:`Side` per model side; logits ``float32 (G, rows, width)``.
        chunk: rows or examples per block.
        target: ``int64 (G, nq)`` the query models' classes (step B only).

    Returns:
        the loss value, summed over the group's models.

    Raises:
        ValueError: unknown stage, or step B without ``target``.
    """
    if stage == "query":
        return _query_rows(cfg, g, sides[0], chunk)[0]
    if stage == "passage":
        if target is None:
            raise ValueError("stage_backward: step B needs the query classes (target)")
        value = _passage_examples(cfg, g, sides[0], target, chunk)
        return value + _passage_rows(cfg, g, sides[0], target[:, g.neg_q], chunk)
    if stage == "joint":
        q, ps = sides
        value = _joint_examples(g, q, ps, chunk)
        v, classes = _query_rows(cfg, g, q, chunk)
        return value + v + _passage_rows(cfg, g, ps, classes[:, g.neg_q], chunk)
    raise ValueError(f"stage_backward: unknown stage {stage!r}; known: {', '.join(STAGES)}")


class TensorSide:
    """A :class:`Side` over given logits ``float32 (G, n, width)`` (a leaf: its ``.grad``
    receives ``dL/dz``); what :func:`stage_gradient` and the tests use."""

    def __init__(self, z: Tensor) -> None:
        self.z, self.n = z, int(z.shape[1])

    def logits(self, rows: slice | Tensor) -> Tensor:
        return self.z[:, rows]


def stage_gradient(
    stage: str,
    cfg: ForestTrainConfig,
    g: StageInputs,
    z: list[Tensor],
    grads: list[Tensor],
    chunk: int,
    target: Tensor | None = None,
) -> float:
    """:func:`stage_backward` on given logits: adds ``dL/dz`` into ``grads`` (zeros shaped like
    ``z``, ``float32 (G, n, width)`` per side) and returns the loss value."""
    leaves = [_leaf(t) for t in z]
    value = stage_backward(stage, cfg, g, [TensorSide(t) for t in leaves], chunk, target)
    for leaf, grad in zip(leaves, grads, strict=True):
        if leaf.grad is not None:
            grad += leaf.grad
    return value
