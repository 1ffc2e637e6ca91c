"""The generic contrastive trainer: any two-tower torch module, InfoNCE, early stopping.

What a trainable model provides (:class:`ContrastiveModule`; the thin heads and DRT do):

* ``encode_queries_t(x: Tensor (B, d)) -> Tensor (B, ...)``: query representations;
* ``encode_passages_t(x: Tensor (M, d)) -> Tensor (M, ...)``: passage representations;
* ``score_matrix(q_repr, p_repr) -> Tensor (B, M)``: the **logits** of InfoNCE, i.e. the ranking
  score already divided by the temperature (a learned temperature therefore lives in the model);
* optionally ``extra_loss(q_repr, p_repr) -> Tensor`` (0-d), added to the InfoNCE loss (DRT's
  decorrelation term, any regulariser);
* optionally ``log_values() -> dict[str, float]``, extra numbers for the training log (the
  current temperature, ...);
* optionally ``gather_batch_state(gather)``, for data-parallel training: called after the towers
  so that an ``extra_loss`` reading per-batch state sees the whole batch (DRT's slots).

Under ``torchrun`` (``W >= 2`` ranks) :func:`fit` trains data-parallel with DDP and cross-process
in-batch negatives: the sampler's ``batch_size`` is per rank, each step is the one-process step
on the global ``W * batch_size`` batch (``treerank.distributed.training``).

The training loop (:func:`fit`) draws batches from a
:class:`~treerank.training.sampler.ContrastiveSampler`, gathers the stored vectors of each
batch, computes ``info_nce(score_matrix(...), positive, mask_out)`` (plus the passage -> query
term when ``symmetric_weight > 0``), and steps AdamW under a warmup + cosine schedule. Every
``eval_every`` steps (and at step 0, the untrained model) it calls ``validate(model)`` -- a
callback, so this layer never imports search or evaluation -- keeps the best state by
``early_stopping_metric`` and stops after ``patience`` evaluations without improvement. The best
state is restored at the end.

A family's trainer (``trainer`` of its entry in ``treerank.families``) is a function
``train_xxx(store, config: TrainConfig, *, train_rows=None, validate=None, log=None,
progress=True) -> TrainOutput`` (:class:`TrainFunction`): ``train_rows`` are the query ids it may
train on (the pipeline holds the others out for ``validate``); ``log`` collects its records. It
returns the model and its log and writes no file: ``treerank.training.output.save_trained_model``
writes every trained model's directory. ``treerank.training.heads.train_contrastive`` does
"store + config + module -> trained module" for any :class:`ContrastiveModule`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from treerank.config import build
from treerank.distributed.context import broadcast_from_main
from treerank.distributed.training import ShardedTraining, sharded_training
from treerank.kernels import rows as _rows
from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device
from treerank.kernels.rows import RowSource
from treerank.storelike import StoreLike
from treerank.training.history import TrainingLog
from treerank.training.losses import (
    full_corpus_softmax,
    info_nce,
    info_nce_symmetric,
    listwise_kl,
    margin_mse,
)
from treerank.training.monitor import batch_stats
from treerank.training.sampler import Batch, ContrastiveSampler
from treerank.training.schedule import warmup_cosine_scheduler

__all__ = [
    "ContrastiveModule",
    "FitResult",
    "TrainFunction",
    "TrainOutput",
    "TrainerConfig",
    "Validate",
    "compute_loss",
    "fit",
    "loss_from_representations",
]

Validate = Callable[[Any], Mapping[str, float]]
"""``validate(model) -> {"mrr@10": ..., "ndcg@10": ...}`` on held-out queries (eval mode)."""


@runtime_checkable
class ContrastiveModule(Protocol):
    """What :func:`fit` needs from a ``torch.nn.Module`` (see the module docstring)."""

    def encode_queries_t(self, x: Tensor) -> Tensor: ...

    def encode_passages_t(self, x: Tensor) -> Tensor: ...

    def score_matrix(self, q_repr: Tensor, p_repr: Tensor) -> Tensor: ...


@dataclass
class TrainerConfig:
    """Hyperparameters of :func:`fit` (every one has a config-file key of the same name).

    Attributes:
        epochs: maximum number of passes over the training queries.
        max_steps: stop after this many optimiser steps (None: ``epochs * batches_per_epoch``).
        lr: peak AdamW learning rate.
        weight_decay: AdamW decoupled weight decay on parameters with ``ndim >= 2`` (biases and
            temperatures are not decayed).
        betas: AdamW betas.
        warmup_ratio: fraction of the total steps spent in linear warmup.
        min_lr_ratio: the cosine decays to ``lr * min_lr_ratio``.
        grad_clip: max global gradient norm (None: no clipping).
        symmetric_weight: weight of the passage -> query InfoNCE term (0: query -> passage only).
        log_every: steps between training-log records.
        eval_every: steps between held-out evaluations (None: once per epoch).
        early_stopping_metric: key of ``validate``'s result to maximise.
        patience: evaluations without improvement before stopping (None: never stop early).
        min_delta: an improvement must exceed this.
        seed: seeds torch (dropout, init done inside ``fit``) for a deterministic run.
        threads: ``torch.set_num_threads`` for the run (None: leave torch's setting).
        negatives: ``"batch"`` (in-batch + hard negatives) or ``"all"`` (the exact softmax
            over every passage of the split, chunked; with frozen vectors a head can afford it).
        chunk_size: passages per chunk for ``negatives: all`` (memory ~ chunk x (d + B)).
        refresh_every: steps between model-refreshed hard-negative mining (ANCE; needs a
            ``refresh`` callback in :func:`fit`); None: negatives are mined once.
    """

    epochs: int = 20
    max_steps: int | None = None
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    symmetric_weight: float = 0.0
    log_every: int = 10
    eval_every: int | None = None
    early_stopping_metric: str = "ndcg@10"
    patience: int | None = 5
    min_delta: float = 0.0
    seed: int = 0
    threads: int | None = None
    negatives: str = "batch"
    chunk_size: int = 8192
    refresh_every: int | None = None

    def __post_init__(self) -> None:
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        if self.epochs < 1 or self.lr <= 0 or self.log_every < 1:
            raise ValueError("epochs >= 1, lr > 0 and log_every >= 1 are required")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.negatives not in ("batch", "all") or self.chunk_size < 1:
            raise ValueError(
                f"negatives must be 'batch' or 'all' (got {self.negatives!r}) and chunk_size >= 1"
            )

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], *, where: str = "config.trainer") -> TrainerConfig:
        """Build from a mapping, strictly (see :func:`treerank.config.build`).

        Raises:
            ConfigError: an unknown key (the message lists the allowed ones) or a bad value.
        """
        return build(cls, cfg, where)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d


@dataclass
class FitResult:
    """What :func:`fit` did.

    Attributes:
        steps: optimiser steps taken.
        epochs: epochs started.
        best_step: step of the best held-out evaluation (0 = the untrained model), or the last
            step when there was no validation.
        best_metrics: held-out metrics at ``best_step`` (empty without validation).
        stopped_early: patience ran out before the step budget.
        seconds: wall time of the loop.
        records: every log record (also in the JSONL log).
    """

    steps: int
    epochs: int
    best_step: int
    best_metrics: dict[str, float]
    stopped_early: bool
    seconds: float
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TrainOutput:
    """What a family's trainer returns: the trained model, a JSON summary and the log records.

    Attributes:
        model: the trained model (a ``CheckpointMixin``).
        summary: JSON-serialisable summary (stored in the checkpoint's ``extra["training"]``).
        records: the training log, one dict per record with a ``kind`` key (written as JSONL by
            ``treerank.training.output.save_trained_model``).
    """

    model: Any
    summary: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)


class TrainFunction(Protocol):
    """``train_xxx(store, config, *, train_rows, validate, log, progress, device) ->
    TrainOutput``: every family's trainer takes the parsed ``device`` (always passed)."""

    def __call__(
        self,
        store: StoreLike,
        config: Any,
        *,
        train_rows: np.ndarray | None = None,
        validate: Validate | None = None,
        log: TrainingLog | None = None,
        progress: bool = True,
        device: Device = DEFAULT_DEVICE,
    ) -> TrainOutput: ...


def _vector_source(x: Any, in_memory_bytes: int | None = None) -> RowSource:
    """Stored vectors as a :class:`~treerank.kernels.rows.RowSource`: copied into memory when
    they fit comfortably (< ``in_memory_bytes``, default ``rows.IN_MEMORY_BYTES``), else
    gathered from the memory map by rows."""
    limit = _rows.IN_MEMORY_BYTES if in_memory_bytes is None else in_memory_bytes
    return RowSource(x, in_memory_bytes=limit)


def _gather(x: Any, rows: np.ndarray, device: torch.device) -> Tensor:
    vals = x.gather(rows) if isinstance(x, RowSource) else x[rows]
    t = torch.from_numpy(np.ascontiguousarray(vals, dtype=np.float32))
    return t if device.type == "cpu" else t.to(device)


def compute_loss(
    model: Any,
    batch: Batch,
    q: Tensor,
    p: Tensor,
    symmetric_weight: float = 0.0,
    all_passages: Tensor | None = None,
    chunk_size: int = 8192,
) -> tuple[Tensor, dict[str, Any]]:
    """The training loss of one batch and what :func:`fit` logs about it.

    Args:
        model: a :class:`ContrastiveModule`.
        batch: the batch (its masks become bool tensors).
        q: ``float32 (B, d)`` stored query vectors of ``batch.query_rows``.
        p: ``float32 (M, d)`` stored passage vectors of ``batch.passage_rows``.
        symmetric_weight: weight of the passage -> query term.
        all_passages: ``float32 (N, d)`` every stored passage of the split: the softmax runs
            over all of them (``negatives: all``, :func:`full_corpus_softmax`) instead of the
            batch's columns; None: in-batch (+ hard) negatives.
        chunk_size: passages per chunk of the full-corpus softmax.

    With ``batch.target`` (soft labels) the in-batch loss is listwise KL
    (:func:`listwise_kl`), else InfoNCE on the designated positives.

    Returns:
        ``(loss, parts)``: the 0-d loss and ``parts`` with the logits, masks, query
        representations and the value of each loss term.
    """
    q_repr = model.encode_queries_t(q)  # (B, ...)
    p_repr = model.encode_passages_t(p)  # (M, ...)
    return loss_from_representations(
        model, batch, q_repr, p_repr, symmetric_weight, all_passages, chunk_size
    )


def loss_from_representations(
    model: Any,
    batch: Batch,
    q_repr: Tensor,
    p_repr: Tensor,
    symmetric_weight: float = 0.0,
    all_passages: Tensor | None = None,
    chunk_size: int = 8192,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`compute_loss` after the towers: ``q_repr (B, ...)``, ``p_repr (M, ...)`` in, loss
    out (the step that data-parallel training runs on gathered representations; with
    ``all_passages`` every rank scores the whole corpus: that work is not split, and this
    combination is not covered by the distributed tests)."""
    dev = q_repr.device
    positive = torch.from_numpy(batch.positive).to(dev)
    mask_out = torch.from_numpy(batch.mask_out).to(dev)
    logits = model.score_matrix(q_repr, p_repr)  # (B, M)
    if batch.teacher_scores is not None and all_passages is not None:
        raise ValueError(
            "a margin-mse teacher source trains on in-batch columns: use negatives: batch"
        )
    if batch.teacher_scores is not None:
        # margin-mse rows regress onto the teacher's margins; the other rows of the batch
        # keep their own loss (listwise KL on soft targets, else InfoNCE)
        teacher = torch.from_numpy(batch.teacher_scores).to(dev)
        graded = torch.isfinite(teacher).any(dim=1)
        own = (
            listwise_kl(logits, torch.from_numpy(batch.target).to(dev), mask_out, reduction="none")
            if batch.target is not None
            else info_nce(logits, positive, mask_out, reduction="none")
        )
        per_row = torch.where(graded, margin_mse(logits, teacher, positive, "none"), own)
        loss = per_row.mean()
    elif all_passages is not None:
        if batch.target_ids is None or batch.target_weights is None:
            raise ValueError("negatives: all needs batches with target_ids / target_weights")
        excl = batch.exclude_ids
        loss = full_corpus_softmax(
            q_repr,
            all_passages,
            model.encode_passages_t,
            model.score_matrix,
            torch.from_numpy(batch.target_ids).to(dev),
            torch.from_numpy(batch.target_weights).to(dev),
            None if excl is None else torch.from_numpy(excl).to(dev),
            chunk_size=chunk_size,
        )
    elif batch.target is not None:
        loss = listwise_kl(logits, torch.from_numpy(batch.target).to(dev), mask_out)
    else:
        loss = info_nce(logits, positive, mask_out)
    parts: dict[str, Any] = {"q2p_loss": float(loss.detach())}
    if symmetric_weight > 0:
        sym = info_nce_symmetric(logits, positive, mask_out)
        parts["p2q_loss"] = float(sym.detach())
        loss = loss + symmetric_weight * sym
    extra = getattr(model, "extra_loss", None)
    if callable(extra):
        ex = extra(q_repr, p_repr)
        parts["extra_loss"] = float(ex.detach())
        loss = loss + ex
    parts.update(logits=logits, positive=positive, mask_out=mask_out, q_repr=q_repr)
    return loss, parts


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite: the model diverged. Raised by :func:`fit` at
    the first such step, before the update is applied; nothing is returned or saved."""


def check_loss(loss: Tensor, step: int, epoch: int, lr: float, cfg: TrainerConfig) -> None:
    """Raise :class:`NonFiniteLossError` when ``loss`` is NaN or +-inf.

    Args:
        loss: the 0-d loss of the batch about to be applied.
        step: the 1-based step it belongs to; epoch: its 0-based epoch; lr: the step's learning
            rate (after warm-up); cfg: the trainer settings the hint quotes.
    """
    value = float(loss.detach())
    if math.isfinite(value):
        return
    raise NonFiniteLossError(
        f"training loss is {value} at step {step} (epoch {epoch}, learning rate {lr:.3g}): "
        f"the model diverged; lower trainer.lr (now {cfg.lr:g}), raise trainer.warmup_ratio "
        f"(now {cfg.warmup_ratio:g}) or set trainer.grad_clip (now {cfg.grad_clip}); "
        "nothing was saved"
    )


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


@contextlib.contextmanager
def _on_cpu_eval(model: torch.nn.Module, dev: torch.device) -> Iterator[None]:
    """``model`` in eval mode on the CPU without gradients (what ``validate`` and ``refresh``
    see), back on ``dev`` in train mode afterwards."""
    model.eval()
    model.to("cpu")
    with torch.no_grad():
        yield
    model.to(dev)
    model.train()


@dataclass
class _Best:
    """The best held-out evaluation so far (early stopping's state)."""

    value: float = -math.inf
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor] | None = None
    bad_evals: int = 0

    def update(
        self, value: float, step: int, metrics: dict[str, float], model: Any, min_delta: float
    ) -> bool:
        """Record an evaluation; True when it beat the best by more than ``min_delta`` (the
        model's state is then kept)."""
        improved = value > self.value + min_delta
        if improved:
            self.value, self.step, self.metrics = value, step, metrics
            self.state = copy.deepcopy(model.state_dict())
            self.bad_evals = 0
        else:
            self.bad_evals += 1
        return improved


def _batch_loss(
    model: Any,
    batch: Batch,
    vectors: tuple[Any, Any],
    all_passages: Tensor | None,
    shard: ShardedTraining | None,
    cfg: TrainerConfig,
    dev: torch.device,
) -> tuple[Tensor, dict[str, Any]]:
    """One batch's loss and parts (:func:`compute_loss`): the stored ``(queries, passages)``
    vectors gathered by the batch's rows onto ``dev``, or under torchrun the data-parallel
    step of ``shard`` on gathered representations."""
    queries, passages = vectors
    if shard is not None:
        return shard.loss(
            batch,
            queries,  # indexed by rows only
            passages,
            functools.partial(
                loss_from_representations, all_passages=all_passages, chunk_size=cfg.chunk_size
            ),
            cfg.symmetric_weight,
        )
    q = _gather(queries, batch.query_rows, dev)
    p = _gather(passages, batch.passage_rows, dev)
    return compute_loss(model, batch, q, p, cfg.symmetric_weight, all_passages, cfg.chunk_size)


def _log_step(
    log: TrainingLog,
    model: Any,
    step: int,
    epoch: int,
    loss: Tensor,
    lr: float,
    grad_norm: float | None,
    parts: dict[str, Any],
) -> dict[str, Any]:
    """Write the ``train`` record of one step (loss, lr, loss terms, batch statistics and the
    model's own ``log_values()``); returns it."""
    stats = batch_stats(
        parts["logits"].detach(), parts["positive"], parts["mask_out"], parts["q_repr"]
    )
    extra_vals = getattr(model, "log_values", None)
    return log.write(
        "train",
        step=step,
        epoch=epoch,
        loss=float(loss.detach()),
        lr=lr,
        grad_norm=grad_norm,
        **{k: v for k, v in parts.items() if k.endswith(("_loss", "_bytes"))},
        **stats,
        **(extra_vals() if callable(extra_vals) else {}),
    )


def fit(
    model: torch.nn.Module,
    sampler: ContrastiveSampler | Any,
    query_vectors: np.ndarray,
    passage_vectors: np.ndarray,
    config: TrainerConfig | None = None,
    *,
    validate: Validate | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
    refresh: Callable[[Any, int], Mapping[str, Any]] | None = None,
    device: Device = DEFAULT_DEVICE,
    in_memory_bytes: int | None = None,
) -> FitResult:
    """Train ``model`` with InfoNCE on the sampler's batches; restore the best held-out state.

    Args:
        model: a ``torch.nn.Module`` implementing :class:`ContrastiveModule`.
        sampler: batches of query / passage ids and masks (store rows).
        query_vectors: ``float32 (nq, d)`` stored query vectors (array or memmap).
        passage_vectors: ``float32 (np, d)`` stored passage vectors.
        config: hyperparameters (defaults: :class:`TrainerConfig`).
        validate: held-out evaluation callback (None: train for the full budget, keep the last
            state).
        log: where to write records (None: in memory only).
        progress: show a tqdm progress bar.
        refresh: ``refresh(model, step)`` called (in eval mode, no grad) every
            ``config.refresh_every`` steps to re-mine hard negatives with the current model
            (``treerank.training.refresh.NegativeRefresher``); what it returns is logged.
        device: where the towers, the batch and the loss live (``auto`` | ``cpu`` |
            ``cuda[:n]`` | None = CPU; :func:`treerank.kernels.device.resolve_device`). Vectors
            are gathered on the host and moved per batch; the loss is float32 everywhere;
            ``validate`` and ``refresh`` see the model on the CPU, and it is returned there.
        in_memory_bytes: vector arrays below this size (None: ``treerank.kernels.rows.
            IN_MEMORY_BYTES``, 2 GiB) are copied into memory; larger ones
            are gathered from the memory map by rows (:class:`~treerank.kernels.rows.RowSource`:
            peak RSS follows the batch, not the split). The values are the same either way.

    Returns:
        :class:`FitResult`.

    Raises:
        TypeError: ``model`` lacks the :class:`ContrastiveModule` methods.
        KeyError: ``validate`` does not return ``config.early_stopping_metric``.
        NonFiniteLossError: the loss is NaN or inf at some step (the first such step, its
            loss and a hint are named; the update is not applied and nothing is returned).
    """
    cfg = config or TrainerConfig()
    if not isinstance(model, ContrastiveModule):
        raise TypeError(
            f"{type(model).__name__} is not trainable: it needs encode_queries_t, "
            "encode_passages_t and score_matrix"
        )
    log = log or TrainingLog()
    dev = resolve_device(device)
    old_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    # under torchrun: DDP + cross-process in-batch negatives (treerank.distributed.training)
    model.to(dev)  # before DDP wraps it
    shard = sharded_training(model, cfg.seed)
    if shard is not None:
        sampler = shard.global_sampler(sampler)
        progress = progress and shard.ctx.is_main
    queries = _vector_source(query_vectors, in_memory_bytes)
    passages = _vector_source(passage_vectors, in_memory_bytes)
    all_passages = (  # the exact softmax holds the whole corpus (not block-wise)
        torch.from_numpy(np.array(passages.array, dtype=np.float32)).to(dev)  # a writable copy
        if cfg.negatives == "all"
        else None
    )

    per_epoch = len(sampler)
    total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * per_epoch
    total = max(1, min(total, cfg.epochs * per_epoch))
    eval_every = cfg.eval_every or per_epoch
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    sched = warmup_cosine_scheduler(opt, total, int(cfg.warmup_ratio * total), cfg.min_lr_ratio)

    best = _Best()
    stopped = False
    t0 = time.perf_counter()

    def evaluate(step: int, epoch: int) -> bool:
        """Run validation; returns True when patience has run out."""
        if validate is None:
            return False
        with _on_cpu_eval(model, dev):  # validate scores numpy vectors through the CPU towers
            metrics = broadcast_from_main(lambda: {k: float(v) for k, v in validate(model).items()})
        if cfg.early_stopping_metric not in metrics:
            raise KeyError(
                f"validate() returned {sorted(metrics)}, not the early-stopping metric "
                f"{cfg.early_stopping_metric!r}"
            )
        value = metrics[cfg.early_stopping_metric]
        improved = best.update(value, step, metrics, model, cfg.min_delta)
        log.write("eval", step=step, epoch=epoch, best=improved, **metrics)
        if bar is not None:
            bar.set_postfix_str(f"{cfg.early_stopping_metric}={value:.4f} best={best.value:.4f}")
        return cfg.patience is not None and best.bad_evals >= cfg.patience

    bar = tqdm(total=total, desc="train", unit="step", disable=not progress, leave=False)
    step, epoch = 0, 0
    try:
        model.train()
        evaluate(0, 0)
        while step < total and not stopped:
            for batch in sampler.epoch(epoch):
                if step >= total:
                    break
                loss, parts = _batch_loss(
                    model, batch, (queries, passages), all_passages, shard, cfg, dev
                )
                check_loss(loss, step + 1, epoch, float(sched.get_last_lr()[0]), cfg)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = None
                if cfg.grad_clip is not None:
                    grad_norm = float(
                        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                    )
                opt.step()
                sched.step()
                step += 1
                bar.update(1)
                if step % cfg.log_every == 0 or step == 1:
                    lr = float(sched.get_last_lr()[0])
                    rec = _log_step(log, model, step, epoch, loss, lr, grad_norm, parts)
                    if validate is None and isinstance(rec.get("loss"), float):
                        bar.set_postfix_str(f"loss={rec['loss']:.4f}")
                if refresh is not None and cfg.refresh_every and step % cfg.refresh_every == 0:
                    with _on_cpu_eval(model, dev):  # later batches come from the new pool
                        info = dict(refresh(model, step))
                    log.write("refresh", **info)
                if step % eval_every == 0 and evaluate(step, epoch):
                    stopped = step < total
                    break
            epoch += 1
        if validate is not None and step % eval_every != 0:
            evaluate(step, epoch - 1)
    finally:
        bar.close()
        if cfg.threads:
            torch.set_num_threads(old_threads)
    if best.state is not None:
        model.load_state_dict(best.state)
    else:
        best.step = step
    model.to("cpu")
    model.eval()
    seconds = time.perf_counter() - t0
    log.write(
        "summary",
        steps=step,
        epochs=epoch,
        best_step=best.step,
        stopped_early=stopped,
        seconds=seconds,
        **{f"best_{k}": v for k, v in best.metrics.items()},
    )
    return FitResult(step, epoch, best.step, best.metrics, stopped, seconds, log.records)
