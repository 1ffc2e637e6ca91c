"""Loss maths of the TreeRank forest: uniformity, sharpness, boosting weights, not-retrievable.

Pure functions on probability tensors (the sentence-transformers habit of keeping a loss apart from
the model that produces its inputs); the trainer (:mod:`treerank.forest.trainer`) combines them.
Formulas and their sources are in each docstring; ``docs/forest.md`` says where they depart from
the TreeRank seed and why.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "UNIFORMITY_KINDS",
    "boosting_weights",
    "not_retrievable_loss",
    "not_retrievable_targets",
    "sharpness_loss",
    "uniformity_loss",
    "weighted_mean",
]

Uniformity = Literal["entropy", "gini"]
UNIFORMITY_KINDS: tuple[str, ...] = get_args(Uniformity)
EPS = 1e-7
"""Clamp of probabilities inside logarithms and of weight sums in weighted means."""


def uniformity_loss(mean_probs: Tensor, kind: str = "entropy") -> Tensor:
    """Normalised uniformity loss of a class distribution (TreeRank seed, query-model step 1).

    Args:
        mean_probs: ``float32 (..., C)`` a distribution over ``C >= 2`` classes (rows sum to 1),
            typically the batch mean of per-query softmax outputs.
        kind: ``"entropy"``: ``(log C + sum_c p_c log p_c) / log C``; ``"gini"``:
            ``(C * sum_c p_c^2 - 1) / (C - 1)``.

    Returns:
        ``float32 (...)``: 0 for the uniform distribution, 1 for a one-hot one.

    Raises:
        ValueError: unknown ``kind``.
    """
    c = mean_probs.shape[-1]
    if kind == "entropy":
        ent = -(mean_probs * torch.log(mean_probs.clamp_min(EPS))).sum(-1)
        return (math.log(c) - ent) / math.log(c)
    if kind == "gini":
        return (c * (mean_probs**2).sum(-1) - 1.0) / (c - 1.0)
    raise ValueError(f"unknown uniformity loss {kind!r}; known: {', '.join(UNIFORMITY_KINDS)}")


def sharpness_loss(probs: Tensor, weights: Tensor | None = None) -> Tensor:
    """Mean per-example normalised entropy ``H(p_i) / log C`` (0 = every example one-hot).

    Args:
        probs: ``float32 (..., n, C)`` per-example class distributions.
        weights: ``float32 (..., n)`` example weights (e.g. a bagging mask); None = equal.

    Returns:
        ``float32 (...)``.
    """
    c = probs.shape[-1]
    ent = -(probs * torch.log(probs.clamp_min(EPS))).sum(-1) / math.log(c)
    if weights is None:
        return ent.mean(-1)
    return (ent * weights).sum(-1) / weights.sum(-1).clamp_min(EPS)


def boosting_weights(misses: np.ndarray, n_models: int) -> np.ndarray:
    """The seed's boosting weight ``(1 + e) / (1 + n)`` per example.

    Args:
        misses: ``int (E,)`` ``e``: models (of those trained so far) that did not map the
            example's passage to its query's class.
        n_models: ``n``, models trained so far (``>= max(misses)``).

    Returns:
        ``float32 (E,)``; 1 for every example before the first model; in ``[1/(1+n), 1]``.

    Raises:
        ValueError: negative counts or ``e > n``.
    """
    e = np.asarray(misses)
    if n_models < 0 or (e.size and (e.min() < 0 or e.max() > n_models)):
        raise ValueError(f"boosting weights: need 0 <= e <= n (n={n_models})")
    return ((1.0 + e) / (1.0 + n_models)).astype(np.float32)


def weighted_mean(values: Tensor, weights: Tensor) -> Tensor:
    """``(G, E)`` values and weights -> ``(G,)`` weighted means (0 where all weights are 0)."""
    return (values * weights).sum(-1) / weights.sum(-1).clamp_min(EPS)


def not_retrievable_targets(
    passage_probs: Tensor,
    neg_p: Tensor,
    neg_class: Tensor,
    neg_w: Tensor,
    wanted: Tensor,
    pmask: Tensor,
) -> Tensor:
    """Passages that no bagged training query is expected to meet where they are.

    A passage is a target of the not-retrievable outcome under model ``g`` when some bagged
    query whose class equals the passage's current (argmax real) class has it as a negative, and
    no training query has it as a positive: every query that would meet it in its class should
    not, and nothing says another would.

    Args:
        passage_probs: ``float32 (G, n, C + 1)`` passage softmax (last column: not retrievable).
        neg_p: ``int64 (E,)`` passage row of each negative example.
        neg_class: ``int64 (G, E)`` class of each negative example's query under each model.
        neg_w: ``float32 (G, E)`` example weights (0 = not in the model's bag).
        wanted: ``bool (G, n)`` the passage is a positive of some training query.
        pmask: ``float32 (G, n)`` passages in the bag.

    Returns:
        ``bool (G, n)``.
    """
    with torch.no_grad():
        cls = passage_probs[..., :-1].argmax(-1)  # (G, n)
        meets = ((cls[:, neg_p] == neg_class) & (neg_w > 0)).float()  # (G, E)
        met = torch.zeros(cls.shape, device=cls.device).index_add_(1, neg_p, meets) > 0
        return met & ~wanted & (pmask > 0)


def not_retrievable_loss(
    passage_probs: Tensor,
    neg_p: Tensor,
    neg_class: Tensor,
    neg_w: Tensor,
    wanted: Tensor,
    pmask: Tensor,
) -> Tensor:
    """The learned not-retrievable objective, a binary cross-entropy on ``P(not retrievable)``:
    ``-log P`` averaged over the passages of :func:`not_retrievable_targets` plus ``-log(1 - P)``
    averaged over the bag's known positives (each mean 0 when empty).

    This is how the TreeRank seed's per-model relevance filter is learned: a passage met only by
    queries that should not retrieve it leaves the model's index (it stays retrievable through the
    other models); positives are pulled into their query's class by the positive term instead.
    The trade-off against recall is ``nr_weight`` (this term) against ``nr_penalty`` (a push
    against the outcome on every bagged passage) and the threshold ``nr_threshold``.

    Args: as :func:`not_retrievable_targets`.

    Returns:
        ``float32 (G,)``.
    """
    target = not_retrievable_targets(passage_probs, neg_p, neg_class, neg_w, wanted, pmask)
    p_nr = passage_probs[..., -1]
    out = weighted_mean(-torch.log(p_nr.clamp_min(EPS)), target.to(p_nr.dtype))
    keep = (wanted & (pmask > 0)).to(p_nr.dtype)
    return out + weighted_mean(-torch.log1p(-p_nr.clamp_max(1 - 1e-6)), keep)
