"""Cross-process in-batch negatives: gather every rank's rows, gradients flow to their producer.

The maths (``W`` ranks, global batch of ``G`` queries and ``M`` passage columns, rank ``r``
encodes the query rows ``Q_r`` and passage columns ``P_r`` of contiguous shards):

1. every rank all-gathers the **detached** representations of every shard (one
   ``all_gather`` per tensor, rows padded to the largest shard), so all ranks hold the full
   ``(G, .)`` query and ``(M, .)`` passage matrices;
2. it puts its own, non-detached shard back in its slot, through :class:`ScaleGrad`, which is
   the identity forward and multiplies the gradient by ``W`` backward;
3. every rank computes the **whole** batch loss ``L`` (InfoNCE of all ``G`` rows against all
   ``M`` columns, plus any extra loss), the value the one-process run computes on the batch.

On rank ``r`` backpropagation then yields ``g_r = W * dL/dtheta|_{via Q_r, P_r} +
dL/dtheta|_{direct}``: the gradient through its own shards (scaled by ``W``) plus the gradient
of the parameters that act after the gather (a learned temperature), which every rank sees in
full. DDP averages, so the step uses::

    (1/W) sum_r g_r = sum_r dL/dtheta|_{via Q_r, P_r} + dL/dtheta|_{direct} = dL/dtheta

i.e. exactly the one-process gradient of the global batch (chain rule: every row of ``Q`` and
``P`` is produced on exactly one rank). No collective runs in the backward pass (the
gradient of another rank's rows is never needed: that rank computes the same ``L`` and
differentiates through its own rows), so there is nothing left in flight when the process
group is destroyed. The deprecated ``torch.distributed.nn.functional.all_gather`` runs a
collective in its backward pass and was reported to abort at process exit on this machine (a
minimal 2-process gloo script with it exited 0 here, with and without
``destroy_process_group``); this scheme does not depend on it.

Cost per step and rank: the score matrix of the whole batch (``G x M``, the same as one
process computes: the loss is redundant across ranks, the towers are not), and a forward
communication volume of ``(W - 1) * (max_r |Q_r| * d_q + max_r |P_r| * d_p) * 4`` bytes
received (float32), plus whatever an extra loss gathers (DRT: its un-dropped slots).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from treerank.distributed.context import DistContext

__all__ = ["ScaleGrad", "gather_rows", "gather_bytes"]


class ScaleGrad(torch.autograd.Function):
    """``y = x`` forward, ``dL/dx = scale * dL/dy`` backward (a gradient-only rescaling)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: float) -> Tensor:
        ctx.scale = float(scale)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def gather_rows(local: Tensor, counts: list[int], ctx: DistContext) -> Tensor:
    """Concatenate every rank's rows in rank order; only ``local`` keeps a gradient path.

    Args:
        local: ``(counts[ctx.rank], ...)`` this rank's rows (any float dtype; on
            ``ctx.device`` for NCCL).
        counts: rows held by each rank (known to all ranks: they build the same batch plan).
        ctx: the process group.

    Returns:
        ``(sum(counts), ...)``: other ranks' rows detached, this rank's rows through
        :class:`ScaleGrad` with scale ``W`` (see the module docstring for why).

    Raises:
        ValueError: ``len(counts) != W`` or ``local`` has the wrong number of rows.
    """
    w = ctx.world_size
    if len(counts) != w or local.shape[0] != counts[ctx.rank]:
        raise ValueError(
            f"gather_rows: rank {ctx.rank} holds {local.shape[0]} rows, counts {counts} "
            f"for {w} ranks"
        )
    width = max(counts)
    send = local.detach()
    if send.shape[0] < width:
        pad = send.new_zeros((width - send.shape[0], *send.shape[1:]))
        send = torch.cat([send, pad])
    bufs = [torch.empty_like(send) for _ in range(w)]
    dist.all_gather(bufs, send.contiguous(), group=ctx.group)
    parts = [bufs[s][: counts[s]] for s in range(w)]
    parts[ctx.rank] = ScaleGrad.apply(local, float(w))
    return torch.cat(parts)


def gather_bytes(counts: list[int], row_numel: int, element_size: int = 4) -> int:
    """Bytes one rank receives in :func:`gather_rows` (``(W - 1) * max(counts) * row_numel``
    elements of ``element_size`` bytes; the padding to the largest shard included)."""
    return (len(counts) - 1) * max(counts, default=0) * row_numel * element_size
