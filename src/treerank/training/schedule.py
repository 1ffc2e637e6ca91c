"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

The schedule of most transformer and contrastive training recipes (e.g. Loshchilov & Hutter,
2017, "SGDR", for the cosine; Goyal et al., 2017, for the warmup).
"""

from __future__ import annotations

import math

import torch

__all__ = ["warmup_cosine", "warmup_cosine_scheduler"]


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the base learning rate at optimiser step ``step`` (0-based).

    ``(step + 1) / warmup_steps`` during warmup, then
    ``min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * t))`` with ``t`` going from 0 to 1 over
    the remaining steps; ``min_ratio`` after ``total_steps``.

    Raises:
        ValueError: ``total_steps < 1``, ``warmup_steps < 0`` or ``min_ratio`` outside [0, 1].
    """
    if total_steps < 1 or warmup_steps < 0 or not 0.0 <= min_ratio <= 1.0:
        raise ValueError(
            f"bad schedule: total_steps={total_steps}, warmup_steps={warmup_steps}, "
            f"min_ratio={min_ratio}"
        )
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / decay)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def warmup_cosine_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`warmup_cosine` to every parameter group."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total_steps, warmup_steps, min_ratio)
    )
