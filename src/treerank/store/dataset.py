"""Embed a dataset's splits into a store root: the library behind ``treerank embed``.

:func:`embed_dataset` makes every decision the command used to make itself, so that the
pipeline's embed stage and any script get the same behaviour: the input format (detected, or
checked against :data:`treerank.readers.FORMATS`), the default split of that format, one encoder
loaded once (after the first split was read, so bad input fails before the model loads), and
sharded embedding when the process runs under ``torchrun`` (each rank encodes its share of the
batch plan, rank 0 merges: :func:`treerank.store.sharded_embed.embed_sharded`; one process:
:func:`treerank.store.embed_split`). Reuse of passages already encoded in a sibling split store,
resume and overwrite are the store's own options, passed through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treerank.encoders import SentenceEncoder
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.readers import FORMATS, DataFormatError, RetrievalSplit, detect_format, read_split
from treerank.store.embed import EmbedStats, StoreExistsError

__all__ = ["DatasetPlan", "EmbeddedSplit", "embed_dataset", "plan_dataset"]


@dataclass(frozen=True)
class DatasetPlan:
    """The format of an input and the splits to embed from it."""

    format: str
    splits: tuple[str, ...]


@dataclass
class EmbeddedSplit:
    """One split written by :func:`embed_dataset`.

    Attributes:
        split: the split name; ``path`` its store directory.
        n_queries, n_passages, k: sizes of the split as read.
        warnings: the reader's warnings about the input.
        stats: the embedding statistics (None on the non-zero ranks under ``torchrun``).
        encoder_name, encoder_fingerprint: the encoder that wrote it.
    """

    split: str
    path: Path
    n_queries: int
    n_passages: int
    k: int
    warnings: list[str] = field(default_factory=list)
    stats: EmbedStats | None = None
    encoder_name: str = ""
    encoder_fingerprint: str = ""

    def summary(self) -> dict[str, Any]:
        """JSON types: sizes, encoder, stats and warnings (the pipeline stage's summary)."""
        return {
            "n_queries": self.n_queries,
            "n_passages": self.n_passages,
            "k": self.k,
            "encoder": self.encoder_name,
            "encoder_fingerprint": self.encoder_fingerprint,
            "stats": self.stats.to_dict() if self.stats is not None else None,
            "warnings": list(self.warnings),
        }


def plan_dataset(
    input_path: str | Path, fmt: str = "auto", splits: Sequence[str] = ()
) -> DatasetPlan:
    """The format of ``input_path`` and the splits to embed (the format's default when none).

    Args:
        input_path: the input file or directory.
        fmt: ``"auto"`` (detect from the path and its contents) or a name of
            :data:`treerank.readers.FORMATS`.
        splits: the splits asked for, in order; one named twice is embedded once. Empty: the
            format's default split.

    Raises:
        DataFormatError: the input is missing, its format cannot be detected, or ``fmt`` is
            not a known format (the message lists them); two splits of an MS MARCO input that
            would read the same files (one file holds one split).
    """
    name = detect_format(Path(input_path)) if fmt == "auto" else fmt
    if name not in FORMATS:
        raise DataFormatError(
            Path(input_path), f"unknown format {fmt!r}; use one of {list(FORMATS)}"
        )
    plan = DatasetPlan(name, tuple(dict.fromkeys(splits)) or (FORMATS[name][1],))
    if name == "msmarco" and len(plan.splits) > 1:
        _check_split_files(Path(input_path), plan.splits)
    return plan


def _check_split_files(path: Path, splits: Sequence[str]) -> None:
    """MS MARCO input names its split only by file (a single file holds one split; a shard
    directory selects ``<split>*`` shards): refuse two splits that would read the same files."""
    from treerank.readers.msmarco import msmarco_files

    seen: dict[tuple[Path, ...], str] = {}
    for s in splits:
        files = tuple(msmarco_files(path, s))
        if files in seen:
            what = (
                "this file holds one split"
                if path.is_file()
                else (f"no shard name here starts with {s!r} or {seen[files]!r}")
            )
            raise DataFormatError(
                path,
                f"--split {seen[files]} and --split {s} would read the same rows ({what}); "
                "a train/test split read from one set of rows is a leak: give each split its "
                "own file (or shards named <split>-*.parquet), or split the queries yourself "
                "(README, 'Your own data': a collection without a train/test split)",
            )
        seen[files] = s


def embed_dataset(
    input_path: str | Path,
    out: str | Path,
    make_encoder: Callable[[Device], SentenceEncoder],
    *,
    fmt: str = "auto",
    splits: Sequence[str] = (),
    limit: int | None = None,
    max_passages: int | None = None,
    device: Device = DEFAULT_DEVICE,
    resume: bool = False,
    overwrite: bool = False,
    reuse: bool = True,
    replace_stale: bool = False,
    progress: bool = True,
    split_dir: Callable[[str], Path] | None = None,
    on_read: Callable[[str, RetrievalSplit | None, bool], None] | None = None,
    on_done: Callable[[EmbeddedSplit], None] | None = None,
) -> list[EmbeddedSplit]:
    """Read and embed each split of a dataset into ``<out>/<split>/``.

    Args:
        input_path: the input file or directory; ``fmt`` / ``splits``: see :func:`plan_dataset`.
        out: the store root.
        make_encoder: ``make_encoder(device) -> SentenceEncoder``, called once, after the first
            split was read; ``device`` is ``device`` as given, or ``cuda:LOCAL_RANK`` for
            ``"cuda"`` under ``torchrun`` (one GPU per process).
        limit: keep only the first ``limit`` queries; ``max_passages``: cap the corpus (every
            candidate of the kept queries, then the first other passages).
        resume, overwrite, reuse: as :func:`treerank.store.embed_split` (``reuse``: copy
            passages already encoded by the same encoder in a sibling split store).
        replace_stale: when the destination holds a finished store of other inputs (or an
            unrelated partial run), replace it instead of raising (the pipeline's choice: its
            stage key already says the inputs changed).
        progress: progress bars.
        split_dir: the store directory of a split (default ``out / split``).
        on_read: ``on_read(split, data, is_main)``, called before reading (``data`` None) and
            after reading each split (for messages; ``is_main`` is False on the non-zero ranks).
        on_done: called with each split's :class:`EmbeddedSplit` once it is written.

    Returns:
        One :class:`EmbeddedSplit` per split, in order.

    Raises:
        DataFormatError: see :func:`plan_dataset`, and bad input rows (the message names the
            file and row), before anything is written.
        StoreExistsError: a destination holds a finished store and neither ``resume`` nor
            ``overwrite`` (nor ``replace_stale``) was given.
        LockHeldError: another process is writing a destination.
        KeyboardInterrupt: interrupted; the partial store is marked incomplete and a call with
            ``resume=True`` finishes it byte for byte.
    """
    from treerank.distributed.context import launch
    from treerank.store.embed import check_destination, embed_split
    from treerank.store.sharded_embed import embed_sharded, rank_device

    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1 (queries kept), got {limit}")
    plan = plan_dataset(input_path, fmt, splits)
    root = Path(out)
    where = split_dir or (lambda s: root / s)
    if not replace_stale:  # refuse an occupied destination before reading anything
        for name in plan.splits:
            check_destination(where(name), resume=resume, overwrite=overwrite)
    encoder: SentenceEncoder | None = None
    done: list[EmbeddedSplit] = []
    with launch() as ctx:  # under torchrun: one process group for every split
        main = ctx is None or ctx.is_main
        for name in plan.splits:
            if on_read is not None:
                on_read(name, None, main)
            data = read_split(Path(input_path), plan.format, name, limit, max_passages)
            if on_read is not None:
                on_read(name, data, main)
            if encoder is None:
                encoder = make_encoder(rank_device(device))
            dest = where(name)
            embed = embed_split if ctx is None else embed_sharded
            try:
                stats = embed(
                    data,
                    encoder,
                    dest,
                    resume=resume,
                    overwrite=overwrite,
                    reuse=reuse,
                    progress=progress,
                )
            except StoreExistsError:
                if not replace_stale or overwrite:
                    raise
                stats = embed(
                    data,
                    encoder,
                    dest,
                    resume=False,
                    overwrite=True,
                    reuse=reuse,
                    progress=progress,
                )
            done.append(
                EmbeddedSplit(
                    split=name,
                    path=dest,
                    n_queries=data.n_queries,
                    n_passages=data.n_passages,
                    k=data.k,
                    warnings=list(data.warnings()),
                    stats=stats,
                    encoder_name=str(encoder.name),
                    encoder_fingerprint=str(encoder.fingerprint),
                )
            )
            if on_done is not None:
                on_done(done[-1])
    return done
