"""Re-partitioning a forest's passages (IRLI, Gupta et al. 2021, arXiv 2103.09944).

IRLI alternates, for every repetition (here: every model ``m`` of the forest), two steps:

1. **re-assignment**: each passage goes to the classes its relevant training queries are
   predicted into: score ``S_m(p, c) = sum over positives (q, p) of w_qp P_m(c | q)`` (the
   query model's softmax; ``w`` = the seed's boosting weights ``(1 + e) / (1 + n)``, ``e`` = how
   many earlier models missed the pair); a passage no training query cites scores
   ``P_m(c | x_p)``, its own vector through the query model. Passages take their top-``K``
   classes under the per-class capacity ``ceil((1 + epsilon) K N / C)`` (power-of-K-choices,
   :func:`treerank.forest.capacity.assign_capacity`);
2. **query training**: ``steps`` full-batch Adam steps on the IRLI objective

       J_m = - sum_(q, p) w_qp log sum_{c in A_m(p)} P_m(c | q)  /  sum w_qp

   (the query model's likelihood of its relevant passages' classes, multi-label over the
   passage's ``K`` classes), optionally plus ``lambda J_p`` (``passage_weight``, default 0):

       J_p = - mean over cited passages p of log sum_{c in A_m(p)} P_m(c | x_p)

   the same likelihood for the cited passages' own vectors (a departure from IRLI, after the
   seed's step B: a passage model that puts each selected passage into its queries' class).
   IRLI's new items are indexed through the model by their own vector; ``J_p`` trains exactly
   that path on the training collection, so that passages nobody cites (new articles) land
   where their future queries will be predicted.

The result is the forest with new query models, its passage models replaced by the query
models (plus the never-chosen not-retrievable column), so a new passage is indexed by its own
vector as step 1 indexes a passage without queries, and the explicit table ``A`` for the
training collection. Models are processed ``group_size`` at a time (boosting weights refreshed
after each group, as in :mod:`treerank.forest.trainer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treerank.forest.capacity import assign_capacity
from treerank.forest.losses import boosting_weights
from treerank.forest.model import Forest, passage_init_from_query, stacked_forward
from treerank.storelike import StoreLike


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


LOG_EPS = float(np.log(1e-12))
"""Floor of a log-likelihood ``log sum_{c in A(p)} P(c | q)`` (a likelihood clamped at 1e-12)."""


def _log_likelihood(logp: torch.Tensor, cls: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``(G, E)`` ``log sum_{c in A} P(c | x_row)``, floored at :data:`LOG_EPS`.

    Args:
        logp: ``float32 (n, G, C)`` log-softmax of ``G`` models over ``n`` rows.
        cls: ``int64 (G, E, K)`` each example's classes per model (``-1``: unassigned).
        rows: ``int64 (E,)`` each example's row of ``logp``.
    """
    n, g, c = logp.shape
    idx = (
        rows[None, :, None] * (g * c)
        + torch.arange(g, dtype=torch.int64)[:, None, None] * c
        + cls.clamp_min(0)
    )
    val = logp.reshape(-1)[idx].masked_fill(cls < 0, -1e30)  # finite: no NaN gradients
    return torch.logsumexp(val, -1).clamp_min(LOG_EPS)


