"""Sharded embedding under ``torchrun``: every rank encodes its share of the one-process batch
plan into a resumable shard, then one merge step writes the ordinary store.

The plan is :func:`treerank.store.embed.plan_embed`'s (queries, then the passages not reused
from a sibling store, each sorted by token length and cut to the token budget), computed by
every rank from the same inputs. Rank ``r`` of ``W`` encodes batches ``r, r + W, r + 2W, ...``
of each kind (round robin, so that long and short batches spread evenly), so every text is
encoded in exactly the batch, with exactly the neighbours and padding, of a one-process run: on
CPU the vectors are the same bits.

A shard is ``<out>/.shards/rank<r>-of<W>/`` with ``queries.bin`` / ``passages.bin`` (the rank's
batches' rows, in its batch order, float32) and ``progress.json`` (plan signature, batches
done, each batch's padded / real tokens and seconds), flushed after every batch: a rerun with
``resume`` continues where it stopped, on every rank independently. :func:`merge_shards` (rank 0,
after every shard is complete) runs :func:`~treerank.store.embed.embed_split` with a batch
source reading the shards instead of the encoder, so the merged store is the one-process store
byte for byte (vector files, tables; ``meta.json`` differs only in its timings), then deletes
the shards. Memory per rank: the encoder and one batch; the shard files are on disk.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_write_json
from treerank.distributed.context import DistContext, current
from treerank.encoders.sentence import BatchResult, SentenceEncoder
from treerank.kernels.device import Device
from treerank.readers.split import RetrievalSplit
from treerank.store.embed import EmbedStats, embed_signature, embed_split, plan_embed, split_digest
from treerank.store.format import META_JSON, StoreFormatError

__all__ = [
    "SHARDS_DIR",
    "embed_shard",
    "embed_sharded",
    "merge_shards",
    "rank_device",
    "shard_dir",
]

SHARDS_DIR = ".shards"
_KINDS = ("query", "passage")
_FILES = {"query": "queries.bin", "passage": "passages.bin"}


@dataclass
class _ShardedResult(BatchResult):
    seconds: float = 0.0


def shard_dir(out: str | Path, rank: int, world_size: int) -> Path:
    """``<out>/.shards/rank<r>-of<W>``: where rank ``r`` of ``W`` writes its shard."""
    return Path(out) / SHARDS_DIR / f"rank{rank}-of{world_size}"


def _mine(n_batches: int, rank: int, world: int) -> list[int]:
    return list(range(rank, n_batches, world))


def embed_shard(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    out_dir: str | Path,
    rank: int,
    world_size: int,
    *,
    reuse: bool = True,
    progress: bool = True,
    stop_after_batches: int | None = None,
) -> dict[str, Any]:
    """Encode rank ``rank``'s batches of the plan into its shard (resumes a partial shard).

    Args:
        split: the split (every rank reads the same one).
        encoder: the encoder (same model, prompts and batching on every rank).
        out_dir: the store directory of the split; the shard goes to :func:`shard_dir`.
        rank, world_size: this process's share.
        reuse: passage reuse from sibling stores, as ``embed_split``.
        progress: a tqdm bar.
        stop_after_batches: test hook simulating a crash: raise ``KeyboardInterrupt`` after
            this many batches were written in this call.

    Returns:
        The shard's ``progress.json`` content (``complete: true``).

    Raises:
        StoreFormatError: the shard holds files of a run with other inputs or sizes.
    """
    from tqdm.auto import tqdm

    split.validate()
    out = Path(out_dir)
    sdir = shard_dir(out, rank, world_size)
    sdir.mkdir(parents=True, exist_ok=True)
    plan = plan_embed(split, encoder, out, reuse)
    signature = embed_signature(split_digest(split), encoder)
    batches = {"query": plan.q_batches, "passage": plan.p_batches}
    mine = {k: _mine(len(batches[k]), rank, world_size) for k in _KINDS}
    rows = {k: sum(len(batches[k][b]) for b in mine[k]) for k in _KINDS}
    dim = encoder.dim
    prog_path = sdir / "progress.json"
    state: dict[str, Any] | None = None
    if prog_path.is_file():
        state = json.loads(prog_path.read_text(encoding="utf-8"))
        sizes_ok = all(
            (sdir / _FILES[k]).is_file() and (sdir / _FILES[k]).stat().st_size == rows[k] * dim * 4
            for k in _KINDS
        )
        if state.get("signature") != signature or state.get("reuse_digest") != plan.reuse_digest:
            raise StoreFormatError(
                f"{prog_path}: a shard of another run (other data, encoder, batching or reused "
                "passages) is here; remove the .shards directory to start again"
            )
        if not sizes_ok:
            raise StoreFormatError(f"{sdir}: shard files have unexpected sizes; remove them")
    if state is None:
        for k in _KINDS:
            with open(sdir / _FILES[k], "wb") as f:
                f.truncate(rows[k] * dim * 4)
        state = {
            "signature": signature,
            "reuse_digest": plan.reuse_digest,
            "rank": rank,
            "world_size": world_size,
            "done": {k: 0 for k in _KINDS},
            "batches": {k: [] for k in _KINDS},  # [padded_tokens, real_tokens, seconds]
            "complete": False,
        }
        atomic_write_json(prog_path, state)
    texts = {"query": split.query_texts, "passage": split.passage_texts}
    written = 0
    for kind in _KINDS:
        done = int(state["done"][kind])
        if rows[kind] == 0 or dim == 0:
            continue
        mm = np.memmap(sdir / _FILES[kind], dtype=np.float32, mode="r+", shape=(rows[kind], dim))
        offset = sum(len(batches[kind][b]) for b in mine[kind][:done])
        bar = tqdm(
            total=rows[kind],
            initial=offset,
            desc=f"{kind} shard {rank}/{world_size}",
            disable=not progress,
            file=sys.stderr,
            mininterval=1.0,
        )
        try:
            for j in range(done, len(mine[kind])):
                idx = batches[kind][mine[kind][j]]
                t0 = time.perf_counter()
                res = encoder.encode_batch([texts[kind][i] for i in idx], kind)
                mm[offset : offset + len(idx)] = res.vectors
                mm.flush()
                offset += len(idx)
                state["batches"][kind].append(
                    [res.padded_tokens, res.real_tokens, time.perf_counter() - t0]
                )
                state["done"][kind] = j + 1
                atomic_write_json(prog_path, state)
                bar.update(len(idx))
                written += 1
                if stop_after_batches is not None and written >= stop_after_batches:
                    raise KeyboardInterrupt(f"test hook: stopped after {written} batches")
        finally:
            bar.close()
            del mm
    state["complete"] = True
    atomic_write_json(prog_path, state)
    return state


def merge_shards(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    out_dir: str | Path,
    world_size: int,
    *,
    reuse: bool = True,
    progress: bool = True,
) -> EmbedStats:
    """Write the store of ``split`` in ``out_dir`` from the ``world_size`` complete shards.

    Runs :func:`~treerank.store.embed.embed_split` (resumable itself) with the shards as the
    batch source, then removes ``<out>/.shards``.

    Returns:
        The store's `EmbedStats` (token counts and seconds summed from the shards).

    Raises:
        StoreFormatError: a shard is missing, incomplete, or from another run.
    """
    out = Path(out_dir)
    if (out / META_JSON).is_file():
        return embed_split(split, encoder, out, resume=True, reuse=reuse, progress=False)
    plan = plan_embed(split, encoder, out, reuse)
    signature = embed_signature(split_digest(split), encoder)
    batches = {"query": plan.q_batches, "passage": plan.p_batches}
    states, files = [], []
    for r in range(world_size):
        sdir = shard_dir(out, r, world_size)
        try:
            st = json.loads((sdir / "progress.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreFormatError(f"{sdir}: no readable shard progress.json ({exc})") from exc
        if not st.get("complete") or st.get("signature") != signature:
            raise StoreFormatError(
                f"{sdir}: shard incomplete or from another run; rerun the sharded embed"
            )
        if st.get("reuse_digest") != plan.reuse_digest:
            raise StoreFormatError(f"{sdir}: the shard was planned with other reused passages")
        states.append(st)
        files.append(
            {
                k: np.memmap(sdir / _FILES[k], dtype=np.float32, mode="r")
                if (sdir / _FILES[k]).stat().st_size
                else None
                for k in _KINDS
            }
        )
    # where batch b of each kind lives: (rank, row offset in that rank's file, position)
    where: dict[str, list[tuple[int, int, int]]] = {}
    for kind in _KINDS:
        offsets = [0] * world_size
        loc = []
        for b, ids in enumerate(batches[kind]):
            r = b % world_size
            loc.append((r, offsets[r], b // world_size))
            offsets[r] += len(ids)
        where[kind] = loc
    dim = encoder.dim

    def source(kind: str, b: int, ids: np.ndarray) -> BatchResult:
        r, off, j = where[kind][b]
        mm = files[r][kind]
        assert mm is not None
        vec = np.asarray(mm[off * dim : (off + len(ids)) * dim]).reshape(len(ids), dim)
        padded, real, seconds = states[r]["batches"][kind][j]
        return _ShardedResult(vec, int(padded), int(real), float(seconds))

    stats = embed_split(
        split, encoder, out, resume=True, reuse=reuse, progress=progress, batch_source=source
    )
    files.clear()  # close the shard maps before removing them
    shutil.rmtree(out / SHARDS_DIR, ignore_errors=True)
    return stats


def embed_sharded(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    out_dir: str | Path,
    *,
    ctx: DistContext | None = None,
    resume: bool = True,
    overwrite: bool = False,
    reuse: bool = True,
    progress: bool = True,
) -> EmbedStats | None:
    """Every rank encodes its shard, rank 0 merges, all ranks wait for the finished store.

    Without a process group this is ``embed_split``. Shards always resume (their progress is
    per batch); ``resume`` / ``overwrite`` act on the store as in ``embed_split``: a finished
    store is kept only with ``resume`` (and the same signature), ``overwrite`` removes it and
    any shards first.

    Returns:
        The store's `EmbedStats` on rank 0 (and in one process), None on the other ranks.

    Raises:
        StoreExistsError: ``out_dir`` holds a finished store and neither ``resume`` nor
            ``overwrite`` was given (raised on every rank).
    """
    from treerank.store.embed import StoreExistsError, clear_store

    ctx = ctx if ctx is not None else current()
    out = Path(out_dir)
    if ctx is None:
        return embed_split(
            split, encoder, out, resume=resume, overwrite=overwrite, reuse=reuse, progress=progress
        )
    if (out / META_JSON).is_file() and not (resume or overwrite):
        raise StoreExistsError(
            f"{out / META_JSON}: a finished store is already here; pass overwrite (--overwrite) "
            "to replace it"
        )
    if overwrite:
        if ctx.is_main and out.is_dir():
            clear_store(out)
            shutil.rmtree(out / SHARDS_DIR, ignore_errors=True)
        ctx.barrier()
    stats = None
    if not (out / META_JSON).is_file():
        embed_shard(
            split,
            encoder,
            out,
            ctx.rank,
            ctx.world_size,
            reuse=reuse,
            progress=progress and ctx.is_main,
        )
    ctx.barrier()
    if ctx.is_main:
        stats = merge_shards(split, encoder, out, ctx.world_size, reuse=reuse, progress=progress)
    ctx.barrier()
    return stats


def rank_device(device: Device) -> Device:
    """``cuda`` -> ``cuda:LOCAL_RANK`` under torchrun (one GPU per process); else as given."""
    import os

    local = os.environ.get("LOCAL_RANK")
    on_rank = device == Device("cuda") and local is not None
    return Device("cuda", int(local)) if on_rank and local is not None else device
