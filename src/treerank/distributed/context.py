"""The process group of a ``torchrun`` launch: who am I, how many are we, how to finish cleanly.

``torchrun`` (``python -m torch.distributed.run``) starts ``N`` copies of a command and sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each one's
environment. :func:`launch` turns that environment into an initialised default process group
(``gloo`` on CPU, ``nccl`` when CUDA is available, overridable with ``TREERANK_DIST_BACKEND``)
and destroys it on the way out, so every process exits with status 0 after a normal run. Without
those variables (or with ``WORLD_SIZE=1``) it does nothing, so the same command runs unchanged
in one process.

Everything else in :mod:`treerank.distributed` asks :func:`current` for the group; ``None`` means
"one process", and the callers then take their ordinary single-process path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "DistContext",
    "broadcast_from_main",
    "current",
    "is_main_process",
    "launch",
    "main_first",
    "shard_bounds",
]

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """One process's place in the default process group.

    Attributes:
        rank: this process's rank in ``[0, world_size)``.
        world_size: number of processes ``W`` (>= 2; one process has no context).
        backend: ``"gloo"`` or ``"nccl"``.
        device: where collectives' tensors live (``cuda:LOCAL_RANK`` for NCCL, else CPU).
        group: the process group of the collectives (None: the default group).
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    group: Any = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes shared outputs and shows progress bars."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait until every rank has reached this point."""
        dist.barrier(group=self.group)

    def cpu(self) -> DistContext:
        """This context for CPU tensors: itself with gloo, a new gloo group beside NCCL.

        Treerank's heads train and search on the CPU; under NCCL their collectives run on a
        gloo group of the same ranks (created collectively: every rank must call this).
        """
        global _CPU_GROUP
        if self.backend == "gloo":
            return self
        if _CPU_GROUP is None:
            _CPU_GROUP = dist.new_group(backend="gloo")
        return DistContext(self.rank, self.world_size, "gloo", torch.device("cpu"), _CPU_GROUP)


_CPU_GROUP: Any = None


def current() -> DistContext | None:
    """The initialised default process group with ``W >= 2`` ranks, else None (one process)."""
    global _CPU_GROUP
    if not (dist.is_available() and dist.is_initialized()):
        _CPU_GROUP = None
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    backend = str(dist.get_backend())
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    else:
        device = torch.device("cpu")
    return DistContext(dist.get_rank(), world, backend, device)


def is_main_process() -> bool:
    """True in a single process and on rank 0 of a group."""
    ctx = current()
    return ctx is None or ctx.is_main


@contextmanager
def launch(timeout_s: float = 1800.0) -> Iterator[DistContext | None]:
    """Join the process group ``torchrun`` describes in the environment, for the ``with`` body.

    Reads ``WORLD_SIZE`` / ``RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` (the ``env://``
    rendezvous). Backend: ``TREERANK_DIST_BACKEND`` if set, else ``nccl`` when CUDA is
    available, else ``gloo``; with NCCL the process binds ``cuda:LOCAL_RANK``. On a normal exit
    the ranks meet at a barrier and the group this call created is destroyed, which is what
    lets every process exit cleanly (status 0); on an exception it is destroyed at once (torchrun
    then stops the other ranks). A group created by the caller is left alone.

    Yields:
        :class:`DistContext`, or None when ``WORLD_SIZE`` is unset or 1.

    Raises:
        RuntimeError: the rendezvous fails or times out (``timeout_s`` seconds).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or (dist.is_available() and dist.is_initialized()):
        yield current()
        return
    backend = os.environ.get("TREERANK_DIST_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo"
    )
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    try:
        yield current()
    except BaseException:
        dist.destroy_process_group()  # torchrun stops the other ranks
        raise
    dist.barrier()  # nobody tears the group down while another rank still uses it
    dist.destroy_process_group()


@contextmanager
def main_first() -> Iterator[None]:
    """Run the body on rank 0 first, then on the other ranks (which then find its results).

    For work with a shared on-disk result (mining negatives into the store, a cached index):
    rank 0 computes and writes it, the others wait at a barrier and then read it. A no-op in
    one process.
    """
    ctx = current()
    if ctx is None:
        yield
        return
    if not ctx.is_main:
        ctx.barrier()
    yield
    if ctx.is_main:
        ctx.barrier()


def broadcast_from_main(fn: Callable[[], T]) -> T:
    """Call ``fn`` on rank 0 only and return its (picklable) result on every rank.

    In one process this is ``fn()``. Used for the held-out validation of distributed
    training: one rank evaluates, every rank takes the same early-stopping decision.
    """
    ctx = current()
    if ctx is None:
        return fn()
    box: list[Any] = [fn() if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, device=ctx.device)
    return box[0]  # type: ignore[no-any-return]


def shard_bounds(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """Contiguous ``[lo, hi)`` share of ``n`` items for ``rank`` of ``world_size``.

    The first ``n % world_size`` ranks get one item more; shares are in rank order and cover
    ``range(n)`` exactly (a share may be empty when ``n < world_size``).

    Raises:
        ValueError: ``n < 0``, ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.
    """
    if n < 0 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"shard_bounds: need n >= 0 and 0 <= rank < world_size, got {n}, {rank}, {world_size}"
        )
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)
