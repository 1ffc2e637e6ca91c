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
   not-retrievable class, learned by ``nr_weight * not_retrievable_loss`` (passages met in
   their class only by queries that judge them negative go out of the model's index; known
   positives stay in; :mod:`treerank.forest.losses`), against ``nr_penalty * mean
   P_p(not retrievable)``.
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

**IRLI re-partitioning** (``trainer.repartition: {rounds, steps, lr}``, off by default): after
the last pair, the trained forest is re-partitioned on the training pairs
(:mod:`treerank.forest.repartition`; the curve is then measured on the re-partitioned
forest).

**Training pairs**: the split's labels, or the shared ``data.sources`` list (labels,
pseudo-queries, teacher pairs; :mod:`treerank.training.data`) that the heads and DRT read, turned
into (query, selected passage) positives by
:func:`treerank.forest.data.source_pair_data`.

**Negatives** per query: its judged non-selected candidates, ``hard_negatives`` most
cosine-similar passages that are not selected for it (mined through the exact top-k kernel), and
``random_negatives`` passages from the pair's own pool of ``random_pool`` random passages.

**Bounded memory**: every step is one full-batch gradient, computed ``chunk_size`` rows or
examples at a time (:func:`_blocked_step`, :func:`treerank.forest.stages.stage_backward`):
the logits of a block are recomputed from its input rows whenever a pass needs them and never
held whole, so a step holds ``O(G * chunk_size * (d + C))`` floats plus ``(G, n)``
bookkeeping, not the ``(G, n, C)`` logits and their gradient (measured: ``docs/forest.md``,
Scale).

Measured results (SciFact, DL19, the sweeps behind the shipped settings) are in
``docs/forest.md``; the configs in ``configs/forest/``.

**Vectorised training**: ``group_size`` pairs are trained at once as stacked parameters (each with
its own seed, bag, init, random negatives and dropout stream; the losses are summed, so each pair
trains exactly as it would alone, tested). Boosting weights are updated after each group: with
``group_size = 1`` (the strict seed order, the default) ``n`` counts every earlier pair; with
``group_size = G`` the pairs of a group share the weights computed from the groups before it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from treerank.atomic import atomic_savefig
from treerank.forest.config import (
    FOREST_SECTIONS,
    ForestTrainConfig,
    forest_train_config,
    parse_forest_config,
)
from treerank.forest.data import (
    PairData,
    PairDraw,
    PairGroup,
    QueryRows,
    SharedRows,
    build_group,
    draw_pair,
    pair_data,
    shared_rows,
    source_pair_data,
)
from treerank.forest.losses import boosting_weights
from treerank.forest.model import (
    Forest,
    ForestConfig,
    draw_dropout_masks,
    init_layers,
    passage_init_from_query,
    stacked_forward,
)
from treerank.forest.stages import StageInputs, stage_backward
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.storelike import StoreLike
from treerank.training.config import TrainConfig
from treerank.training.history import TrainingLog
from treerank.training.trainer import TrainOutput

__all__ = [
    "FOREST_SECTIONS",
    "ForestTrainConfig",
    "forest_train_config",
    "parse_forest_config",
    "plot_forest_curves",
    "plot_metric_vs_models",
    "train_forest",
]


def _l2(ws: list[Tensor]) -> Tensor:
    return sum((w**2).sum(dim=tuple(range(1, w.ndim))) for w in ws)  # type: ignore[return-value]


