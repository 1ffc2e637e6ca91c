"""Held-out training queries for early stopping (a seeded, reproducible split).

Early stopping needs queries the model never trains on, scored against the split's full passage
set (the DPR lesson: a model selected on in-batch accuracy is selected on the wrong task).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "MIN_TRAINING_QUERIES",
    "OVERSHOOT",
    "HoldoutError",
    "ValidationConfig",
    "holdout_split",
    "passage_groups",
]

MIN_TRAINING_QUERIES = 2
"""The fewest training queries (with a relevant passage) a holdout may leave (a contrastive
batch needs two: one query's positive is the other's in-batch negative): below it
:func:`holdout_split` raises :class:`HoldoutError` with advice."""

OVERSHOOT = 2.0
"""A grouped holdout that takes more than ``OVERSHOOT`` times its target count (whole groups
overshoot when one passage-connected group is large, CISI: 38 of 39 queries) is repaired: the
groups too large for what is left of the target are split (see :func:`holdout_split`)."""


class HoldoutError(ValueError):
    """A holdout that would leave fewer than :data:`MIN_TRAINING_QUERIES` training queries."""


@dataclass
class ValidationConfig:
    """The ``validation:`` section of a training config (same keys for every model type).

    Attributes:
        fraction: share of the training queries held out (0: no validation callback).
        max_queries: cap on held-out queries.
        max_passages: score against at most this many passages: every judged passage of the
            held-out queries plus a fixed random remainder (None: the full split).
        k: search depth of the held-out run.
        metrics: metrics returned by the callback.
        group_by_passage: hold out whole groups of queries connected by shared relevant
            passages (:func:`passage_groups`), so no held-out query's relevant passage is ever a
            training positive: the held-out metric then measures generalisation to passages
            never seen as positives, not memorisation of which passages are relevant (on
            SciFact, 65% of test queries share a relevant passage with a training query).
            On by default (issue 11): early stopping then selects for what the test split's
            unseen-positive part measures.
    """

    fraction: float = 0.2
    max_queries: int | None = 2000
    max_passages: int | None = 500_000
    k: int = 100
    metrics: list[str] = field(default_factory=lambda: ["mrr@10", "ndcg@10", "recall@100"])
    group_by_passage: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.fraction < 1:
            raise ValueError(f"validation.fraction must be in [0, 1), got {self.fraction}")
        if self.k < 1:
            raise ValueError(f"validation.k must be >= 1, got {self.k}")
        self.metrics = list(self.metrics)


def passage_groups(
    candidates: np.ndarray, labels: np.ndarray, relevance_threshold: int = 1
) -> np.ndarray:
    """Group id of every query: connected components of the query -- relevant-passage graph.

    Two queries are in the same group when they share a relevant passage (directly or through a
    chain of queries). Queries without a relevant passage get a group of their own.

    Args:
        candidates: ``int32 (nq, K)`` passage ids, ``-1`` padding. labels: ``uint8 (nq, K)``.
        relevance_threshold: grade ``>=`` this is relevant.

    Returns:
        ``int64 (nq,)`` group ids in ``[0, n_groups)``.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    cand = np.asarray(candidates, dtype=np.int64)
    nq = cand.shape[0]
    keep = (cand >= 0) & (np.asarray(labels) >= relevance_threshold)
    q_idx = np.broadcast_to(np.arange(nq)[:, None], cand.shape)[keep]
    p_idx = cand[keep]
    n_p = int(p_idx.max()) + 1 if p_idx.size else 0
    # bipartite graph: nodes [0, nq) queries, [nq, nq + n_p) passages
    graph = coo_matrix((np.ones(q_idx.size), (q_idx, nq + p_idx)), shape=(nq + n_p, nq + n_p))
    _, comp = connected_components(graph, directed=False)
    _, groups = np.unique(comp[:nq], return_inverse=True)
    return groups.astype(np.int64)


