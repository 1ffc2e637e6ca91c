"""Scale-out on ``torch.distributed`` (launched by ``torchrun``; gloo on CPU, NCCL on GPUs).

* :mod:`.context`: the process group from ``torchrun``'s environment, rank helpers, shards;
* :mod:`.gather`: the cross-process gather behind in-batch negatives (gradient maths there);
* :mod:`.training`: DDP + global batches for :func:`treerank.training.trainer.fit`.

What is sharded lives beside what it shards: sharded exact search in
:mod:`treerank.kernels.sharded`, sharded embedding and the merge in
:mod:`treerank.store.sharded_embed`; the sharded search takes the process group as an
argument (no process-global hook).

Every entry point falls back to the one-process path when no group is running.
"""

from treerank.distributed.context import (
    DistContext,
    broadcast_from_main,
    current,
    is_main_process,
    launch,
    main_first,
    shard_bounds,
)

__all__ = [
    "DistContext",
    "broadcast_from_main",
    "current",
    "is_main_process",
    "launch",
    "main_first",
    "shard_bounds",
]
