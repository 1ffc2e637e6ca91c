"""The loss gradients of a forest's three training stages, computed in bounded memory.

Every stage of :mod:`treerank.training.forest` is one full-batch gradient step. Its loss is a sum
of three kinds of terms over the group's logits ``zq (G, nq, C)`` (query models) and
``zp (G, nP, C + 1)`` (passage models, last column: not retrievable):

* **per-row terms** (sharpness, the not-retrievable cross-entropy, its penalty): a weighted sum
  over rows with a normaliser that does not depend on the parameters (a bag size, a target
  count);
* **per-example terms** (a selected or non-selected (query, passage) example): a weighted sum over
  examples of a function of one query row and one passage row;
* **global terms** (the uniformity of the bag-mean class distribution of queries, and of
  passages): a function of a small statistic ``s (G, C)`` that is itself a weighted sum over rows.

:func:`stage_gradient` computes the loss value and ``dL/dzq``, ``dL/dzp`` block by block:
statistics and the not-retrievable targets first (no autograd), then ``dL/ds`` (autograd on the
``(G, C)`` statistic), then each block of ``chunk`` rows or examples with autograd on that block
only, its gradient added into the full ``dL/dz`` (``index_add_`` for gathered rows). A global
term contributes ``sum_i ds_i/dz_i . dL/ds`` per row (the chain rule through the statistic).
The full-size tensors are the logits and their gradients, ``(G, n, C)`` each; every autograd
graph covers one block, ``O(G * chunk * C)``. With the GradCache step of the trainer (the logits
themselves computed block by block, Gao et al. 2021), a step's memory is
``O(G * (nq + nP) * C + G * chunk * (d + C))``; the gradients equal those of the whole-tensor
loss (tested against it).

The formulas are those of :mod:`treerank.training.forest_losses` (uniformity, sharpness,
not-retrievable) and of the module docstring of :mod:`treerank.training.forest`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from treerank.training.forest_config import ForestTrainConfig
from treerank.training.forest_losses import EPS, uniformity_loss

__all__ = ["StageInputs", "stage_gradient"]

STAGES = ("query", "passage", "joint")


@dataclass
class StageInputs:
    """The example tables of a group (a :class:`treerank.training.forest_data.PairGroup`'s
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


def _blocks(n: int, chunk: int) -> list[slice]:
    return [slice(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]


def _leaf(t: Tensor) -> Tensor:
    return t.detach().requires_grad_(True)


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
    loss = (weight * uniformity_loss(pbar, cfg.uniformity)).sum()
    loss.backward()
    assert s.grad is not None
    return float(loss.detach()), s.grad


def _query_rows(
    cfg: ForestTrainConfig, g: StageInputs, zq: Tensor, gq: Tensor, chunk: int
) -> float:
    """Uniformity (global) and sharpness (per row) of the query softmax on the bag; adds the
    gradient into ``gq``; returns the value."""
    w = g.qmask
    wsum = w.sum(1).clamp_min(EPS)  # (G,)
    blocks = _blocks(zq.shape[1], chunk)
    with torch.no_grad():
        stat = sum(
            (torch.softmax(zq[:, b], -1) * w[:, b, None]).sum(1) for b in blocks
        )  # (G, C) = wsum * pbar
    assert isinstance(stat, Tensor)
    value, g_stat = _uniformity_grad(cfg, stat, cfg.uniformity_weight, wsum)
    log_c = math.log(zq.shape[-1])
    for b in blocks:
        z = _leaf(zq[:, b])
        p = torch.softmax(z, -1)
        out = (p * w[:, b, None] * g_stat[:, None, :]).sum()  # chain rule through the stat
        if cfg.sharpness_weight > 0:
            ent = -(p * torch.log(p.clamp_min(EPS))).sum(-1) / log_c  # (G, b)
            term = (cfg.sharpness_weight * (ent * w[:, b]).sum(-1) / wsum).sum()
            value += float(term.detach())
            out = out + term
        out.backward()
        assert z.grad is not None
        gq[:, b] += z.grad
    return value


def _passage_rows(
    cfg: ForestTrainConfig,
    g: StageInputs,
    zp: Tensor,
    gp: Tensor,
    neg_class: Tensor,
    chunk: int,
) -> float:
    """The passage side's per-row and global terms (not-retrievable cross-entropy and penalty,
    passage balance over the ``C`` real classes); adds the gradient into ``gp``.

    ``neg_class``: ``int64 (G, E-)`` the class of each non-selected example's query (the
    not-retrievable targets: :func:`treerank.training.forest_losses.not_retrievable_targets`).
    """
    n_g, n_p = zp.shape[0], zp.shape[1]
    blocks = _blocks(n_p, chunk)
    pm = g.pmask
    use_nr, use_pen = cfg.nr_weight > 0, cfg.nr_penalty > 0
    use_bal = cfg.passage_uniformity_weight > 0
    if not (use_nr or use_pen or use_bal):
        return 0.0
    value = 0.0
    with torch.no_grad():
        stat = torch.zeros(n_g, zp.shape[-1] - 1)
        cls = torch.empty(n_g, n_p, dtype=torch.int64)
        for b in blocks:
            pp = torch.softmax(zp[:, b], -1)
            cls[:, b] = pp[..., :-1].argmax(-1)
            if use_bal:
                stat += (pp[..., :-1] * pm[:, b, None]).sum(1)
        if use_nr:
            meets = ((cls[:, g.neg_p] == neg_class) & (g.neg_w > 0)).float()  # (G, E-)
            met = torch.zeros(n_g, n_p).index_add_(1, g.neg_p, meets) > 0
            target = (met & ~g.wanted & (pm > 0)).float()
            keep = (g.wanted & (pm > 0)).float()
            t_sum, k_sum = target.sum(-1).clamp_min(EPS), keep.sum(-1).clamp_min(EPS)
        pm_sum = pm.sum(-1).clamp_min(EPS)
    g_stat = None
    if use_bal:
        v, g_stat = _uniformity_grad(cfg, stat, cfg.passage_uniformity_weight)
        value += v
    for b in blocks:
        z = _leaf(zp[:, b])
        pp = torch.softmax(z, -1)
        p_nr = pp[..., -1]
        term = torch.zeros(())
        if use_pen:
            term = term + (cfg.nr_penalty * (p_nr * pm[:, b]).sum(-1) / pm_sum).sum()
        if use_nr:
            pull = (-torch.log(p_nr.clamp_min(EPS)) * target[:, b]).sum(-1) / t_sum
            push = (-torch.log1p(-p_nr.clamp_max(1 - 1e-6)) * keep[:, b]).sum(-1) / k_sum
            term = term + (cfg.nr_weight * (pull + push)).sum()
        value += float(term.detach())
        out = term
        if g_stat is not None:
            out = out + (pp[..., :-1] * pm[:, b, None] * g_stat[:, None, :]).sum()
        out.backward()
        assert z.grad is not None
        gp[:, b] += z.grad
    return value


def _passage_examples(
    cfg: ForestTrainConfig, g: StageInputs, zp: Tensor, gp: Tensor, target: Tensor, chunk: int
) -> float:
    """Step B's example terms: ``-log P_p(class(q))`` on selected examples and
    ``-negative_weight-weighted log(1 - P_p(class(q)))`` on non-selected ones, with
    ``target (G, nq)`` the query models' argmax classes; adds into ``gp``."""
    value = 0.0
    for idx_q, idx_p, w, positive in (
        (g.pos_q, g.pos_p, g.pos_w, True),
        (g.neg_q, g.neg_p, g.neg_w, False),
    ):
        w_sum = w.sum(-1).clamp_min(EPS)  # (G,)
        for b in _blocks(len(idx_p), chunk):
            rows = idx_p[b]
            z = _leaf(zp[:, rows])  # (G, b, C + 1)
            lp = torch.log_softmax(z, -1).gather(-1, target[:, idx_q[b], None]).squeeze(-1)
            nll = -lp if positive else -torch.log1p(-lp.exp().clamp_max(1 - 1e-6))
            term = ((nll * w[:, b]).sum(-1) / w_sum).sum()
            term.backward()
            assert z.grad is not None
            gp.index_add_(1, rows, z.grad)
            value += float(term.detach())
    return value


def _joint_examples(
    g: StageInputs, zq: Tensor, zp: Tensor, gq: Tensor, gp: Tensor, chunk: int
) -> float:
    """The joint round's example terms on the soft collision probability
    ``s = sum_c P_q(c) P_p(c)``: ``-log s`` (selected), ``-log(1 - s)`` (non-selected, weights
    already scaled by ``negative_weight``); adds into ``gq`` and ``gp``."""
    value = 0.0
    for idx_q, idx_p, w, positive in (
        (g.pos_q, g.pos_p, g.pos_w, True),
        (g.neg_q, g.neg_p, g.neg_w, False),
    ):
        w_sum = w.sum(-1).clamp_min(EPS)
        for b in _blocks(len(idx_p), chunk):
            rq, rp = idx_q[b], idx_p[b]
            a, c = _leaf(zq[:, rq]), _leaf(zp[:, rp])
            s = (torch.softmax(a, -1) * torch.softmax(c, -1)[..., :-1]).sum(-1)  # (G, b)
            if positive:
                nll = -torch.log(s.clamp_min(EPS))
            else:
                nll = -torch.log1p(-s.clamp_max(1 - 1e-6))
            term = ((nll * w[:, b]).sum(-1) / w_sum).sum()
            term.backward()
            assert a.grad is not None and c.grad is not None
            gq.index_add_(1, rq, a.grad)
            gp.index_add_(1, rp, c.grad)
            value += float(term.detach())
    return value


def stage_gradient(
    stage: str,
    cfg: ForestTrainConfig,
    g: StageInputs,
    z: list[Tensor],
    grads: list[Tensor],
    chunk: int,
    target: Tensor | None = None,
) -> float:
    """The loss of one stage and its gradient with respect to the logits, block by block.

    Args:
        stage: ``"query"`` (step A: query uniformity + sharpness; ``z = [zq]``), ``"passage"``
            (step B: example terms against the query classes ``target``, not-retrievable and
            passage balance; ``z = [zp]``) or ``"joint"`` (collision terms, query terms,
            passage terms with the current query classes; ``z = [zq, zp]``).
        cfg: the trainer's hyperparameters (loss weights).
        g: the group's example tables.
        z: ``float32 (G, n, width)`` logits per side (no autograd needed).
        grads: zero tensors shaped like ``z``; ``dL/dz`` is added into them.
        chunk: rows or examples per autograd block.
        target: ``int64 (G, nq)`` the query models' classes (step B only).

    Returns:
        the loss value, summed over the group's models.

    Raises:
        ValueError: unknown stage, or step B without ``target``.
    """
    if stage == "query":
        return _query_rows(cfg, g, z[0], grads[0], chunk)
    if stage == "passage":
        if target is None:
            raise ValueError("stage_gradient: step B needs the query classes (target)")
        value = _passage_examples(cfg, g, z[0], grads[0], target, chunk)
        return value + _passage_rows(cfg, g, z[0], grads[0], target[:, g.neg_q], chunk)
    if stage == "joint":
        zq, zp = z
        value = _joint_examples(g, zq, zp, grads[0], grads[1], chunk)
        value += _query_rows(cfg, g, zq, grads[0], chunk)
        with torch.no_grad():
            classes = torch.cat(
                [torch.softmax(zq[:, b], -1).argmax(-1) for b in _blocks(zq.shape[1], chunk)], 1
            )
        return value + _passage_rows(cfg, g, zp, grads[1], classes[:, g.neg_q], chunk)
    raise ValueError(f"stage_gradient: unknown stage {stage!r}; known: {', '.join(STAGES)}")
