"""Re-partitioning a forest's passages (IRLI, Gupta et al. 2021, arXiv 2103.09944).

IRLI alternates, for every repetition (here: every model ``m`` of the forest), two steps:

1. **re-assignment**: each passage goes to the classes its relevant training queries are
   predicted into: score ``S_m(p, c) = sum over positives (q, p) of w_qp P_m(c | q)`` (the
   query model's softmax; ``w`` = the seed's boosting weights ``(1 + e) / (1 + n)``, ``e`` = how
   many earlier models missed the pair); a passage no training query cites scores
   ``P_m(c | x_p)``, its own vector through the query model. Passages take their top-``K``
   classes under the per-class capacity ``ceil((1 + epsilon) K N / C)`` (power-of-K-choices,
   :func:`treerank.kernels.capacity.assign_capacity`);
2. **query training**: ``steps`` full-batch Adam steps on the IRLI objective

       J_m = - sum_(q, p) w_qp log sum_{c in A_m(p)} P_m(c | q)  /  sum w_qp

   (the query model's likelihood of its relevant passages' classes, multi-label over the
   passage's ``K`` classes).

The result is the forest with new query models, its passage models replaced by the query
models (plus the never-chosen not-retrievable column), so a new passage is indexed by its own
vector as step 1 indexes a passage without queries, and the explicit table ``A`` for the
training collection. Models are processed ``group_size`` at a time (boosting weights refreshed
after each group, as in :mod:`treerank.training.forest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treerank.kernels.capacity import assign_capacity
from treerank.models.forest import Forest, passage_init_from_query, stacked_forward
from treerank.storelike import StoreLike
from treerank.training.forest_losses import boosting_weights


@dataclass
class Repartitioned:
    """Output of :func:`repartition`.

    Attributes:
        forest: new query models; passage models = the query models (new passages by their own
            vector).
        classes: ``int32 (n, M, K)`` the passages' assigned classes (``-1`` unassigned).
        probs: ``float32 (n, M, K)`` their normalised assignment scores.
        objective: per round, the mean over models of ``J`` after the re-assignment and after
            the query training (``[[after_assign, after_train], ...]``); ``objective_initial``:
            ``J`` of the input forest with its own passage classes.
    """

    forest: Forest
    classes: np.ndarray
    probs: np.ndarray
    objective: list[list[float]] = field(default_factory=list)
    objective_initial: float = float("nan")


def _objective(pq: torch.Tensor, member: torch.Tensor, pos_q: torch.Tensor, w: torch.Tensor):
    """``(G,)`` ``J``: ``pq (G, nq, C)`` query probabilities, ``member bool (G, E, C)`` the
    positive's passage classes, ``w (E,)``."""
    like = (pq[:, pos_q] * member).sum(-1).clamp_min(1e-12)  # (G, E)
    return -(torch.log(like) * w).sum(-1) / w.sum().clamp_min(1e-12)