class _Side:
    """One side of a group's models (query or passage), its logits recomputed from row blocks.

    Each step begins with :meth:`begin` (in side order, so the dropout streams advance as they
    always have): a side whose ``n`` rows fit in one block computes its whole logits once with
    autograd and serves slices of a detached leaf (its gradient back-propagated by :meth:`finish`);
    a larger side draws its dropout masks for every block (kept as packed bits, ``n * width / 8``
    bytes per layer and model) and recomputes the logits of any block or gathered rows with
    those masks, autograd reaching the parameters directly. No ``(G, n, C)`` tensor is held.
    """

    def __init__(
        self,
        rows: Callable[[int, int], Tensor],
        take: Callable[[np.ndarray], Tensor],
        n: int,
        weights: list[Tensor],
        biases: list[Tensor],
    ) -> None:
        self.rows, self.take, self.n, self.weights, self.biases = rows, take, n, weights, biases
        self.full: Tensor | None = None
        self.leaf: Tensor | None = None
        self.bank: list[np.ndarray] | None = None
        self.widths = [int(weights[0].shape[1])] + [int(w.shape[1]) for w in weights[1:]]
        self.dropout = 0.0

    def begin(self, dropout: float, gens: list[torch.Generator], chunk: int) -> None:
        self.dropout, self.full, self.leaf, self.bank = dropout, None, None, None
        if self.n <= chunk:
            self.full = self.block_logits(0, self.n, dropout, gens)
            self.leaf = self.full.detach().requires_grad_(True)
            return
        if dropout > 0:
            n_g = len(gens)
            self.bank = [np.empty((n_g, self.n, (w + 7) // 8), np.uint8) for w in self.widths]
            for lo in range(0, self.n, chunk):
                hi = min(lo + chunk, self.n)
                for bank, m in zip(
                    self.bank, draw_dropout_masks(gens, hi - lo, self.widths, dropout), strict=True
                ):
                    bank[:, lo:hi] = np.packbits(m.numpy(), axis=-1)

    def _masks(self, rows: slice | np.ndarray) -> list[Tensor] | None:
        if self.bank is None:
            return None
        dev = self.weights[0].device
        return [
            torch.from_numpy(np.unpackbits(b[:, rows], axis=-1, count=w).view(np.bool_)).to(dev)
            for b, w in zip(self.bank, self.widths, strict=True)
        ]

    def logits(self, rows: slice | Tensor) -> Tensor:
        """``float32 (G, len(rows), width)`` logits of a block or of gathered rows."""
        if self.leaf is not None:
            return self.leaf[:, rows]
        if isinstance(rows, slice):
            x = self.rows(int(rows.start), int(rows.stop))
            masks = self._masks(rows)
        else:
            idx = rows.cpu().numpy()
            x, masks = self.take(idx), self._masks(idx)
        return stacked_forward(
            x, self.weights, self.biases, dropout=self.dropout if masks else 0.0, masks=masks
        )

    def block_logits(self, lo: int, hi: int, dropout: float, gens: list[torch.Generator]) -> Tensor:
        """Logits of rows ``lo .. hi - 1`` with masks drawn from ``gens`` (0: none)."""
        return stacked_forward(
            self.rows(lo, hi), self.weights, self.biases, dropout=dropout, generators=gens
        )

    def finish(self) -> None:
        if self.full is not None and self.leaf is not None and self.leaf.grad is not None:
            self.full.backward(self.leaf.grad)
        self.full, self.leaf, self.bank = None, None, None


def _blocked_step(
    sides: list[_Side],
    stage: str,
    cfg: ForestTrainConfig,
    inputs: StageInputs,
    gens: list[torch.Generator],
    target: Tensor | None = None,
) -> float:
    """One full-batch gradient in bounded memory (the GradCache idea, Gao et al. 2021, taken
    down to the loss): every side's logits are recomputed block by block (:class:`_Side`) and
    :func:`treerank.forest.stages.stage_backward` back-propagates each block's share
    of the loss into the parameters' ``.grad``. The gradient equals that of the whole batch at
    once (tested); memory is ``O(G * chunk * (d + C))`` plus ``(G, n)`` bookkeeping, never
    ``O(G * n * C)``.

    Returns:
        the loss value.
    """
    for side in sides:
        side.begin(cfg.trainer.dropout, gens, cfg.trainer.chunk_size)
    try:
        return stage_backward(stage, cfg, inputs, sides, cfg.trainer.chunk_size, target)
    finally:
        for side in sides:
            side.finish()


def _run_steps(
    params: list[Tensor], steps: int, lr: float, step_fn: Callable[[int], float]
) -> float:
    """``steps`` Adam steps; ``step_fn(step)`` fills the gradients and returns the loss."""
    if steps == 0 or not params:
        return float("nan")
    opt = torch.optim.Adam(params, lr=lr)
    last = float("nan")
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        last = step_fn(step)
        opt.step()
    return last


def _train_group(
    cfg: ForestTrainConfig, g: PairGroup, qw: list[Tensor], qb: list[Tensor]
) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], dict[str, float]]:
    """Stages 1-3 for one group; returns trained (query, passage) stacks and stage losses.

    Each pair's loss depends on its own parameters, rows, bag, weights and dropout stream only,
    and the group's loss is the sum, so every pair gets exactly the gradients (and Adam updates)
    of training it alone. Every step is one full-batch gradient computed block by block
    (:func:`_blocked_step`, ``chunk_size`` rows or examples per block). Everything runs on
    ``g.device`` (the parameters ``qw`` / ``qb`` are there); the returned stacks are on the CPU.
    """
    n_g = qw[0].shape[0]
    dev = g.device
    for t in (*qw, *qb):
        t.requires_grad_(True)
    chunk = cfg.trainer.chunk_size
    nq = g.xq.n

    def q_rows(lo: int, hi: int) -> Tensor:  # batched matmul: per-pair results as if alone
        return torch.from_numpy(g.xq.rows(lo, hi)).to(dev).unsqueeze(0).expand(n_g, -1, -1)

    def q_take(idx: np.ndarray) -> Tensor:
        return torch.from_numpy(g.xq.take(idx)).to(dev).unsqueeze(0).expand(n_g, -1, -1)

    q_side = _Side(q_rows, q_take, nq, qw, qb)

    inputs = StageInputs(
        g.qmask, g.pmask, g.wanted, g.pos_q, g.pos_p, g.pos_w, g.neg_q, g.neg_p, g.neg_w
    )

    # Stage 1 (step A): query model, uniformity (+ sharpness) on the bag.
    def q_step(_: int) -> float:
        value = _blocked_step([q_side], "query", cfg, inputs, g.gens)
        l2 = (cfg.trainer.weight_decay * _l2(qw)).sum()
        l2.backward()
        return value + float(l2.detach())

    loss1 = _run_steps([*qw, *qb], cfg.trainer.steps_query, cfg.trainer.lr, q_step) / n_g

    # Stage 2: passage model from the query model's weights; the query classes are the targets.
    with torch.no_grad():
        target = torch.cat(
            [
                q_side.block_logits(lo, min(lo + chunk, nq), 0.0, g.gens).argmax(-1)
                for lo in range(0, nq, chunk)
            ],
            1,
        )  # (G, nq)
    pw, pb = passage_init_from_query(qw, qb, cfg.trainer.nr_bias_init)
    for t in (*pw, *pb):
        t.requires_grad_(True)
    p_side = _Side(g.passage_rows, g.passage_take, g.n_passage_rows, pw, pb)

    def p_step(_: int) -> float:
        value = _blocked_step([p_side], "passage", cfg, inputs, g.gens, target=target)
        l2 = (cfg.trainer.weight_decay * _l2(pw)).sum()
        l2.backward()
        return value + float(l2.detach())

    loss2 = _run_steps([*pw, *pb], cfg.trainer.steps_passage, cfg.trainer.lr, p_step) / n_g

    # Stage 3: joint (or alternating) round on the soft collision probability.
    def j_step(_: int) -> float:
        value = _blocked_step([q_side, p_side], "joint", cfg, inputs, g.gens)
        l2 = (cfg.trainer.weight_decay * (_l2(qw) + _l2(pw))).sum()
        l2.backward()
        return value + float(l2.detach())

    if cfg.trainer.joint_mode == "joint":
        loss3 = (
            _run_steps([*qw, *qb, *pw, *pb], cfg.trainer.steps_joint, cfg.trainer.lr, j_step) / n_g
        )
    else:
        loss3 = float("nan")
        if cfg.trainer.steps_joint > 0:
            opt_q = torch.optim.Adam([*qw, *qb], lr=cfg.trainer.lr)
            opt_p = torch.optim.Adam([*pw, *pb], lr=cfg.trainer.lr)
            for step in range(cfg.trainer.steps_joint):
                opt = opt_q if step % 2 == 0 else opt_p
                opt_q.zero_grad(set_to_none=True)
                opt_p.zero_grad(set_to_none=True)
                loss3 = j_step(step) / n_g
                opt.step()
    detach = [[t.detach().cpu() for t in ts] for ts in (qw, qb, pw, pb)]
    return (
        detach[0],
        detach[1],
        detach[2],
        detach[3],
        {"loss_query": loss1, "loss_passage": loss2, "loss_joint": loss3},
    )


def _default_validate_at(n_models: int) -> list[int]:
    pts = [2**i for i in range(int(math.log2(n_models)) + 1)]
    return sorted({p for p in pts if p <= n_models} | {n_models})


def train_forest(
    store: StoreLike,
    config: Mapping[str, Any] | TrainConfig | None = None,
    *,
    train_rows: np.ndarray | None = None,
    validate: Callable[[Forest], Mapping[str, float]] | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
    device: Device = DEFAULT_DEVICE,
) -> TrainOutput:
    """Train a TreeRank forest on a store's training queries (see the module docstring).

    ``device`` (``auto | cpu | cuda[:n]``, None = CPU; resolved by
    :func:`treerank.kernels.device.resolve_device` before any work): where the group's
    parameters, row blocks, logits, gradients, boosting weights, example tables and Adam states
    live, and where the boosting bookkeeping classifies the training rows. Everything is float32
    and accumulates in float32 on every device (no autocast, no TF32 unless the caller turned
    ``torch.backends.cuda.matmul.allow_tf32`` on); random draws (init, bags, negatives, dropout
    masks) come from CPU generators and numpy and are moved to the device, so a GPU run sees the
    same draws as a CPU run and differs only by float32 rounding of its reductions (tested:
    ``tests/training/test_forest_device.py``). On the CPU the computation is the CPU path
    exactly (``device="cpu"`` equals the default, byte for byte). Hard negatives are mined on
    the device too (exact search: the same ids except where two cosines differ by < 1e-5).
    The trained forest is returned on the CPU; ``trainer.repartition`` (post-hoc) runs on the
    CPU.

    Args:
        store: an ``EmbeddingStore`` with labelled queries (selected passages); with
            ``data.sources`` the pseudo split and teacher runs must have been prepared
            (``treerank.tasks.train.ensure_training_sources``).
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
            passages. FileNotFoundError: a ``data.sources`` entry that was not prepared.
        DeviceError: an unknown ``device``, or ``cuda`` without CUDA.
    """
    from treerank.kernels.device import resolve_device

    dev = resolve_device(device)
    parsed = parse_forest_config(config)
    cfg = forest_train_config(parsed)
    t_start = time.perf_counter()
    if cfg.model.untrained:
        return _untrained_output(store, cfg, parsed.to_dict(), validate, log, t_start)
    store, data, sources_info = _training_pairs(store, cfg, train_rows, device)
    fcfg = cfg.forest_config(int(store.dim))
    run = _Training(
        cfg=cfg,
        fcfg=fcfg,
        store=store,
        data=data,
        shared=shared_rows(store, data),
        queries=QueryRows(store, data.queries),
        twin=_make_twin(store, cfg, fcfg) if cfg.trainer.init == "twin" else None,
        dev=dev,
        device=device,
    )
    misses = np.zeros(len(data.pos_q), dtype=np.int64)
    q_stacks: list[list[Tensor]] = [[] for _ in range(4)]
    records: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    validate_at = sorted(set(cfg.trainer.validate_at or _default_validate_at(cfg.model.n_models)))
    tlog = log if log is not None else TrainingLog()

    def write(rec: dict[str, Any]) -> None:
        records.append(rec)
        tlog.write(str(rec["kind"]), **{k: v for k, v in rec.items() if k != "kind"})

    bar = tqdm(total=cfg.model.n_models, desc="forest pairs", unit="pair", disable=not progress)
    n_done = 0
    threads = torch.get_num_threads()
    if cfg.trainer.num_threads:
        # Each step is tiny: one thread avoids oversubscription (6x faster on a busy 2-core box).
        torch.set_num_threads(cfg.trainer.num_threads)
    try:
        while n_done < cfg.model.n_models:
            n_g = min(cfg.trainer.group_size, cfg.model.n_models - n_done)
            stacks, rec = _train_next_group(run, n_done, n_g, misses)
            for stack, ts in zip(q_stacks, stacks, strict=True):
                stack.append(ts)  # type: ignore[arg-type]
            write(rec)
            n_done += n_g
            bar.update(n_g)
            bar.set_postfix(
                match=f"{rec['train_match_rate']:.2f}",
                nr=f"{rec['not_retrievable_fraction']:.2f}",
            )
            if validate is not None and cfg.trainer.repartition is None:
                for m in [v for v in validate_at if n_done - n_g < v <= n_done]:
                    forest_m = _assemble(fcfg, q_stacks, cfg.model.name).with_search(cfg.search())
                    curve.append(_curve_point(validate, forest_m, m))
                    write({"kind": "eval", **curve[-1]})
    finally:
        bar.close()
        torch.set_num_threads(threads)
    forest = _assemble(fcfg, q_stacks, cfg.model.name).with_search(cfg.search())
    irli: dict[str, Any] | None = None
    if cfg.trainer.repartition is not None:
        forest, irli = _repartitioned(forest, store, data, cfg)
        if validate is not None:  # the curve of the re-partitioned forest's prefixes
            for m in validate_at:
                curve.append(_curve_point(validate, forest, m))
                write({"kind": "eval", "repartitioned": True, **curve[-1]})
    summary: dict[str, Any] = {
        "config": parsed.to_dict(),
        "n_train_queries": run.queries.n,
        "n_positive_pairs": len(data.pos_q),
        "n_fixed_negative_pairs": len(data.neg_q),
        "sources": sources_info,
        **_pair_means([r for r in records if r["kind"] == "pair"], fcfg.n_classes),
        "repartition": irli,
        "seconds": time.perf_counter() - t_start,
        "curve": curve,
    }
    write({"kind": "summary", **{k: v for k, v in summary.items() if k != "config"}})
    forest.extra["training"] = summary
    return TrainOutput(model=forest, summary=summary, records=tlog.records)


@dataclasses.dataclass(frozen=True)
class _Training:
    """What every group of one forest training reads (built once by :func:`train_forest`)."""

    cfg: ForestTrainConfig
    fcfg: ForestConfig
    store: StoreLike  # the split, or with data.sources the training table's view of it
    data: PairData
    shared: SharedRows
    queries: QueryRows
    twin: Forest | None  # trainer.init "twin": its query models start each pair
    dev: torch.device  # resolved: where the group's tensors live
    device: Device  # as given: where the bookkeeping classifies


def _train_next_group(
    run: _Training, n_done: int, n_g: int, misses: np.ndarray
) -> tuple[tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]], dict[str, Any]]:
    """Train pairs ``n_done .. n_done + n_g - 1`` as one group (their draws, boosting weights
    from ``misses``, stages 1-3, then the bookkeeping over every training example).

    ``misses`` (``int64 (E+,)``, per positive example the pairs so far that missed it) is
    updated in place. Returns the group's trained (query weights, query biases, passage
    weights, passage biases) stacks and its ``"pair"`` record.
    """
    cfg, fcfg, shared = run.cfg, run.fcfg, run.shared
    t0 = time.perf_counter()
    draws = [
        draw_pair(cfg, m, run.queries.n, len(shared.ids), int(run.store.n_passages))
        for m in range(n_done, n_done + n_g)
    ]
    boost = (
        boosting_weights(misses, n_done) if cfg.trainer.boosting else np.ones(len(misses))
    ).astype(np.float32)
    group = build_group(cfg, run.store, run.data, shared, run.queries, draws, boost, device=run.dev)
    qw, qb = _query_init(cfg, fcfg, draws, run.twin, n_done)
    qw, qb = [w.to(run.dev) for w in qw], [b.to(run.dev) for b in qb]
    qw, qb, pw, pb, losses = _train_group(cfg, group, qw, qb)
    part = Forest(
        ForestConfig(n_g, fcfg.n_classes, fcfg.dim, fcfg.hidden, fcfg.nr_threshold),
        qw,
        qb,
        pw,
        pb,
    )
    miss, stats = _bookkeeping(
        part, run.data, shared, run.queries, cfg.trainer.chunk_size, run.device
    )
    misses += miss.sum(axis=1)
    rec = {
        "kind": "pair",
        "models": [n_done, n_done + n_g],
        **losses,
        **stats,
        "mean_boost_weight": float(boost.mean()),
        "seconds": time.perf_counter() - t0,
    }
    return (qw, qb, pw, pb), rec


