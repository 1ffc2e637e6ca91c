"""Scale-out on ``torch.distributed`` (launched by ``torchrun``; gloo on CPU, NCCL on GPUs).

* :mod:`.context`: the process group from ``torchrun``'s environment, rank helpers, shards;
* :mod:`.gather`: the cross-process gather behind in-batch negatives (gradient maths there);
* :mod:`.training`: DDP + global batches for :func:`treerank.training.trainer.fit`;
* :mod:`.embed`: sharded embedding along the one-process batch plan, and the merge;
* :mod:`.search`: sharded exact search over contiguous passage shards, merged top-k.

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