def holdout_split(
    has_relevant: np.ndarray,
    fraction: float,
    seed: int = 0,
    max_queries: int | None = None,
    groups: np.ndarray | None = None,
    stats: dict[str, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Split query ids into training and held-out sets.

    Only queries with a relevant passage are held out (others cannot be scored); they stay in
    the training set (where the sampler skips them anyway).

    Args:
        has_relevant: ``bool (nq,)``, True for queries with at least one relevant passage.
        fraction: share of those queries to hold out, in ``[0, 1)``; 0 holds out nothing.
        seed: seed of the draw (``numpy.random.default_rng(seed)``).
        max_queries: cap on the held-out count (large splits: a few thousand queries are enough
            to rank checkpoints and cheap to score against the full passage set).
        groups: ``int (nq,)`` group id per query (:func:`passage_groups`): whole groups are held
            out, drawn in a seeded order until the held-out count reaches the target. When
            whole groups would hold out more than :data:`OVERSHOOT` times the target (one
            giant passage-connected group) or leave fewer than :data:`MIN_TRAINING_QUERIES`
            training queries, grouping is capped at the fraction: whole groups that fit, then
            the remainder drawn from inside the groups too large to fit (``split_groups`` in
            ``stats`` counts them; their held-out queries may share a relevant passage with a
            training query).
        stats: filled, when given, with ``heldout_queries``, ``training_queries`` (with a
            relevant passage), ``target_heldout`` and ``split_groups``.

    Returns:
        ``(train_rows, heldout_rows)``: ``int64`` ascending query ids, disjoint, covering all.

    Raises:
        ValueError: ``fraction`` outside ``[0, 1)``.
        HoldoutError: fewer than :data:`MIN_TRAINING_QUERIES` training queries would be left.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction}")
    has_relevant = np.asarray(has_relevant, dtype=bool)
    eligible = np.flatnonzero(has_relevant)
    n_out = int(round(fraction * eligible.size))
    if max_queries is not None:
        n_out = min(n_out, int(max_queries))
    rng = np.random.default_rng(seed)
    split_groups = 0
    if groups is not None and n_out:
        groups = np.asarray(groups)
        order = rng.permutation(np.unique(groups[eligible]))
        sizes = np.bincount(groups[eligible], minlength=int(groups.max()) + 1)[order]
        take = order[: int(np.searchsorted(np.cumsum(sizes), n_out)) + 1]
        held = eligible[np.isin(groups[eligible], take)]
        if held.size > OVERSHOOT * n_out or eligible.size - held.size < MIN_TRAINING_QUERIES:
            held, split_groups = _capped_groups(eligible, groups, order, sizes, n_out, rng)
    else:
        held = np.sort(rng.choice(eligible, size=n_out, replace=False)) if n_out else eligible[:0]
    n_train = int(eligible.size - held.size)
    if held.size and n_train < MIN_TRAINING_QUERIES:
        raise HoldoutError(
            f"the holdout leaves {n_train} training quer{'y' if n_train == 1 else 'ies'} with a "
            f"relevant passage (of {eligible.size}; {held.size} held out), fewer than "
            f"{MIN_TRAINING_QUERIES}: lower validation.fraction, or set validation.fraction: 0 "
            "(no early stopping), or train on a split with more judged queries"
        )
    train = np.setdiff1d(np.arange(has_relevant.size), held)
    if stats is not None:
        stats.update(
            heldout_queries=int(held.size),
            training_queries=n_train,
            target_heldout=n_out,
            split_groups=split_groups,
        )
    return train.astype(np.int64), held.astype(np.int64)


def _capped_groups(
    eligible: np.ndarray,
    groups: np.ndarray,
    order: np.ndarray,
    sizes: np.ndarray,
    n_out: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int]:
    """Whole groups (in the seeded ``order``) while they fit in what is left of ``n_out``; then
    the rest of the target from the groups too large to fit, split by a seeded draw. Returns
    the held-out rows (ascending) and the number of groups split."""
    picked: list[np.ndarray] = []
    left = n_out
    too_big = []
    for g, size in zip(order.tolist(), sizes.tolist(), strict=True):
        if size <= left:
            picked.append(eligible[groups[eligible] == g])
            left -= size
        else:
            too_big.append(g)
        if not left:
            break
    n_split = 0
    for g in too_big:
        if not left:
            break
        members = eligible[groups[eligible] == g]
        n = min(left, members.size)
        picked.append(rng.choice(members, size=n, replace=False))
        left -= n
        n_split += 1
    held = np.sort(np.concatenate(picked)) if picked else eligible[:0]
    return held.astype(np.int64), n_split