def _training_pairs(
    store: StoreLike, cfg: ForestTrainConfig, train_rows: np.ndarray | None, device: Device
) -> tuple[StoreLike, PairData, dict[str, Any] | None]:
    """The forest's (query, passage) examples: the split's labels (``pair_data``), or with
    ``data.sources`` the shared training table (``source_pair_data``, whose store view holds
    the pseudo queries too), and that table's ``info`` (None for labels)."""
    if cfg.data.sources is None:
        return store, pair_data(store, cfg.data.hard_negatives, train_rows, device), None
    from treerank.training.data import build_training_table, parse_sources

    specs = parse_sources(cfg.data.sources)
    table = build_training_table(store, specs, train_rows)
    view, data = source_pair_data(store, table, specs, cfg.data.hard_negatives, device)
    return view, data, table.info  # type: ignore[return-value]


def _bookkeeping(
    part: Forest,
    data: PairData,
    shared: SharedRows,
    queries: QueryRows,
    chunk: int,
    device: Device,
) -> tuple[np.ndarray, dict[str, float]]:
    """Boosting bookkeeping of a group of ``G`` new pairs over every training example, not only
    the bag: ``bool (E+, G)``, True where a pair did not put the selected passage in its query's
    class (not retrievable counts as a miss), and the group's record fields
    (``train_match_rate``, ``query_class_entropy``, ``max_entropy``,
    ``not_retrievable_fraction``)."""
    n_classes = part.config.n_classes
    qc = _classes(part.query_classes, queries.rows, queries.n, chunk, device)
    pc = _classes(part.passage_classes, shared.rows, len(shared.ids), chunk, device)
    miss = qc[data.pos_q] != pc[shared.pos]  # (E+, G)
    return miss, {
        "train_match_rate": float(1.0 - miss.mean()),
        "query_class_entropy": float(_entropy_rows(qc, n_classes).mean()),
        "max_entropy": math.log(n_classes),
        "not_retrievable_fraction": float((pc < 0).mean()),
    }


