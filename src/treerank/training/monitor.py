"""Batch diagnostics logged while training a contrastive model.

Numbers that tell, step by step, whether InfoNCE is learning or stuck (the DPR lesson's
checklist): the loss against its chance floor ``log(M)``, in-batch accuracy, how peaked the
softmax is on the strongest negative, the mean query norm, and over how many negatives the
softmax mass is spread (participation ratio).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["batch_stats"]


@torch.no_grad()
def batch_stats(
    logits: Tensor, positive: Tensor, mask_out: Tensor, q_repr: Tensor | None = None
) -> dict[str, float]:
    """Diagnostics of one batch.

    Args:
        logits: ``float (B, M)`` scores already divided by the temperature.
        positive: ``bool (B, M)`` designated positives.
        mask_out: ``bool (B, M)`` cells removed from the denominators.
        q_repr: the query representations ``(B, ...)`` (for the mean norm), or None.

    Returns:
        ``chance_loss``: ``log(M)``, the loss of a model that scores every column alike (mean of
        ``log(#unmasked columns)`` over rows). ``accuracy``: fraction of rows whose highest
        unmasked column is a positive. ``max_neg_prob``: mean over rows of the largest softmax
        probability on a negative. ``neg_participation``: mean over rows of ``1 / sum_j p_j^2``
        over the negatives' renormalised softmax mass (1 = one negative takes all the mass, the
        number of negatives = spread evenly). ``n_columns``: ``M``. ``query_norm``: mean L2 norm
        of the flattened query representations (when given).
    """
    keep = ~mask_out | positive
    z = logits.float().masked_fill(~keep, -math.inf)
    prob = torch.softmax(z, dim=1)  # (B, M)
    neg = keep & ~positive
    top = z.argmax(dim=1)
    acc = positive.gather(1, top[:, None]).float().mean()
    p_neg = prob.masked_fill(~neg, 0.0)
    max_neg = p_neg.max(dim=1).values.mean()
    mass = p_neg.sum(dim=1, keepdim=True)
    q = p_neg / mass.clamp_min(1e-30)
    pr = 1.0 / (q * q).sum(dim=1).clamp_min(1e-30)
    has_neg = neg.any(dim=1)
    out = {
        "chance_loss": float(torch.log(keep.sum(dim=1).float()).mean()),
        "accuracy": float(acc),
        "max_neg_prob": float(max_neg),
        "neg_participation": float(pr[has_neg].mean()) if bool(has_neg.any()) else float("nan"),
        "n_columns": float(logits.shape[1]),
    }
    if q_repr is not None:
        out["query_norm"] = float(q_repr.detach().reshape(q_repr.shape[0], -1).norm(dim=1).mean())
    return out
