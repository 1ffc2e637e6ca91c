"""Data-parallel contrastive training: DDP for the parameters, cross-process in-batch negatives.

:func:`treerank.training.trainer.fit` calls :func:`sharded_training` at its start; under
``torchrun`` (``W >= 2`` ranks) it returns a :class:`ShardedTraining` that

* draws the **global** batch: the sampler's ``batch_size`` is the per-rank ``B``; every rank
  builds the same global batch of ``W * B`` queries from the same seed (the batch a one-process
  run with ``batch_size = W * B`` draws), so masks and positives need no communication;
* gives rank ``r`` the contiguous shards ``Q_r`` (queries ``[r B, (r + 1) B)``) and ``P_r`` (an
  equal contiguous share of the ``M`` de-duplicated passage columns) to run through the towers,
  inside a ``DistributedDataParallel`` wrapper (gradient averaging, parameter and buffer
  broadcast from rank 0);
* gathers the representations with :func:`~treerank.distributed.gather.gather_rows`, so each
  query meets every rank's passages, and computes the whole batch's loss with the same
  :func:`~treerank.training.trainer.loss_from_representations` the one-process trainer uses.

The gradient that the optimiser sees equals the one-process gradient of the ``W * B`` batch
(proof in :mod:`treerank.distributed.gather`); a 2-process run with ``B`` and a 1-process run
with ``2 B`` agree in loss and gradients to float rounding (``tests/distributed``). Two
exceptions: dropout masks (MLP dropout, DRT slot dropout) are drawn per rank from
``seed + rank``, so with dropout on, runs agree in distribution, not bit for bit; and the
training log's diagnostics (``batch_stats``) are rank 0's view of the whole batch.

A model whose extra loss reads per-batch state from its towers (DRT's decorrelation term reads
the un-dropped slots) implements ``gather_batch_state(gather)``; it is called after the
towers with ``gather(tensor, side)`` (``side`` = ``"query"`` or ``"passage"``), which returns
the tensor of the whole batch with the local gradient path kept.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from treerank.distributed.context import DistContext, current, shard_bounds
from treerank.distributed.gather import gather_bytes, gather_rows

__all__ = ["ShardedTraining", "sharded_training"]


class _Towers(nn.Module):
    """``forward(q, p) = (encode_queries_t(q), encode_passages_t(p))``: what DDP wraps."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, q: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode_queries_t(q), self.model.encode_passages_t(p)  # type: ignore[operator]


@dataclass
class ShardedTraining:
    """One rank's share of a data-parallel :func:`~treerank.training.trainer.fit` run.

    Attributes:
        ctx: the process group.
        model: the trained module (shared with the caller).
        ddp: its towers inside ``DistributedDataParallel``.
        comm_bytes: bytes this rank received in gathers so far (forward only).
    """

    ctx: DistContext
    model: nn.Module
    ddp: DistributedDataParallel
    comm_bytes: int = 0

    def global_sampler(self, sampler: Any) -> Any:
        """A shallow copy of ``sampler`` drawing global batches of ``W * batch_size`` queries."""
        out = copy.copy(sampler)
        out.batch_size = int(sampler.batch_size) * self.ctx.world_size
        return out

    def counts(self, n: int) -> list[int]:
        """Rows of each rank's contiguous share of ``n``."""
        w = self.ctx.world_size
        return [hi - lo for lo, hi in (shard_bounds(n, w, r) for r in range(w))]

    def loss(
        self,
        batch: Any,
        queries: np.ndarray,
        passages: np.ndarray,
        loss_fn: Callable[..., tuple[Tensor, dict[str, Any]]],
        symmetric_weight: float = 0.0,
    ) -> tuple[Tensor, dict[str, Any]]:
        """The global batch's loss on this rank (see the module docstring).

        Args:
            batch: the global :class:`~treerank.training.sampler.Batch` (``G`` queries, ``M``
                columns), identical on every rank.
            queries, passages: ``float32`` stored vectors (arrays or memmaps).
            loss_fn: ``loss_from_representations(model, batch, q_repr, p_repr, symmetric_weight)``.
            symmetric_weight: weight of the passage -> query term.

        Returns:
            ``(loss, parts)`` as the one-process ``compute_loss``; ``parts["comm_bytes"]`` is
            what this step's gathers received.
        """
        ctx = self.ctx
        g, m = batch.size
        qc, pc = self.counts(g), self.counts(m)
        qlo, plo = sum(qc[: ctx.rank]), sum(pc[: ctx.rank])
        q_rows = batch.query_rows[qlo : qlo + qc[ctx.rank]]
        p_rows = batch.passage_rows[plo : plo + pc[ctx.rank]]
        q = _vectors(queries, q_rows)
        p = _vectors(passages, p_rows)
        q_local, p_local = self.ddp(q, p)
        received = 0

        def gather(t: Tensor, side: str) -> Tensor:
            nonlocal received
            counts = qc if side == "query" else pc
            received += gather_bytes(counts, _row_numel(t), t.element_size())
            return gather_rows(t, counts, ctx)

        q_repr = gather(q_local, "query")  # (G, ...)
        p_repr = gather(p_local, "passage")  # (M, ...)
        hook = getattr(self.model, "gather_batch_state", None)
        if callable(hook):
            hook(gather)
        loss, parts = loss_fn(self.model, batch, q_repr, p_repr, symmetric_weight)
        self.comm_bytes += received
        parts["comm_bytes"] = received
        return loss, parts


def _row_numel(t: Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= int(s)
    return n


def _vectors(x: np.ndarray, rows: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x[rows], dtype=np.float32))


def sharded_training(model: nn.Module, seed: int) -> ShardedTraining | None:
    """Set up data-parallel training of ``model`` when running under ``torchrun``, else None.

    Wraps the towers in ``DistributedDataParallel`` (which broadcasts rank 0's parameters and
    buffers, so every rank starts from the same state) and reseeds torch with ``seed + rank``
    for the dropout masks of this rank's rows. The trainer runs on the CPU, so under NCCL the
    gathers and DDP's all-reduce use a gloo group of the same ranks (:meth:`DistContext.cpu`).
    """
    ctx = current()
    if ctx is None:
        return None
    ctx = ctx.cpu()
    ddp = DistributedDataParallel(_Towers(model), process_group=ctx.group)
    torch.manual_seed(seed + ctx.rank)
    return ShardedTraining(ctx, model, ddp)