def _pair_means(pair_records: list[dict[str, Any]], n_classes: int) -> dict[str, float]:
    """The summary's means over the ``"pair"`` records (one per group), with the entropy's
    maximum ``log C`` beside the mean query-class entropy."""

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in pair_records]))

    return {
        "final_train_match_rate_mean": mean("train_match_rate"),
        "query_class_entropy_mean": mean("query_class_entropy"),
        "max_entropy": math.log(n_classes),
        "not_retrievable_fraction_train": mean("not_retrievable_fraction"),
    }


def _query_init(
    cfg: ForestTrainConfig,
    fcfg: ForestConfig,
    draws: list[PairDraw],
    twin: Forest | None,
    start: int,
) -> tuple[list[Tensor], list[Tensor]]:
    """The query models' initial weights and biases of one group (on the CPU): each pair's
    :func:`init_layers` draw stacked, or the twin's models ``start:start + len(draws)``."""
    if twin is not None:  # start from the twin's query models instead
        stop = start + len(draws)
        return [w[start:stop].clone() for w in twin.query_weights], [
            b[start:stop].clone() for b in twin.query_biases
        ]
    inits = [
        init_layers(fcfg.layer_shapes("query"), 1, d.init, cfg.trainer.init_scale) for d in draws
    ]
    qw = [torch.cat([w[i] for w, _ in inits]) for i in range(len(inits[0][0]))]
    qb = [torch.cat([b[i] for _, b in inits]) for i in range(len(inits[0][1]))]
    return qw, qb


