"""Training a TreeRank forest: M query/passage classifier pairs, bagging, boosting, full batch.

The TreeRank seed (Training section), implemented step by step. For every pair ``m`` (in order):

1. **Query model** (``steps_query`` full-batch steps): spread the pair's bag of training queries
   evenly over the ``C`` classes. The loss is a *uniformity* loss on the bag-mean class
   distribution ``pbar = mean_i softmax(z_i)`` (selectable, both normalised to 0 = uniform,
   1 = everything in one class):

   * ``"entropy"``: ``(log C - H(pbar)) / log C`` with ``H(p) = -sum_c p_c log p_c``;
   * ``"gini"``:    ``(C * sum_c pbar_c^2 - 1) / (C - 1)``.

   A loss on the *mean* alone is minimised by making every query uniform over all classes (every
   ``softmax(z_i) = 1/C``), which says nothing about the argmax class the index uses. We
   therefore add a per-query **sharpness** term ``sharpness_weight * mean_i H(softmax(z_i)) /
   log C`` (0 = each query confidently in one class). Uniformity minus per-query entropy is the
   mutual information between queries and classes (IMSAT, Hu et al. 2017; IIC), i.e. *balanced
   and decisive* classes. ``sharpness_weight = 0`` gives the seed's loss alone.
2. **Passage model**: initialised from the query model's weights (plus a not-retrievable output,
   zero weights, bias ``nr_bias_init``), trained ``steps_passage`` steps with the query model
   frozen so that each selected passage falls into its query's (argmax) class,
   ``-log P_p(class(q))``, and each non-selected candidate does not,
   ``-negative_weight * log(1 - P_p(class(q)))``. The ``C + 1``-way softmax includes the
   not-retrievable class, which is how that outcome is learned: a passage pushed out of the
   classes of the queries it is a negative for, and never pulled into one as a positive, drifts
   into "not retrievable". ``nr_penalty * mean P_p(not retrievable)`` keeps the outcome from
   swallowing passages that were simply never seen as positives.
3. **Joint round** (``steps_joint`` steps, ``joint_mode`` ``"joint"`` or ``"alternate"``): both
   models together on the *soft collision probability* ``s(q, p) = sum_c P_q(c) P_p(c)``:
   ``-log s`` for selected pairs, ``-negative_weight * log(1 - s)`` for non-selected pairs, plus
   the query uniformity/sharpness terms so the query classes stay balanced (and, with
   ``passage_uniformity_weight > 0``, the same uniformity loss on the bag's passages over the
   ``C`` real classes, also in stage 2). ``"alternate"``
   updates the query model on even steps and the passage model on odd steps.

Every stage is plain **full-batch** gradient descent (Adam on the whole bag, no mini-batches), with
L2 (``weight_decay * sum W^2``) and dropout (inputs and hidden layers) for strong regularisation.

**Bagging**: each pair sees a random subset of the training queries (``bag_queries``) and of
the negative passages (``bag_passages``; a bagged query's selected passages are always kept), and
starts from its own random init.

**Boosting** (the seed's formula): each (query, selected passage) example has weight
``(1 + e) / (1 + n)``, ``n`` = models trained so far, ``e`` = how many of them did not put the
passage in its query's class (not retrievable counts as a miss). It weights the positive-pair
terms of stages 2 and 3.

**Negatives** per query: its judged non-selected candidates, ``hard_negatives`` most
cosine-similar passages that are not selected for it, and ``random_negatives`` uniformly drawn
passages (re-drawn for every group of pairs).

**What the SciFact sweep says** (train 809 queries -> test 300 queries over all 5,183 passages,
M = 32, C = 32, nDCG@10; cosine = 0.645; ``configs/forest/scifact.yaml``): an untrained forest
(random query models, passage models copied) 0.351; stage 1 alone 0.182 (the uniformity loss on
~570 bagged queries overfits a 384 x 32 linear model: test-query class entropy falls from 3.14
to 2.71 nats); all three stages with ``uniformity_weight`` 1: 0.284 (the joint round collapses the
classes), 5: 0.443; stage 1 switched off (``steps_query: 0``) 0.583; plus
``passage_uniformity_weight`` 5: 0.604. ``weight_decay`` 0.01 (summed L2 on N(0, 1) weights)
shrinks the logits until every query is soft and the argmax collapses to one class: exactly
the failure of a mean-only uniformity loss that the sharpness term is there to resist. The
not-retrievable outcome never crossed its threshold on SciFact (0 % of passages dropped).
At M = 128 that config reaches nDCG@10 0.667 (cosine 0.645, p = 0.48; the linear head 0.780).
On the DL19 pool (5-fold CV over 43 topics, ~34 training topics per fold) training *hurts*:
nDCG@10 0.012 trained, 0.592 untrained, cosine 0.643; too few queries to learn classes from.

**Vectorised training**: ``group_size`` pairs are trained at once as stacked parameters (each with
its own bag, init and dropout; the losses are summed, so each pair's gradients are exactly those
of training it alone). Boosting weights are updated after each group: with ``group_size = 1``
(the strict seed order) ``n`` counts every earlier pair; with ``group_size = G`` the pairs of a
group share the weights computed from the groups before it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from treerank.atomic import atomic_savefig
from treerank.config import ConfigError
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.models.forest import (
    Forest,
    ForestConfig,
    init_layers,
    passage_init_from_query,
    stacked_forward,
)
from treerank.training.config import TrainConfig, parse_train_config
from treerank.training.history import TrainingLog
from treerank.training.trainer import TrainOutput

__all__ = [
    "FOREST_SECTIONS",
    "ForestTrainConfig",
    "forest_train_config",
    "parse_forest_config",
    "plot_forest_curves",
    "boosting_weights",
    "sharpness_loss",
    "train_forest",
    "uniformity_loss",
]

UNIFORMITY_KINDS = ("entropy", "gini")
JOINT_MODES = ("joint", "alternate")
_EPS = 1e-7


# ---------------------------------------------------------------------------------- loss maths
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
        ent = -(mean_probs * torch.log(mean_probs.clamp_min(_EPS))).sum(-1)
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
    ent = -(probs * torch.log(probs.clamp_min(_EPS))).sum(-1) / math.log(c)
    if weights is None:
        return ent.mean(-1)
    return (ent * weights).sum(-1) / weights.sum(-1).clamp_min(_EPS)


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


def _weighted_mean(values: Tensor, weights: Tensor) -> Tensor:
    """``(G, E)`` values and weights -> ``(G,)`` weighted means (0 where all weights are 0)."""
    return (values * weights).sum(-1) / weights.sum(-1).clamp_min(_EPS)


# ---------------------------------------------------------------------------------- config
@dataclass
class ForestTrainConfig:
    """Hyperparameters of :func:`train_forest`, flat (config sections: :data:`FOREST_SECTIONS`).

    The seed's scale is ``n_models = 2000, n_classes = 1000``; the bundled configs use less so
    that the sample pipeline fits a 2-core CPU budget (see ``configs/forest/``).
    """

    n_models: int = 64
    n_classes: int = 64
    hidden: list[int] = field(default_factory=list)
    nr_threshold: float = 0.5
    seed: int = 0
    group_size: int = 16
    bag_queries: float = 0.7
    bag_passages: float = 0.7
    random_negatives: int = 8
    hard_negatives: int = 8
    uniformity: str = "entropy"
    uniformity_weight: float = 1.0
    passage_uniformity_weight: float = 0.0
    sharpness_weight: float = 0.5
    init_scale: float = 1.0
    lr: float = 0.05
    weight_decay: float = 1e-4
    dropout: float = 0.1
    steps_query: int = 40
    steps_passage: int = 60
    steps_joint: int = 30
    joint_mode: str = "joint"
    negative_weight: float = 1.0
    nr_bias_init: float = -4.0
    nr_penalty: float = 1.0
    boosting: bool = True
    num_threads: int | None = 1
    validate_at: list[int] | None = None
    name: str = "forest"

    @classmethod
    def from_dict(
        cls, cfg: Mapping[str, Any], *, where: str = "forest config"
    ) -> ForestTrainConfig:
        """Validate a config mapping.

        Raises:
            ValueError: unknown keys (listed with the allowed ones) or out-of-range values.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        out = cls(**dict(cfg))
        out.check(where)
        return out

    def check(self, where: str = "forest config") -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"{where}: {msg}")

        if self.n_models < 1 or self.n_classes < 2:
            bad("n_models must be >= 1 and n_classes >= 2")
        if self.group_size < 1:
            bad("group_size must be >= 1")
        for name in ("bag_queries", "bag_passages"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                bad(f"{name} must be in (0, 1] (got {v})")
        if self.uniformity not in UNIFORMITY_KINDS:
            bad(f"uniformity must be one of {UNIFORMITY_KINDS} (got {self.uniformity!r})")
        if self.joint_mode not in JOINT_MODES:
            bad(f"joint_mode must be one of {JOINT_MODES} (got {self.joint_mode!r})")
        if not 0.0 <= self.dropout < 1.0:
            bad(f"dropout must be in [0, 1) (got {self.dropout})")
        for name in ("steps_query", "steps_passage", "steps_joint", "random_negatives"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0")
        if self.hard_negatives < 0:
            bad("hard_negatives must be >= 0")

    def forest_config(self, dim: int) -> ForestConfig:
        return ForestConfig(
            self.n_models, self.n_classes, dim, tuple(self.hidden), self.nr_threshold
        )


FOREST_SECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("n_models", "n_classes", "hidden", "nr_threshold", "name"),
    "data": ("bag_queries", "bag_passages", "random_negatives", "hard_negatives"),
    "trainer": (
        "group_size",
        "uniformity",
        "uniformity_weight",
        "passage_uniformity_weight",
        "sharpness_weight",
        "init_scale",
        "lr",
        "weight_decay",
        "dropout",
        "steps_query",
        "steps_passage",
        "steps_joint",
        "joint_mode",
        "negative_weight",
        "nr_bias_init",
        "nr_penalty",
        "boosting",
        "num_threads",
        "validate_at",
    ),
}
"""Which :class:`ForestTrainConfig` field each section of the forest's config holds."""


def forest_train_config(cfg: TrainConfig, where: str = "config") -> ForestTrainConfig:
    """The flat :class:`ForestTrainConfig` of a parsed sectioned config (range-checked)."""
    flat = {**cfg.model, **(cfg.data or {}), **(cfg.trainer or {}), "seed": cfg.seed}
    return ForestTrainConfig.from_dict(flat, where=where)


def parse_forest_config(
    cfg: Mapping[str, Any] | TrainConfig | None, where: str = "config"
) -> TrainConfig:
    """The ``forest`` family's config: ``seed`` + ``model / data / trainer / validation``
    sections holding the :class:`ForestTrainConfig` fields listed in :data:`FOREST_SECTIONS`.

    Raises:
        ConfigError: unknown key (names the key path and the allowed keys) or a bad value.
    """
    if isinstance(cfg, TrainConfig):
        return cfg
    out = parse_train_config(
        cfg,
        model=FOREST_SECTIONS["model"],
        data=FOREST_SECTIONS["data"],
        trainer=FOREST_SECTIONS["trainer"],
        where=where,
        model_exclude=(),
    )
    try:
        forest_train_config(out, where)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    return out


def plot_forest_curves(
    records: list[dict[str, Any]], summary: dict[str, Any], path: str | Path, title: str = ""
) -> Path | None:
    """The forest's curves for its model directory: held-out metrics against M (or None when
    it was trained without validation)."""
    curve = summary.get("curve") or []
    return plot_metric_vs_models(curve, path, title=title) if curve else None


# ---------------------------------------------------------------------------------- data
@dataclass
class _PairData:
    """Training examples over the store, in store ids."""

    queries: np.ndarray  # int64 (nq,) store rows of queries with >= 1 selected passage
    pos_q: np.ndarray  # int64 (E+,) index into ``queries``
    pos_p: np.ndarray  # int64 (E+,) store passage ids
    neg_q: np.ndarray  # int64 (E-,) fixed negatives (judged non-selected + hard)
    neg_p: np.ndarray
    pos_keys: np.ndarray  # sorted int64 keys q_index * n_passages + p of the positives


def _mine_hard_negatives(
    q: np.ndarray, passages: Any, pos_q: np.ndarray, pos_p: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` cosine passages per query that are not selected for it.

    Cosine of the stored vectors (both sides L2-normalised, the one rule of
    ``treerank.kernels.vectors``), ranked by the exact streaming kernel
    (``treerank.kernels.topk.exact_search``: ties by ascending passage id).
    """
    nq, n = len(q), passages.shape[0]
    if k == 0 or nq == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kk = min(n, k + int(np.bincount(pos_q, minlength=nq).max()))
    best_i, _ = exact_search(l2_normalize(q), passages, k=kk, passage_transform=l2_normalize)
    is_pos = np.isin(
        np.arange(nq)[:, None] * n + best_i, pos_q * n + pos_p
    )  # (nq, kk) selected ones are not negatives
    rank = np.cumsum(~is_pos, axis=1)
    keep = ~is_pos & (rank <= k) & (best_i >= 0)
    rows, cols = np.nonzero(keep)
    return rows.astype(np.int64), best_i[rows, cols].astype(np.int64)


def _pair_data(store: Any, hard_negatives: int, train_rows: np.ndarray | None) -> _PairData:
    cand = np.asarray(store.candidates)
    lab = np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    n_pass = int(store.n_passages)
    valid = cand >= 0
    pos = valid & (lab >= thr)
    has_pos: np.ndarray = np.asarray(pos.any(axis=1))
    if train_rows is not None:
        allowed = np.zeros(has_pos.shape[0], dtype=np.bool_)
        allowed[np.asarray(train_rows, dtype=np.int64)] = True
        has_pos = has_pos & allowed
    queries = np.nonzero(has_pos)[0].astype(np.int64)
    if len(queries) == 0:
        raise ValueError(f"{store.path}: no query has a selected passage; cannot train a forest")
    cand, lab, pos, valid = cand[queries], lab[queries], pos[queries], valid[queries]
    pq, pc = np.nonzero(pos)
    nq_, nc = np.nonzero(valid & ~pos)
    pos_p = cand[pq, pc].astype(np.int64)
    neg_q, neg_p = nq_.astype(np.int64), cand[nq_, nc].astype(np.int64)
    if hard_negatives > 0:
        qv = np.asarray(store.queries[queries], dtype=np.float32)
        hq, hp = _mine_hard_negatives(qv, store.passages, pq, pos_p, hard_negatives)
        neg_q, neg_p = np.concatenate([neg_q, hq]), np.concatenate([neg_p, hp])
        keys = np.unique(neg_q * n_pass + neg_p)
        neg_q, neg_p = keys // n_pass, keys % n_pass
    return _PairData(
        queries=queries,
        pos_q=pq.astype(np.int64),
        pos_p=pos_p,
        neg_q=neg_q,
        neg_p=neg_p,
        pos_keys=np.unique(pq.astype(np.int64) * n_pass + pos_p),
    )


# ---------------------------------------------------------------------------------- training
@dataclass
class _Group:
    """Tensors of one group of ``G`` pairs trained together."""

    xq: Tensor  # (nq, d)
    xp: Tensor  # (nU, d)
    qmask: Tensor  # (G, nq) bag of queries
    pos_q: Tensor  # (E+,) index into xq
    pos_p: Tensor  # (E+,) index into xp
    pos_w: Tensor  # (G, E+) bag * boosting weight
    neg_q: Tensor
    neg_p: Tensor
    neg_w: Tensor  # (G, E-) bag * negative_weight
    pmask: Tensor  # (G, nU) passages in the bag


def _l2(ws: list[Tensor]) -> Tensor:
    return sum((w**2).sum(dim=tuple(range(1, w.ndim))) for w in ws)  # type: ignore[return-value]


def _query_terms(cfg: ForestTrainConfig, g: _Group, qw: list[Tensor], qb: list[Tensor]) -> Tensor:
    """``(G,)`` uniformity + sharpness of the query models on their bags."""
    pq = torch.softmax(stacked_forward(g.xq, qw, qb, dropout=cfg.dropout, training=True), -1)
    w = g.qmask
    pbar = (pq * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp_min(_EPS)
    loss = cfg.uniformity_weight * uniformity_loss(pbar, cfg.uniformity)
    if cfg.sharpness_weight > 0:
        loss = loss + cfg.sharpness_weight * sharpness_loss(pq, w)
    return loss


def _run_steps(
    params: list[Tensor], steps: int, lr: float, loss_fn: Callable[[int], Tensor]
) -> float:
    if steps == 0 or not params:
        return float("nan")
    opt = torch.optim.Adam(params, lr=lr)
    last = float("nan")
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(step)
        loss.backward()
        opt.step()
        last = float(loss.detach())
    return last


def _train_group(
    cfg: ForestTrainConfig, g: _Group, qw: list[Tensor], qb: list[Tensor], gen: torch.Generator
) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], dict[str, float]]:
    """Stages 1-3 for one group; returns trained (query, passage) stacks and stage losses."""
    n_g = qw[0].shape[0]
    for t in (*qw, *qb):
        t.requires_grad_(True)

    # Stage 1: query model, uniformity (+ sharpness) on the bag.
    def q_loss(_: int) -> Tensor:
        return (_query_terms(cfg, g, qw, qb) + cfg.weight_decay * _l2(qw)).sum()

    loss1 = _run_steps([*qw, *qb], cfg.steps_query, cfg.lr, q_loss) / n_g

    # Stage 2: passage model from the query model's weights; the query classes are the targets.
    with torch.no_grad():
        target = stacked_forward(g.xq, qw, qb).argmax(-1)  # (G, nq)
    pw, pb = passage_init_from_query(qw, qb, cfg.nr_bias_init)
    for t in (*pw, *pb):
        t.requires_grad_(True)
    rows = torch.arange(n_g).unsqueeze(1)
    t_pos = target[:, g.pos_q]  # (G, E+)
    t_neg = target[:, g.neg_q]

    def nr_term(logp: Tensor) -> Tensor:
        if cfg.nr_penalty <= 0:
            return torch.zeros(n_g)
        return cfg.nr_penalty * _weighted_mean(logp[..., -1].exp(), g.pmask)

    def passage_balance(pp: Tensor) -> Tensor:
        """Uniformity of the bag's passages over the C real classes (0 when switched off)."""
        if cfg.passage_uniformity_weight <= 0:
            return torch.zeros(n_g)
        real = pp[..., :-1] * g.pmask.unsqueeze(-1)
        pbar = real.sum(1) / real.sum((1, 2)).clamp_min(_EPS).unsqueeze(-1)
        return cfg.passage_uniformity_weight * uniformity_loss(pbar, cfg.uniformity)

    def p_loss(_: int) -> Tensor:
        logp = torch.log_softmax(
            stacked_forward(g.xp, pw, pb, dropout=cfg.dropout, training=True), -1
        )  # (G, nU, C+1)
        lp_pos = logp[rows, g.pos_p.unsqueeze(0), t_pos]
        lp_neg = logp[rows, g.neg_p.unsqueeze(0), t_neg]
        loss = _weighted_mean(-lp_pos, g.pos_w)
        loss = loss + _weighted_mean(-torch.log1p(-lp_neg.exp().clamp_max(1 - 1e-6)), g.neg_w)
        loss = loss + nr_term(logp) + passage_balance(logp.exp())
        return (loss + cfg.weight_decay * _l2(pw)).sum()

    loss2 = _run_steps([*pw, *pb], cfg.steps_passage, cfg.lr, p_loss) / n_g

    # Stage 3: joint (or alternating) round on the soft collision probability.
    def j_loss(_: int) -> Tensor:
        zq = stacked_forward(g.xq, qw, qb, dropout=cfg.dropout, training=True)
        pq = torch.softmax(zq, -1)  # (G, nq, C)
        pp = torch.softmax(
            stacked_forward(g.xp, pw, pb, dropout=cfg.dropout, training=True), -1
        )  # (G, nU, C+1)
        s_pos = (pq[:, g.pos_q] * pp[:, g.pos_p, :-1]).sum(-1)
        s_neg = (pq[:, g.neg_q] * pp[:, g.neg_p, :-1]).sum(-1)
        loss = _weighted_mean(-torch.log(s_pos.clamp_min(_EPS)), g.pos_w)
        loss = loss + _weighted_mean(-torch.log1p(-s_neg.clamp_max(1 - 1e-6)), g.neg_w)
        w = g.qmask
        pbar = (pq * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp_min(_EPS)
        loss = loss + cfg.uniformity_weight * uniformity_loss(pbar, cfg.uniformity)
        if cfg.sharpness_weight > 0:
            loss = loss + cfg.sharpness_weight * sharpness_loss(pq, w)
        if cfg.nr_penalty > 0:
            loss = loss + cfg.nr_penalty * _weighted_mean(pp[..., -1], g.pmask)
        loss = loss + passage_balance(pp)
        return (loss + cfg.weight_decay * (_l2(qw) + _l2(pw))).sum()

    if cfg.joint_mode == "joint":
        loss3 = _run_steps([*qw, *qb, *pw, *pb], cfg.steps_joint, cfg.lr, j_loss) / n_g
    else:
        loss3 = float("nan")
        if cfg.steps_joint > 0:
            opt_q = torch.optim.Adam([*qw, *qb], lr=cfg.lr)
            opt_p = torch.optim.Adam([*pw, *pb], lr=cfg.lr)
            for step in range(cfg.steps_joint):
                opt = opt_q if step % 2 == 0 else opt_p
                opt_q.zero_grad(set_to_none=True)
                opt_p.zero_grad(set_to_none=True)
                loss = j_loss(step)
                loss.backward()
                opt.step()
                loss3 = float(loss.detach()) / n_g
    detach = [[t.detach() for t in ts] for ts in (qw, qb, pw, pb)]
    return (
        detach[0],
        detach[1],
        detach[2],
        detach[3],
        {"loss_query": loss1, "loss_passage": loss2, "loss_joint": loss3},
    )


def _bernoulli_mask(gen: np.random.Generator, n_g: int, n: int, frac: float) -> np.ndarray:
    """``(G, n)`` float32 0/1 with exactly ``ceil(frac * n)`` ones per row."""
    k = max(1, math.ceil(frac * n))
    mask = np.zeros((n_g, n), dtype=np.float32)
    for i in range(n_g):
        mask[i, gen.choice(n, size=k, replace=False)] = 1.0
    return mask


def _default_validate_at(n_models: int) -> list[int]:
    pts = [2**i for i in range(int(math.log2(n_models)) + 1)]
    return sorted({p for p in pts if p <= n_models} | {n_models})


def train_forest(
    store: Any,
    config: Mapping[str, Any] | TrainConfig | None = None,
    *,
    train_rows: np.ndarray | None = None,
    validate: Callable[[Forest], Mapping[str, float]] | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
) -> TrainOutput:
    """Train a TreeRank forest on a store's training queries (see the module docstring).

    Args:
        store: an ``EmbeddingStore`` with labelled queries (selected passages).
        config: the sectioned config (:func:`parse_forest_config`) or its parsed form.
        train_rows: query rows to train on (default: all with a selected passage); the pipeline
            passes the rows it did not hold out for validation.
        validate: ``validate(forest) -> {"mrr@10": ..., ...}`` on held-out queries; called on the
            first ``m`` pairs for every ``m`` in ``validate_at`` (default: powers of two and M),
            which gives the metric-vs-M curve at no extra training cost.
        log: where the records go (one ``"pair"`` record per group, ``"eval"`` records, a
            ``"summary"``); None: in memory.
        progress: tqdm bar over pairs.

    Returns:
        ``TrainOutput(model=Forest, summary=..., records=...)``; ``summary`` holds the
        configuration, the metric-vs-M ``curve``, class-balance statistics and timings.

    Raises:
        ConfigError: bad config (names the key path). ValueError: a store without selected
            passages.
    """
    parsed = parse_forest_config(config)
    cfg = forest_train_config(parsed)
    t_start = time.perf_counter()
    torch_gen = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    data = _pair_data(store, cfg.hard_negatives, train_rows)
    n_pass = int(store.n_passages)
    dim = int(store.dim)
    fcfg = cfg.forest_config(dim)
    xq_all = torch.from_numpy(np.asarray(store.queries[data.queries], dtype=np.float32))
    nq = len(data.queries)
    misses = np.zeros(len(data.pos_q), dtype=np.int64)
    q_stacks: list[list[Tensor]] = [[] for _ in range(4)]
    records: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    validate_at = sorted(set(cfg.validate_at or _default_validate_at(cfg.n_models)))
    tlog = log if log is not None else TrainingLog()

    def write(rec: dict[str, Any]) -> None:
        records.append(rec)
        tlog.write(str(rec["kind"]), **{k: v for k, v in rec.items() if k != "kind"})

    bar = tqdm(total=cfg.n_models, desc="forest pairs", unit="pair", disable=not progress)
    n_done = 0
    threads = torch.get_num_threads()
    if cfg.num_threads:
        # Each step is tiny: one thread avoids oversubscription (6x faster on a busy 2-core box).
        torch.set_num_threads(cfg.num_threads)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)  # dropout masks: reproducible, global RNG left untouched
        try:
            while n_done < cfg.n_models:
                n_g = min(cfg.group_size, cfg.n_models - n_done)
                t0 = time.perf_counter()
                # Negatives of this group: fixed (judged + hard) plus fresh random draws.
                rq = np.repeat(np.arange(nq, dtype=np.int64), cfg.random_negatives)
                rp = rng.integers(0, n_pass, size=len(rq))
                not_pos = ~np.isin(rq * n_pass + rp, data.pos_keys)
                neg_q = np.concatenate([data.neg_q, rq[not_pos]])
                neg_p = np.concatenate([data.neg_p, rp[not_pos]])
                used, inv = np.unique(np.concatenate([data.pos_p, neg_p]), return_inverse=True)
                pos_pi, neg_pi = inv[: len(data.pos_p)], inv[len(data.pos_p) :]
                xp = torch.from_numpy(np.asarray(store.passages[used], dtype=np.float32))
                # Bagging: queries, and negatives' passages; a bagged query keeps its positives.
                qmask = _bernoulli_mask(rng, n_g, nq, cfg.bag_queries)
                pmask = _bernoulli_mask(rng, n_g, len(used), cfg.bag_passages)
                pos_in = qmask[:, data.pos_q]
                g_rows, e_cols = np.nonzero(pos_in)
                pmask[g_rows, pos_pi[e_cols]] = 1.0
                boost = (
                    boosting_weights(misses, n_done) if cfg.boosting else np.ones(len(misses))
                ).astype(np.float32)
                group = _Group(
                    xq=xq_all,
                    xp=xp,
                    qmask=torch.from_numpy(qmask),
                    pos_q=torch.from_numpy(data.pos_q),
                    pos_p=torch.from_numpy(pos_pi.astype(np.int64)),
                    pos_w=torch.from_numpy(pos_in * boost[None, :]),
                    neg_q=torch.from_numpy(neg_q),
                    neg_p=torch.from_numpy(neg_pi.astype(np.int64)),
                    neg_w=torch.from_numpy(
                        (qmask[:, neg_q] * pmask[:, neg_pi] * cfg.negative_weight).astype(
                            np.float32
                        )
                    ),
                    pmask=torch.from_numpy(pmask),
                )
                qw, qb = init_layers(fcfg.layer_shapes("query"), n_g, torch_gen, cfg.init_scale)
                qw, qb, pw, pb, losses = _train_group(cfg, group, qw, qb, torch_gen)
                for stack, ts in zip(q_stacks, (qw, qb, pw, pb), strict=True):
                    stack.append(ts)  # type: ignore[arg-type]
                # Boosting bookkeeping over every training example (not only the bag).
                part = Forest(
                    ForestConfig(n_g, fcfg.n_classes, dim, fcfg.hidden, fcfg.nr_threshold),
                    qw,
                    qb,
                    pw,
                    pb,
                )
                qc, _ = part.query_classes(xq_all.numpy())
                pc, _ = part.passage_classes(xp.numpy())
                miss = qc[data.pos_q] != pc[pos_pi]  # (E+, G)
                misses += miss.sum(axis=1)
                ent_q = _entropy_rows(qc, fcfg.n_classes)
                rec = {
                    "kind": "pair",
                    "models": [n_done, n_done + n_g],
                    **losses,
                    "train_match_rate": float(1.0 - miss.mean()),
                    "query_class_entropy": float(ent_q.mean()),
                    "max_entropy": math.log(fcfg.n_classes),
                    "not_retrievable_fraction": float((pc < 0).mean()),
                    "mean_boost_weight": float(boost.mean()),
                    "seconds": time.perf_counter() - t0,
                }
                write(rec)
                n_done += n_g
                bar.update(n_g)
                bar.set_postfix(
                    match=f"{rec['train_match_rate']:.2f}",
                    nr=f"{rec['not_retrievable_fraction']:.2f}",
                )
                if validate is not None:
                    for m in [v for v in validate_at if n_done - n_g < v <= n_done]:
                        forest_m = _assemble(fcfg, q_stacks, cfg.name).subset(m)
                        metrics = {k: float(v) for k, v in validate(forest_m).items()}
                        point = {"n_models": m, **metrics}
                        curve.append(point)
                        write({"kind": "eval", **point})
        finally:
            bar.close()
            torch.set_num_threads(threads)
    forest = _assemble(fcfg, q_stacks, cfg.name)
    pair_recs = [r for r in records if r["kind"] == "pair"]
    summary: dict[str, Any] = {
        "config": parsed.to_dict(),
        "n_train_queries": nq,
        "n_positive_pairs": len(data.pos_q),
        "n_fixed_negative_pairs": len(data.neg_q),
        "final_train_match_rate_mean": float(np.mean([r["train_match_rate"] for r in pair_recs])),
        "query_class_entropy_mean": float(np.mean([r["query_class_entropy"] for r in pair_recs])),
        "max_entropy": math.log(fcfg.n_classes),
        "not_retrievable_fraction_train": float(
            np.mean([r["not_retrievable_fraction"] for r in pair_recs])
        ),
        "seconds": time.perf_counter() - t_start,
        "curve": curve,
    }
    write({"kind": "summary", **{k: v for k, v in summary.items() if k != "config"}})
    forest.extra["training"] = summary
    return TrainOutput(model=forest, summary=summary, records=tlog.records)


def _entropy_rows(classes: np.ndarray, n_classes: int) -> np.ndarray:
    """Per-model entropy of class usage, ``classes int (n, M)``, -1 ignored -> ``(M,)``."""
    n, m = classes.shape
    keys = (np.arange(m)[None, :] * n_classes + classes)[classes >= 0]
    cnt = np.bincount(keys, minlength=m * n_classes).reshape(m, n_classes).astype(np.float64)
    p = cnt / np.maximum(cnt.sum(1, keepdims=True), 1)
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(1)


def _assemble(fcfg: ForestConfig, stacks: list[list[Tensor]], name: str) -> Forest:
    def cat(parts: list[Any]) -> list[Tensor]:
        return [torch.cat([p[i] for p in parts], 0) for i in range(len(parts[0]))]

    qw, qb, pw, pb = (cat(s) for s in stacks)
    n = qw[0].shape[0]
    cfg = ForestConfig(n, fcfg.n_classes, fcfg.dim, fcfg.hidden, fcfg.nr_threshold)
    return Forest(cfg, qw, qb, pw, pb, name=name)


def plot_metric_vs_models(
    curve: list[dict[str, Any]],
    path: str | Path,
    title: str = "",
    baselines: dict[str, Any] | None = None,
) -> Path:
    """PNG of held-out metrics against the number of models M (log-2 x axis).

    Args:
        curve: ``[{"n_models": m, "mrr@10": ..., ...}, ...]``.
        path: PNG to write (atomically).
        title: figure title.
        baselines: optional ``{label: {metric: value}}`` drawn as horizontal dashed lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    metrics = [k for k in curve[0] if k != "n_models"] if curve else []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [p["n_models"] for p in curve]
    for i, mname in enumerate(metrics):
        color = f"C{i}"
        ax.plot(xs, [p[mname] for p in curve], marker="o", color=color, label=f"forest {mname}")
        for j, (label, vals) in enumerate((baselines or {}).items()):
            if mname in vals:
                ax.axhline(
                    vals[mname],
                    color=color,
                    ls=["--", ":", "-."][j % 3],
                    lw=1,
                    label=f"{label} {mname}",
                )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("number of models M")
    ax.set_ylabel("metric (held-out, full split)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    return path
