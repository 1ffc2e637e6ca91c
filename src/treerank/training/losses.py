"""InfoNCE over a ``(B, M)`` score matrix with exact multi-positive masks.

The loss maths is kept apart from encoding (the habit of sentence-transformers'
``MultipleNegativesRankingLoss``): a model produces a score matrix, this module turns it into a
loss. The thin heads, DRT and any later trainer share it.

Reference: van den Oord et al. (2018), "Representation Learning with Contrastive Predictive
Coding" (InfoNCE); Karpukhin et al. (2020), "Dense Passage Retrieval" (in-batch negatives plus
hard negatives, the worked example pinned in ``tests/training/test_losses.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["info_nce", "info_nce_symmetric"]


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
    loss = denom - numer  # (B,)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"info_nce: unknown reduction {reduction!r} (mean, sum, none)")


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