def _classes(
    classify: Callable[..., tuple[np.ndarray, Any]],
    rows: Callable[[int, int], Any],
    n: int,
    chunk: int,
    device: Device,
) -> np.ndarray:
    """``classify(rows(lo, hi), device=device)[0]`` over ``n`` rows in chunks, concatenated:
    each row's class per model of a group (``(n, G)``)."""
    return np.concatenate(
        [classify(rows(lo, lo + chunk), device=device)[0] for lo in range(0, n, chunk)]
    )


def _curve_point(
    validate: Callable[[Forest], Mapping[str, float]], forest: Forest, m: int
) -> dict[str, Any]:
    """One point of the metric-vs-M curve: ``validate`` on ``forest``'s first ``m`` models."""
    return {"n_models": m, **{k: float(v) for k, v in validate(forest.subset(m)).items()}}


def _repartitioned(
    forest: Forest, store: StoreLike, data: Any, cfg: ForestTrainConfig
) -> tuple[Forest, dict[str, Any]]:
    """``trainer.repartition``: :func:`treerank.forest.repartition.repartition` of the
    trained forest on the training pairs (the trainer's queries and positives, every passage of
    the training store), capacity and ``K`` from the model section, the seed's boosting weights
    when ``boosting``, ``group_size`` models at once. The returned forest indexes a passage by
    its own vector through the new models (the training collection's explicit table is not
    kept: an evaluated split's passages are indexed by the models). Holds the training queries
    and passages and ``(G, n, C)`` scores whole (post-hoc function; not block-wise)."""
    from treerank.forest.repartition import repartition

    rp = cfg.trainer.repartition
    assert rp is not None
    t0 = time.perf_counter()
    rep = repartition(
        forest,
        np.asarray(store.queries[data.queries], dtype=np.float32),
        data.pos_q,
        data.pos_p,
        np.asarray(store.passages, dtype=np.float32),
        rounds=rp.rounds,
        steps=rp.steps,
        lr=rp.lr,
        assign=cfg.model.assign,
        capacity_epsilon=cfg.model.capacity_epsilon,
        boosting=cfg.trainer.boosting,
        group_size=cfg.trainer.group_size,
    )
    out = rep.forest.with_search(cfg.search())
    out.name = cfg.model.name
    info = {
        **dataclasses.asdict(rp),
        "objective_initial": rep.objective_initial,
        "objective": rep.objective,
        "seconds": time.perf_counter() - t0,
    }
    return out, info