def _objective(
    logp: torch.Tensor, cls: torch.Tensor, pos_q: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """``(G,)`` ``J``: ``logp (nq, G, C)`` query log-probabilities, ``cls int64 (G, E, K)`` the
    positive's passage classes, ``pos_q (E,)`` its query row, ``w (E,)`` its weight."""
    like = _log_likelihood(logp, cls, pos_q)  # (G, E)
    return -(like * w).sum(-1) / w.sum().clamp_min(1e-12)


def _log_probs(x: torch.Tensor, ws: list[torch.Tensor], bs: list[torch.Tensor]) -> torch.Tensor:
    """``float32 (n, G, C)`` log-softmax of the stacked models (no copy for linear models)."""
    return torch.log_softmax(stacked_forward(x, ws, bs).transpose(0, 1), -1)


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
    passage_weight: float = 0.0,
    sample: float = 1.0,
    seed: int = 0,
) -> Repartitioned:
    """IRLI re-partitioning of every model of ``forest`` (see the module docstring).

    Args:
        forest: the starting forest (a twin or a trained forest).
        queries: ``float32 (nq, d)`` training queries. pos_q / pos_p: ``int (E,)`` positive
            (query row, passage row) pairs. passages: ``float32 (n, d)``.
        rounds: re-assignment + training rounds per model (``>= 1``). steps: Adam steps per
            round. lr: Adam learning rate. assign: K. capacity_epsilon: the capacity slack
            (None: unbounded). boosting: the seed's weights (else 1). group_size: models at once.
        passage_weight: weight ``lambda`` of the passage term ``J_p`` (module docstring); 0,
            the default, is IRLI's objective alone.
        sample: fraction of the positive pairs each round's query training sees (a fresh
            draw per group of models and round, ``numpy.random.default_rng((seed, m0, r))``;
            the re-assignment always scores every pair); 1.0, the default, is full-batch.
            seed: the draws' seed.

    Returns:
        :class:`Repartitioned`.

    Raises:
        ValueError: empty or out-of-range pairs, ``rounds < 1``, ``passage_weight < 0``.
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
    if not 0.0 < sample <= 1.0:
        raise ValueError(f"repartition: sample must be in (0, 1] (got {sample})")
    if not passage_weight >= 0.0:
        raise ValueError(f"repartition: passage_weight must be >= 0 (got {passage_weight})")
    m_all, c = forest.n_models, forest.n_classes
    kk = min(assign, c)
    # a class's capacity in the re-assignment: (1 + epsilon) times its even share of K * n
    cap = max(
        1, n if capacity_epsilon is None else int(np.ceil((1.0 + capacity_epsilon) * kk * n / c))
    )
    classes = np.full((n, m_all, kk), -1, dtype=np.int32)
    probs = np.zeros((n, m_all, kk), dtype=np.float32)
    cited = np.zeros(n, dtype=bool)
    cited[pos_p] = True
    cited_rows = np.flatnonzero(cited)
    xp_cited = xp[torch.from_numpy(cited_rows)]
    rows_cited = torch.arange(len(cited_rows), dtype=torch.int64)
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
            pc = torch.from_numpy(pc0[:, m0:m1].T.astype(np.int64))  # (g, n), -1: not indexed
            j_init += _objective(_log_probs(xq, ws, bs), pc[:, tp, None], tq, wt).tolist()
        for r in range(rounds):
            with torch.no_grad():
                full = _assignment_scores(xq, xp, ws, bs, tq, tp, wt, cited)
                for i in range(g):
                    ci, pi = assign_capacity(full[i], kk, cap, 1.0)
                    classes[:, m0 + i], probs[:, m0 + i] = ci, pi
                del full
                # (g, E, K) the positives' classes; (g, n_cited, K) the cited passages'
                cls = torch.from_numpy(classes[pos_p, m0:m1].transpose(1, 0, 2).astype(np.int64))
                own_cls = torch.from_numpy(
                    classes[cited_rows, m0:m1].transpose(1, 0, 2).astype(np.int64)
                )
                history[r, 0] += float(_objective(_log_probs(xq, ws, bs), cls, tq, wt).sum())
            if sample < 1.0:  # this round's training pairs, and the queries they read
                xs, ts, cs, wk = _sampled_pairs(xq, pos_q, cls, wt, sample, (seed, m0, r))
            else:
                xs, ts, cs, wk = xq, tq, cls, wt
            passage_term = (
                None if passage_weight <= 0.0 else (passage_weight, xp_cited, own_cls, rows_cited)
            )
            _fit_round(ws, bs, (xs, ts, cs, wk), steps, lr, passage_term)
            with torch.no_grad():
                history[r, 1] += float(_objective(_log_probs(xq, ws, bs), cls, tq, wt).sum())
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


def _assignment_scores(
    xq: torch.Tensor,
    xp: torch.Tensor,
    ws: list[torch.Tensor],
    bs: list[torch.Tensor],
    tq: torch.Tensor,
    tp: torch.Tensor,
    wt: torch.Tensor,
    cited: np.ndarray,
) -> np.ndarray:
    """``float32 (g, n, C + 1)``: each passage's class scores for the re-assignment of a group
    of ``g`` models (IRLI): a cited passage's normalised, boosting-weighted sum of its
    positive queries' class distributions, an uncited one's own distribution under the query
    model; the last column (not retrievable) is 0."""
    g, n = ws[0].shape[0], xp.shape[0]
    pq = torch.softmax(stacked_forward(xq, ws, bs), -1)  # (g, nq, C)
    own = torch.softmax(stacked_forward(xp, ws, bs), -1)  # (g, n, C)
    c = pq.shape[-1]
    score = torch.zeros(g, n, c)
    score.index_add_(1, tp, pq[:, tq] * wt[None, :, None])
    del pq
    tot = score.sum(-1, keepdim=True)
    score = torch.where(torch.from_numpy(cited)[None, :, None], score / tot.clamp_min(1e-12), own)
    return torch.cat([score, torch.zeros(g, n, 1)], -1).numpy().astype(np.float32)


def _sampled_pairs(
    xq: torch.Tensor,
    pos_q: np.ndarray,
    cls: torch.Tensor,
    wt: torch.Tensor,
    sample: float,
    seed: tuple[int, int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A round's ``sample`` fraction of the positive pairs (``default_rng(seed)``, ascending):
    the queries they read, each pair's row among them, their classes and their weights."""
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(pos_q), max(1, round(sample * len(pos_q))), False))
    rows, inv = np.unique(pos_q[keep], return_inverse=True)
    xs, ts = xq[torch.from_numpy(rows)], torch.from_numpy(inv.astype(np.int64))
    return xs, ts, cls[:, torch.from_numpy(keep)], wt[torch.from_numpy(keep)]


def _fit_round(
    ws: list[torch.Tensor],
    bs: list[torch.Tensor],
    pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    steps: int,
    lr: float,
    passage_term: tuple[float, torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> None:
    """``steps`` Adam steps (fresh state, ``lr``) of the group's query models on the round's
    pairs ``(queries, query row per pair, classes, weights)``, with ``passage_term``
    ``(lambda, cited passages, their classes, their rows)`` subtracting ``lambda`` times the
    cited passages' mean log-likelihood of their own classes (None: IRLI's objective alone)."""
    xs, ts, cs, wk = pairs
    opt = torch.optim.Adam([*ws, *bs], lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = _objective(_log_probs(xs, ws, bs), cs, ts, wk).sum()
        if passage_term is not None:
            weight, xp_cited, own_cls, rows_cited = passage_term
            like_p = _log_likelihood(_log_probs(xp_cited, ws, bs), own_cls, rows_cited)
            loss = loss - weight * like_p.mean(-1).sum()
        loss.backward()
        opt.step()


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
