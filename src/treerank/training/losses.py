"""InfoNCE over a ``(B, M)`` score matrix with exact multi-positive masks.

The loss maths is kept apart from encoding (the habit of sentence-transformers'
``MultipleNegativesRankingLoss``): a model produces a score matrix, this module turns it into a
loss. The thin heads, DRT and any later trainer share it.

Reference: van den Oord et al. (2018), "Representation Learning with Contrastive Predictive
Coding" (InfoNCE); Karpukhin et al. (2020), "Dense Passage Retrieval" (in-batch negatives plus
hard negatives, the worked example pinned in ``tests/training/test_losses.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "full_corpus_softmax",
    "info_nce",
    "info_nce_symmetric",
    "listwise_kl",
    "margin_mse",
    "teacher_distribution",
]


def _check(scores: Tensor, positive: Tensor, mask_out: Tensor | None) -> None:
    if scores.ndim != 2:
        raise ValueError(f"info_nce: scores must be (B, M), got shape {tuple(scores.shape)}")
    if positive.shape != scores.shape or positive.dtype != torch.bool:
        raise ValueError(
            f"info_nce: positive must be a bool tensor of shape {tuple(scores.shape)}, "
            f"got {positive.dtype} {tuple(positive.shape)}"
        )
    if mask_out is not None and (mask_out.shape != scores.shape or mask_out.dtype != torch.bool):
        raise ValueError(
            f"info_nce: mask_out must be a bool tensor of shape {tuple(scores.shape)}, "
            f"got {mask_out.dtype} {tuple(mask_out.shape)}"
        )


def info_nce(
    scores: Tensor,
    positive: Tensor,
    mask_out: Tensor | None = None,
    temperature: float | Tensor = 1.0,
    reduction: str = "mean",
) -> Tensor:
    """InfoNCE (softmax cross-entropy) of each row's positives against the rest of the row.

    For row ``i`` with logits ``z_ij = scores_ij / temperature``, the candidate set
    ``C_i = {j : not mask_out_ij}`` and positives ``P_i = {j : positive_ij}``::

        loss_i = logsumexp_{j in C_i} z_ij - logsumexp_{j in P_i} z_ij

    i.e. ``-log`` of the softmax mass the row puts on its positives. With one positive per row
    (the usual case: the designated positive of query ``i``) this is DPR's
    ``-log(exp(s_i+) / sum_j exp(s_ij))``; every column that is neither masked nor positive is a
    negative (in-batch or hard) and receives gradient.

    Args:
        scores: ``float (B, M)`` query-by-passage scores (cosine, dot product, or a model's own
            score; already divided by a learned temperature if the model owns one).
        positive: ``bool (B, M)``, True at each row's designated positive(s). Every row needs at
            least one.
        mask_out: ``bool (B, M)`` or None; True removes ``(i, j)`` from row ``i``'s denominator
            (passages known to be relevant to query ``i`` other than its designated positive, so
            they are never pushed away). A masked cell gets exactly zero gradient. Positive cells
            are never masked (``positive`` wins).
        temperature: divides the scores (``0.05`` means a scale of 20); ``1.0`` leaves them as
            they are. A float or a 0-d tensor (a learned temperature).
        reduction: ``"mean"`` (scalar, the mean over rows), ``"sum"`` or ``"none"`` (``(B,)``).

    Returns:
        The loss (natural log units): a 0-d tensor, or ``(B,)`` for ``reduction="none"``.

    Raises:
        ValueError: wrong shapes/dtypes, a row without a positive, or an unknown reduction.
    """
    _check(scores, positive, mask_out)
    if not bool(positive.any(dim=1).all()):
        raise ValueError("info_nce: every row needs at least one positive")
    logits = scores / temperature  # (B, M)
    neg_inf = torch.finfo(logits.dtype).min
    keep = ~mask_out | positive if mask_out is not None else torch.ones_like(positive)  # (B, M)
    denom = torch.logsumexp(logits.masked_fill(~keep, neg_inf), dim=1)  # (B,)
    numer = torch.logsumexp(logits.masked_fill(~positive, neg_inf), dim=1)  # (B,)
    return _reduce(denom - numer, reduction, "info_nce")  # (B,) before the reduction


def info_nce_symmetric(
    scores: Tensor,
    positive: Tensor,
    mask_out: Tensor | None = None,
    temperature: float | Tensor = 1.0,
) -> Tensor:
    """The passage -> query direction of InfoNCE (mean over positive columns).

    Every column that is some row's positive becomes a "query" whose candidates are the ``B``
    queries of the batch; the queries it is positive for are its positives, the queries it is
    masked out for (known relevant, not designated) leave its denominator. Add it to
    :func:`info_nce` for the symmetric loss of CLIP (Radford et al., 2021).

    Args / Raises: as :func:`info_nce`.

    Returns:
        0-d tensor: mean over the columns that hold at least one positive.
    """
    _check(scores, positive, mask_out)
    cols = positive.any(dim=0)  # (M,) columns that are someone's positive
    s_t = scores.t()[cols]  # (M', B)
    p_t = positive.t()[cols]
    m_t = mask_out.t()[cols] if mask_out is not None else None
    return info_nce(s_t, p_t, m_t, temperature)


def listwise_kl(
    scores: Tensor,
    target: Tensor,
    mask_out: Tensor | None = None,
    temperature: float | Tensor = 1.0,
    reduction: str = "mean",
) -> Tensor:
    """Listwise distillation: ``KL(target || softmax(scores / temperature))`` per row.

    For row ``i`` with student logits ``z_ij = scores_ij / temperature`` over the candidate set
    ``C_i = {j : not mask_out_ij}`` and a teacher distribution ``t_i`` (zero outside ``C_i``)::

        loss_i = sum_j t_ij (log t_ij - z_ij) + logsumexp_{j in C_i} z_ij

    (terms with ``t_ij = 0`` contribute 0). With a one-hot ``t`` this is exactly
    :func:`info_nce`. The teacher distribution is usually ``softmax(teacher_scores / T)`` over
    the teacher's top-k (:func:`teacher_distribution`).

    Reference: Hinton et al. (2015), "Distilling the Knowledge in a Neural Network"; the
    listwise form of RocketQAv2 (Ren et al., 2021).

    Args:
        scores: ``float (B, M)`` student scores (logits once divided by ``temperature``).
        target: ``float (B, M)`` teacher probabilities, rows summing to 1, ``>= 0``.
        mask_out: ``bool (B, M)`` or None: cells removed from the student's softmax; the target
            must be 0 there.
        temperature: divides the student scores.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        The loss in nats (0-d, or ``(B,)`` for ``"none"``); 0 when the student equals the teacher.

    Raises:
        ValueError: shapes differ, negative targets, rows not summing to 1, target mass on a
            masked cell, unknown reduction.
    """
    if scores.ndim != 2 or target.shape != scores.shape:
        raise ValueError(
            f"listwise_kl: scores {tuple(scores.shape)} and target {tuple(target.shape)} "
            "must be equal (B, M)"
        )
    t = target.to(scores.dtype)
    if bool((t < 0).any()) or not torch.allclose(t.sum(dim=1), torch.ones_like(t[:, 0]), atol=1e-4):
        raise ValueError("listwise_kl: target rows must be probability distributions")
    logits = scores / temperature
    if mask_out is not None:
        if mask_out.shape != scores.shape or mask_out.dtype != torch.bool:
            raise ValueError("listwise_kl: mask_out must be a bool tensor shaped like scores")
        if bool((t[mask_out] > 0).any()):
            raise ValueError("listwise_kl: target puts mass on a masked-out cell")
        logits = logits.masked_fill(mask_out, torch.finfo(logits.dtype).min)
    log_p = torch.log_softmax(logits, dim=1)  # (B, M)
    ent = torch.where(t > 0, t * torch.log(t.clamp_min(1e-30)), torch.zeros_like(t))
    loss = (ent - torch.where(t > 0, t * log_p, torch.zeros_like(t))).sum(dim=1)  # (B,)
    return _reduce(loss, reduction, "listwise_kl")


def teacher_distribution(teacher_scores: Tensor, valid: Tensor, temperature: float) -> Tensor:
    """``softmax(teacher_scores / temperature)`` over each row's valid cells (0 elsewhere).

    Args:
        teacher_scores: ``float (B, L)`` the teacher's scores of its top-``L`` (BM25 scores,
            cosines, fused scores; any scale, which is what ``temperature`` is for).
        valid: ``bool (B, L)`` False on padding; every row needs one valid cell.
        temperature: teacher temperature (> 0); small -> close to the teacher's top-1.

    Raises:
        ValueError: ``temperature <= 0`` or a row without a valid cell.
    """
    if temperature <= 0:
        raise ValueError(f"teacher temperature must be > 0, got {temperature}")
    if not bool(valid.any(dim=1).all()):
        raise ValueError("teacher_distribution: every row needs at least one valid cell")
    z = (teacher_scores / temperature).masked_fill(~valid, float("-inf"))
    return torch.softmax(z, dim=1)


def full_corpus_softmax(
    q_repr: Tensor,
    passages: Tensor,
    encode_passages: Callable[[Tensor], Tensor],
    score_matrix: Callable[[Tensor, Tensor], Tensor],
    target_ids: Tensor,
    target_weights: Tensor,
    exclude_ids: Tensor | None = None,
    chunk_size: int = 8192,
    reduction: str = "mean",
) -> Tensor:
    """Exact softmax cross-entropy of each query over **every** passage of the split, chunked.

    With frozen stored vectors the whole corpus can be the candidate set (no sampled
    negatives): for query ``i`` with logits ``z_ij = score_matrix(q_i, encode_passages(P_j))``
    over all ``N`` passages except ``exclude_ids[i]``, and a target distribution ``w_i`` over
    the passages ``target_ids[i]``::

        loss_i = logsumexp_{j} z_ij - sum_l w_il z_{i, target_il}

    A one-hot ``w`` is InfoNCE with the full corpus as negatives; a teacher distribution makes
    it listwise KL distillation up to the teacher's (constant) entropy. The log-sum-exp is taken
    chunk by chunk under activation checkpointing (``torch.utils.checkpoint``), so autograd
    keeps only ``(B,)`` per chunk and recomputes one chunk at a time in the backward pass:
    memory is ``O(chunk_size * (d + B))`` whatever ``N``, and the gradient is exact. When one
    chunk holds the whole corpus (``chunk_size >= N``) it is computed plainly (no recomputation).

    Args:
        q_repr: ``float (B, ...)`` query representations (through the query tower, with grad).
        passages: ``float32 (N, d)`` stored passage vectors (a CPU tensor; no grad).
        encode_passages: the passage tower, ``(c, d) -> (c, ...)``.
        score_matrix: ``(B, ...), (c, ...) -> (B, c)`` logits (temperature already applied).
        target_ids: ``int64 (B, L)`` passage ids carrying target mass, ``-1`` padding.
        target_weights: ``float (B, L)`` target mass per id, rows summing to 1, 0 on padding.
        exclude_ids: ``int64 (B, K)`` passages removed from row ``i``'s softmax (other labelled
            positives, never pushed away), ``-1`` padding; must not carry target mass.
        chunk_size: passages per chunk.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        The loss in nats (0-d or ``(B,)``).

    Raises:
        ValueError: bad shapes, ids out of range, weights that are not distributions.
    """
    from torch.utils.checkpoint import checkpoint

    n = int(passages.shape[0])
    bsz = int(q_repr.shape[0])
    if target_ids.shape != target_weights.shape or target_ids.shape[0] != bsz:
        raise ValueError(
            f"full_corpus_softmax: target_ids {tuple(target_ids.shape)} and target_weights "
            f"{tuple(target_weights.shape)} must be (B={bsz}, L)"
        )
    if chunk_size < 1:
        raise ValueError(f"full_corpus_softmax: chunk_size must be >= 1, got {chunk_size}")
    if bool((target_ids >= n).any()) or (
        exclude_ids is not None and bool((exclude_ids >= n).any())
    ):
        raise ValueError(f"full_corpus_softmax: passage id out of range [0, {n})")
    w = torch.where(target_ids >= 0, target_weights, torch.zeros_like(target_weights))
    if bool((w < 0).any()) or not torch.allclose(
        w.sum(dim=1), torch.ones(bsz, device=w.device), atol=1e-4
    ):
        raise ValueError("full_corpus_softmax: target weights must be distributions per row")
    excl = exclude_ids if exclude_ids is not None else torch.full((bsz, 0), -1, device=w.device)
    if excl.numel():
        hit = (excl[:, :, None] == target_ids[:, None, :]) & (excl[:, :, None] >= 0)
        if bool((hit & (w[:, None, :] > 0)).any()):
            raise ValueError("full_corpus_softmax: an excluded passage carries target mass")
    neg_inf = torch.finfo(q_repr.dtype).min

    def chunk_lse(q: Tensor, block: Tensor, start: Tensor) -> Tensor:
        z = score_matrix(q, encode_passages(block))  # (B, c)
        if excl.numel():
            ids = int(start) + torch.arange(block.shape[0], device=block.device)
            drop = (excl[:, :, None] == ids[None, None, :]).any(dim=1)  # (B, c)
            z = z.masked_fill(drop, neg_inf)
        return torch.logsumexp(z, dim=1)  # (B,)

    parts = []
    for start in range(0, n, chunk_size):
        block = passages[start : start + chunk_size]
        if chunk_size >= n:  # one chunk: nothing to bound, skip the recomputation
            parts.append(chunk_lse(q_repr, block, torch.tensor(start)))
        else:
            parts.append(
                checkpoint(chunk_lse, q_repr, block, torch.tensor(start), use_reentrant=False)
            )
    lse = torch.logsumexp(torch.stack(parts, dim=1), dim=1)  # (B,)
    flat = target_ids.clamp_min(0).reshape(-1)
    uniq, inv = torch.unique(flat, return_inverse=True)
    z_t = score_matrix(q_repr, encode_passages(passages[uniq]))  # (B, U)
    z_target = torch.gather(z_t, 1, inv.reshape(target_ids.shape))  # (B, L)
    loss = lse - (w * z_target).sum(dim=1)
    return _reduce(loss, reduction, "full_corpus_softmax")


def margin_mse(
    scores: Tensor, teacher: Tensor, positive: Tensor, reduction: str = "mean"
) -> Tensor:
    """MarginMSE distillation (Hofstätter et al., 2020, "Improving Efficient Neural Ranking
    Models with Cross-Architecture Knowledge Distillation").

    For row ``i`` with anchor column ``a`` (its ``positive``, the teacher's best passage) and
    every other column ``j`` the teacher scored (``teacher_ij`` finite)::

        loss_i = mean_j ((s_ia - s_ij) - (t_ia - t_ij)) ** 2

    in squared score units (the student's and the teacher's scores share one scale: pass the
    teacher's scores divided by its temperature).

    Args:
        scores: ``float (B, M)`` student scores.
        teacher: ``float (B, M)`` teacher scores, NaN where the teacher did not score the cell.
        positive: ``bool (B, M)`` one True per row, the anchor (its teacher score finite).
        reduction: ``"mean"`` (over rows with at least one pair), ``"sum"`` or ``"none"``
            (``(B,)``, 0 for a row without a pair).

    Raises:
        ValueError: shapes differ, not one anchor per row, an anchor without a teacher score
            on a row with pairs, unknown reduction.
    """
    if scores.ndim != 2 or teacher.shape != scores.shape or positive.shape != scores.shape:
        raise ValueError(
            f"margin_mse: scores {tuple(scores.shape)}, teacher {tuple(teacher.shape)} and "
            f"positive {tuple(positive.shape)} must be equal (B, M)"
        )
    if positive.dtype != torch.bool or bool((positive.sum(dim=1) != 1).any()):
        raise ValueError("margin_mse: positive must be a bool tensor with one True per row")
    t = teacher.to(scores.dtype)
    scored = torch.isfinite(t)
    pairs = scored & ~positive
    n_pairs = pairs.sum(dim=1)
    anchor = positive.float().argmax(dim=1, keepdim=True)
    t_a = t.gather(1, anchor)
    if bool((~torch.isfinite(t_a[:, 0]) & (n_pairs > 0)).any()):
        raise ValueError("margin_mse: a row's anchor has no teacher score")
    s_a = scores.gather(1, anchor)
    diff = (s_a - scores) - (torch.nan_to_num(t_a) - torch.nan_to_num(t))
    sq = torch.where(pairs, diff * diff, torch.zeros_like(diff))
    per_row = sq.sum(dim=1) / n_pairs.clamp(min=1).to(sq.dtype)
    if reduction == "mean":
        has = n_pairs > 0
        return per_row[has].mean() if bool(has.any()) else per_row.sum() * 0.0
    return _reduce(per_row, reduction, "margin_mse")


def _reduce(loss: Tensor, reduction: str, who: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{who}: unknown reduction {reduction!r} (mean, sum, none)")