KMEANS_TWIN_SAMPLE = 1 << 16
"""Passages a k-means twin clusters at most (a uniform sample, ascending rows)."""


def _make_twin(store: StoreLike, cfg: ForestTrainConfig, fcfg: ForestConfig) -> Forest:
    """The untrained twin of kind ``cfg.model.twin`` (seed ``cfg.seed``); a k-means twin clusters a
    sample of at most 65,536 of the store's passages (ascending rows, seed ``cfg.seed``)."""
    vectors = None
    if cfg.model.twin == "kmeans":
        n = int(store.n_passages)
        rng = np.random.default_rng(cfg.seed)
        rows = np.sort(rng.choice(n, size=min(n, KMEANS_TWIN_SAMPLE), replace=False))
        vectors = np.asarray(store.passages[rows], dtype=np.float32)
    return Forest.twin(cfg.model.twin, fcfg, cfg.seed, vectors=vectors, name=cfg.model.name)


def _untrained_output(
    store: StoreLike,
    cfg: ForestTrainConfig,
    config: dict[str, Any],
    validate: Callable[[Forest], Mapping[str, float]] | None,
    log: TrainingLog | None,
    t_start: float,
) -> TrainOutput:
    """``untrained: true``: the twin itself, with the same metric-vs-M curve as a trained
    forest (validated on its first ``m`` models)."""
    fcfg = cfg.forest_config(int(store.dim))
    forest = _make_twin(store, cfg, fcfg).with_search(cfg.search())
    tlog = log if log is not None else TrainingLog()
    curve: list[dict[str, Any]] = []
    if validate is not None:
        for m in sorted(set(cfg.trainer.validate_at or _default_validate_at(cfg.model.n_models))):
            point = {"n_models": m, **{k: float(v) for k, v in validate(forest.subset(m)).items()}}
            curve.append(point)
            tlog.write("eval", **point)
    summary: dict[str, Any] = {
        "config": config,
        "untrained": True,
        "twin": cfg.model.twin,
        "max_entropy": math.log(fcfg.n_classes),
        "seconds": time.perf_counter() - t_start,
        "curve": curve,
    }
    tlog.write("summary", **{k: v for k, v in summary.items() if k != "config"})
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


def plot_forest_curves(
    records: list[dict[str, Any]], summary: dict[str, Any], path: str | Path, title: str = ""
) -> Path | None:
    """The forest's curves for its model directory: held-out metrics against M (or None when
    it was trained without validation)."""
    curve = summary.get("curve") or []
    return plot_metric_vs_models(curve, path, title=title) if curve else None
