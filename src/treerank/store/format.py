"""The store's on-disk format: file names, dtypes, errors, atomic writes (docs/DESIGN.md).

One directory per split:

==========================  =============================================================
``queries.bin``             ``n_queries x dim`` float32 little-endian, row = query id
``passages.bin``            ``n_passages x dim`` float32 little-endian, row = passage id
``query_indices.bin``       ``n_queries x K`` int32 little-endian passage ids, -1 = padding
``query_is_selected.bin``   ``n_queries x K`` uint8 grade (1 = selected), 0 for padding
``meta.json``               dim, K, counts, dtypes, encoder name + weights fingerprint,
                            prompts, ``normalized``, source, stats; written LAST
``queries.jsonl``           one ``{"id": source id, "text": ..., "type": ...}`` per query id
``passages.jsonl``          one ``{"id": source id, "text": ...}`` per passage id
``passage_aliases.tsv``     ``source_id<TAB>passage_id`` for source ids folded by dedup
``qrels.tsv``               ``query_id<TAB>doc_id<TAB>grade``: the source's own judgments by
                            source ids (judged ids absent from the corpus included); absent
                            when the candidate tables are the judgments (MS MARCO, older stores)
``progress.json``           present only while an embed run is unfinished (resume state)
``arrays/<name>.npy``       sidecar arrays (e.g. mined hard negatives) + ``<name>.json``
==========================  =============================================================

Stores written by the original Go ``cmd/embed`` tool have no sidecars and name the label tables
``queries_passage_ids.bin`` / ``queries_is_selected.bin``; they open when the caller gives ``dim``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FORMAT_NAME = "treerank-store"
FORMAT_VERSION = 1

QUERIES_BIN = "queries.bin"
PASSAGES_BIN = "passages.bin"
INDICES_BIN = "query_indices.bin"
SELECTED_BIN = "query_is_selected.bin"
LEGACY_INDICES_BIN = "queries_passage_ids.bin"
LEGACY_SELECTED_BIN = "queries_is_selected.bin"
META_JSON = "meta.json"
QUERIES_JSONL = "queries.jsonl"
PASSAGES_JSONL = "passages.jsonl"
ALIASES_TSV = "passage_aliases.tsv"
QRELS_TSV = "qrels.tsv"
PROGRESS_JSON = "progress.json"
ARRAYS_DIR = "arrays"
MINED_NEGATIVES_ARRAY = "bm25_negatives"  # sidecar array of BM25-mined hard negatives
PSEUDO_SOURCE = "pseudo"  # meta.json `source` of a training-data pseudo split (not a real split)

VECTOR_DTYPE = np.dtype("<f4")
INDEX_DTYPE = np.dtype("<i4")
LABEL_DTYPE = np.dtype("u1")

STORE_FILES = (
    QUERIES_BIN,
    PASSAGES_BIN,
    INDICES_BIN,
    SELECTED_BIN,
    META_JSON,
    QUERIES_JSONL,
    PASSAGES_JSONL,
    ALIASES_TSV,
    QRELS_TSV,
    PROGRESS_JSON,
)


class StoreFormatError(ValueError):
    """A store file is missing, has a size that is not a whole number of rows, or disagrees
    with another file. The message names the file."""


class StoreRootError(StoreFormatError):
    """A store *root* (``<root>/<split>/`` directories) was given where one split directory is
    needed. The message names the splits and suggests one split directory; it advises no
    command-line option (a command that has ``--split`` adds that itself, :meth:`advice`).

    Attributes:
        root: the directory. splits: its split names, sorted. pseudo: its training-data pseudo
            splits (not dataset splits).
    """

    def __init__(self, root: Path, splits: list[str], pseudo: list[str]) -> None:
        self.root = Path(root)
        self.splits = list(splits)
        self.pseudo = list(pseudo)
        super().__init__(self.advice())

    @classmethod
    def missing_split(cls, root: StoreRootError, split: str) -> StoreRootError:
        """The error for a root that lacks the wanted ``split`` (training's ``train``): it
        names the missing split and suggests no other one (training on ``test`` is a leak)."""
        err = cls(root.root, root.splits, root.pseudo)
        err.args = (
            f"{root.root}: a store root without a {split!r} split (it holds "
            f"{', '.join(root.splits + root.pseudo) or 'none'}); embed that split first "
            f"(treerank embed DATA --split {split} --out {root.root})",
        )
        return err

    def __str__(self) -> str:
        return str(self.args[0])

    @property
    def example(self) -> str:
        """The split to suggest: ``test`` when present, else a split other than ``train``."""
        names = self.splits or self.pseudo
        for name in ("test", *[n for n in names if n != "train"]):
            if name in names:
                return name
        return names[0]

    def advice(self, split_option: str | None = None) -> str:
        """The message; with ``split_option`` (e.g. ``"--split"``) it also offers that option."""
        extra = (
            f" (beside them {', '.join(self.pseudo)}: pseudo-queries built for training, "
            "not a split)"
            if self.pseudo
            else ""
        )
        option = f", or pass {split_option} {self.example}" if split_option else ""
        return (
            f"{self.root}: a store root holding the split(s) {', '.join(self.splits) or 'none'}"
            f"{extra}, not one split; open one split directory (e.g. "
            f"{self.root / self.example}){option}"
        )


class IncompleteStoreError(StoreFormatError):
    """The directory holds a store whose embed run has not finished (no ``meta.json``)."""


def rows_in(path: Path, row_bytes: int) -> int:
    """Number of rows of ``row_bytes`` in ``path``.

    Raises:
        StoreFormatError: missing file, or a size that is not a whole number of rows.
    """
    if not path.is_file():
        raise StoreFormatError(f"{path}: file not found")
    size = path.stat().st_size
    if row_bytes <= 0:
        raise StoreFormatError(f"{path}: row size must be positive, got {row_bytes}")
    if size % row_bytes:
        raise StoreFormatError(
            f"{path}: size {size} bytes is not a whole number of {row_bytes}-byte rows"
        )
    return size // row_bytes


def memmap_rows(path: Path, dtype: np.dtype, n_rows: int, n_cols: int) -> np.ndarray:
    """Read-only memory map of a ``(n_rows, n_cols)`` array (a zero-filled array when empty)."""
    if n_rows == 0 or n_cols == 0:
        return np.zeros((n_rows, n_cols), dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n_rows, n_cols))
