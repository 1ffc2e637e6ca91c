"""Length-bucketed batching: sort texts by token length and fill batches up to a token budget."""

from __future__ import annotations

import numpy as np

DEFAULT_TOKEN_BUDGET = 16384
"""Padded tokens (rows x longest row) per encoding batch unless a budget is given."""


def plan_batches(
    lengths: np.ndarray,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    max_batch_size: int = 256,
    max_padding: float = 0.1,
) -> list[np.ndarray]:
    """Group item indices into batches of similar token length.

    Items are sorted by token length, longest first (stable, so equal lengths keep input order),
    and batches are filled greedily while ``n_items * longest_length <= token_budget`` (the
    padded size of the batch), ``n_items <= max_batch_size`` and the next item's length is at
    least ``(1 - max_padding) * longest_length`` (so no item is padded by more than
    ``max_padding`` of its batch's length, which bounds the padding ratio by ``max_padding``
    up to integer rounding of lengths). The longest batch comes first,
    so an out-of-memory budget fails at once rather than at the end. A single item longer than
    the budget gets a batch of its own.

    Args:
        lengths: ``int (n,)`` token length of each item (special tokens included, after
            truncation).
        token_budget: maximum padded tokens (rows x longest length) per batch, >= 1.
        max_batch_size: maximum items per batch, >= 1.
        max_padding: largest padded fraction allowed for any item, in [0, 1).

    Returns:
        list of ``int64`` index arrays into ``lengths``; their concatenation is a permutation.

    Raises:
        ValueError: on a non-positive budget or batch size.
    """
    if token_budget < 1 or max_batch_size < 1:
        raise ValueError("token_budget and max_batch_size must be >= 1")
    if not 0.0 <= max_padding < 1.0:
        raise ValueError("max_padding must be in [0, 1)")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(max_batch_size, token_budget // longest, n - start))
        floor = (1.0 - max_padding) * longest
        sorted_lengths = lengths[order[start : start + size]]
        # lengths are non-increasing along the order: cut at the first one below the floor
        size = max(1, int(np.searchsorted(-sorted_lengths, -floor, side="right")))
        batches.append(order[start : start + size])
        start += size
    return batches


def padding_stats(lengths: np.ndarray, batches: list[np.ndarray]) -> tuple[int, int]:
    """Return ``(padded_tokens, real_tokens)`` of a batch plan.

    ``padded_tokens`` = sum over batches of rows x longest length (what the encoder computes),
    ``real_tokens`` = sum of the lengths; padding ratio = ``1 - real / padded``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches if len(b))
    return int(padded), int(lengths.sum())