def repartition(
    forest: Forest,
    queries: np.ndarray,
    pos_q: np.ndarray,
    pos_p: np.ndarray,
    passages: np.ndarray,
    *,
    rounds: int = 2,
    steps: int = 20,
    lr: float = 0.05,
    assign: int = 1,
    capacity_epsilon: float | None = 0.2,
    boosting: bool = True,
    group_size: int = 8,
) -> Repartitioned:
    """IRLI re-partitioning of every model of ``forest`` (see the module docstring).

    Args:
        forest: the starting forest (a twin or a trained forest).
        queries: ``float32 (nq, d)`` training queries. pos_q / pos_p: ``int (E,)`` positive
            (query row, passage row) pairs. passages: ``float32 (n, d)``.
        rounds: re-assignment + training rounds per model (``>= 1``). steps: Adam steps per
            round. lr: Adam learning rate. assign: K. capacity_epsilon: the capacity slack
            (None: unbounded). boosting: the seed's weights (else 1). group_size: models at once.

    Returns:
        :class:`Repartitioned`.

    Raises:
        ValueError: empty or out-of-range pairs, ``rounds < 1``.
    """
    pos_q = np.asarray(pos_q, dtype=np.int64)
    pos_p = np.asarray(pos_p, dtype=np.int64)
    xq = torch.from_numpy(np.array(queries, dtype=np.float32))
    xp = torch.from_numpy(np.array(passages, dtype=np.float32))
    nq, n = xq.shape[0], xp.shape[0]
    if rounds < 1 or len(pos_q) == 0 or len(pos_q) != len(pos_p):
        raise ValueError("repartition: need rounds >= 1 and matching, non-empty pairs")
    if pos_q.min() < 0 or pos_q.max() >= nq or pos_p.min() < 0 or pos_p.max() >= n:
        raise ValueError("repartition: pair rows out of range")
    m_all, c = forest.n_models, forest.n_classes
    kk = min(assign, c)
    classes = np.full((n, m_all, kk), -1, dtype=np.int32)
    probs = np.zeros((n, m_all, kk), dtype=np.float32)
    cited = np.zeros(n, dtype=bool)
    cited[pos_p] = True
    # objective of the input forest with its own passage classes
    pc0, _ = forest.passage_classes(passages)
    misses = np.zeros(len(pos_q), dtype=np.int64)
    tq, tp = torch.from_numpy(pos_q), torch.from_numpy(pos_p)
    new_w: list[list[torch.Tensor]] = [[] for _ in forest.query_weights]
    new_b: list[list[torch.Tensor]] = [[] for _ in forest.query_biases]
    j_init: list[float] = []
    history = np.zeros((rounds, 2))
    for m0 in range(0, m_all, group_size):
        m1 = min(m_all, m0 + group_size)
        g = m1 - m0
        ws = [w[m0:m1].clone().requires_grad_(True) for w in forest.query_weights]
        bs = [b[m0:m1].clone().requires_grad_(True) for b in forest.query_biases]
        wt = torch.from_numpy(
            boosting_weights(misses, m0) if boosting else np.ones(len(pos_q), np.float32)
        )
        with torch.no_grad():
            pq = torch.softmax(stacked_forward(xq, ws, bs), -1)
            pc = torch.from_numpy(pc0[:, m0:m1].T.astype(np.int64))  # (g, n)
            member = torch.zeros(g, len(pos_q), c, dtype=torch.bool)
            valid = pc[:, tp] >= 0
            member.scatter_(2, pc[:, tp].clamp_min(0).unsqueeze(-1), valid.unsqueeze(-1))
            j_init += _objective(pq, member, tq, wt).tolist()
        for r in range(rounds):
            with torch.no_grad():
                pq = torch.softmax(stacked_forward(xq, ws, bs), -1)  # (g, nq, C)
                own = torch.softmax(stacked_forward(xp, ws, bs), -1)  # (g, n, C)
                score = torch.zeros(g, n, c)
                score.index_add_(1, tp, pq[:, tq] * wt[None, :, None])
                tot = score.sum(-1, keepdim=True)
                score = torch.where(
                    torch.from_numpy(cited)[None, :, None], score / tot.clamp_min(1e-12), own
                )
                full = torch.cat([score, torch.zeros(g, n, 1)], -1).numpy().astype(np.float32)
                member = torch.zeros(g, len(pos_q), c, dtype=torch.bool)
                for i in range(g):
                    cap = (
                        n
                        if capacity_epsilon is None
                        else int(np.ceil((1.0 + capacity_epsilon) * kk * n / c))
                    )
                    ci, pi = assign_capacity(full[i], kk, max(1, cap), 1.0)
                    classes[:, m0 + i], probs[:, m0 + i] = ci, pi
                    cls = torch.from_numpy(ci.astype(np.int64))[tp]  # (E, K)
                    member[i].scatter_(1, cls.clamp_min(0), cls >= 0)
                history[r, 0] += float(_objective(pq, member, tq, wt).sum())
            opt = torch.optim.Adam([*ws, *bs], lr=lr)
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                pq = torch.softmax(stacked_forward(xq, ws, bs), -1)
                loss = _objective(pq, member, tq, wt).sum()
                loss.backward()
                opt.step()
            with torch.no_grad():
                pq = torch.softmax(stacked_forward(xq, ws, bs), -1)
                history[r, 1] += float(_objective(pq, member, tq, wt).sum())
        with torch.no_grad():
            qcls = torch.softmax(stacked_forward(xq, ws, bs), -1).argmax(-1)  # (g, nq)
            hit = (
                torch.from_numpy(classes[pos_p, m0:m1].transpose(1, 0, 2).astype(np.int64))
                == qcls[:, tq].unsqueeze(-1)
            ).any(-1)  # (g, E)
            misses += (~hit).sum(0).numpy()
        for lst, t in zip(new_w, ws, strict=True):
            lst.append(t.detach())
        for lst, t in zip(new_b, bs, strict=True):
            lst.append(t.detach())
    qw = [torch.cat(parts) for parts in new_w]
    qb = [torch.cat(parts) for parts in new_b]
    pw, pb = passage_init_from_query(qw, qb)
    out = Forest(forest.config, qw, qb, pw, pb, name=f"{forest.name}-irli", search=forest.search)
    return Repartitioned(
        out,
        classes,
        probs,
        (history / m_all).tolist(),
        float(np.mean(j_init)),
    )


def repartition_store(forest: Forest, store: StoreLike, **kwargs: Any) -> Repartitioned:
    """:func:`repartition` on a store's labelled queries (every selected candidate a positive)."""
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    pos = (cand >= 0) & (lab >= int(store.relevance_threshold))
    rows, cols = np.nonzero(pos)
    return repartition(
        forest,
        np.asarray(store.queries, dtype=np.float32),
        rows,
        cand[rows, cols].astype(np.int64),
        np.asarray(store.passages, dtype=np.float32),
        **kwargs,
    )
