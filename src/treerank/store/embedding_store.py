"""`EmbeddingStore`: a split's vectors and candidate tables, memory-mapped, random access by id."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_write_bytes, atomic_write_json
from treerank.kernels.vectors import ROW_CHUNK
from treerank.store.format import (
    ALIASES_TSV,
    ARRAYS_DIR,
    INDEX_DTYPE,
    INDICES_BIN,
    LABEL_DTYPE,
    LEGACY_INDICES_BIN,
    LEGACY_SELECTED_BIN,
    META_JSON,
    PASSAGES_BIN,
    PASSAGES_JSONL,
    PROGRESS_JSON,
    PSEUDO_SOURCE,
    QRELS_TSV,
    QUERIES_BIN,
    QUERIES_JSONL,
    SELECTED_BIN,
    VECTOR_DTYPE,
    IncompleteStoreError,
    StoreFormatError,
    StoreRootError,
    memmap_rows,
    rows_in,
)

_ARRAY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _root_splits(root: Path) -> tuple[list[str], list[str]]:
    """``(splits, pseudo)``: the store directories under a store root, sorted; ``pseudo`` holds
    the training-data pseudo splits (``meta.json`` ``source`` = ``"pseudo"``,
    ``treerank.training.pseudo``), which are not splits of the dataset."""
    splits: list[str] = []
    pseudo: list[str] = []
    for d in sorted(root.iterdir()):
        meta = d / META_JSON
        if not meta.is_file():
            continue
        try:
            source = json.loads(meta.read_text(encoding="utf-8")).get("source")
        except (OSError, ValueError, AttributeError):
            source = None
        (pseudo if source == PSEUDO_SOURCE else splits).append(d.name)
    return splits, pseudo


class EmbeddingStore:
    """One split of an embedding store, opened read-only with memory maps.

    Nothing is read whole: ``queries`` / ``passages`` are ``np.memmap`` views, so row ``i`` is
    query / passage id ``i`` and costs one page read. The id -> text tables are loaded on first
    use only.

    Attributes:
        path: the split directory.
        queries: ``float32 (n_queries, dim)`` memmap (L2-normalised when ``normalized``).
        passages: ``float32 (n_passages, dim)`` memmap.
        candidates: ``int32 (n_queries, K)`` passage ids of each query's candidates, -1 padding.
        labels: ``uint8 (n_queries, K)`` grades (1 = selected for MS MARCO), 0 for padding.
        meta: the parsed ``meta.json`` (for Go-tool stores: a minimal dict with ``legacy``).
    """

    def __init__(
        self,
        path: Path,
        queries: np.ndarray,
        passages: np.ndarray,
        candidates: np.ndarray,
        labels: np.ndarray,
        meta: dict[str, Any],
    ) -> None:
        self.path = path
        self.queries = queries
        self.passages = passages
        self.candidates = candidates
        self.labels = labels
        self.meta = meta
        self._query_table: list[dict[str, Any]] | None = None
        self._passage_table: list[dict[str, Any]] | None = None
        # where derived data lives (sidecar arrays, pseudo splits): the store's own directory
        # unless :meth:`with_derived` points it elsewhere (a pipeline stage's directory)
        self._arrays_write: Path | None = None
        self._arrays_read: tuple[Path, ...] = ()
        self._pseudo_roots: tuple[Path, ...] = ()

    def with_derived(
        self,
        arrays_write: Path | None = None,
        arrays_read: tuple[Path, ...] = (),
        pseudo_roots: tuple[Path, ...] = (),
        pseudo_arrays: tuple[Path, ...] = (),
    ) -> EmbeddingStore:
        """A view of this split whose derived data lives outside its directory.

        The vectors, tables and texts are this store's (shared, nothing is copied); sidecar
        arrays are read from ``arrays_write`` then ``arrays_read`` (each a directory holding
        ``<name>.npy``), never from ``path/arrays``, and written only into ``arrays_write``;
        pseudo splits live under one of ``pseudo_roots`` (:meth:`pseudo_split_dir`; a new one
        under the first), and a pseudo split
        opened through :meth:`pseudo_view` reads its arrays from ``pseudo_arrays`` only (and
        writes none). This is how
        ``treerank run`` keeps a user's store untouched: each stage writes only into its own
        directory.

        Raises:
            PermissionError: :meth:`save_array` on a view without ``arrays_write``.
        """
        view = copy.copy(self)
        view._arrays_write = None if arrays_write is None else Path(arrays_write)
        view._arrays_read = tuple(Path(p) for p in arrays_read)
        view._pseudo_roots = tuple(Path(p) for p in pseudo_roots)
        view._pseudo_arrays = tuple(Path(p) for p in pseudo_arrays)
        view._derived = True
        return view

    _pseudo_arrays: tuple[Path, ...] = ()

    def pseudo_view(self, pseudo: EmbeddingStore) -> EmbeddingStore:
        """``pseudo`` (a pseudo split of this store) with its arrays where this view keeps
        them: unchanged for a plain store, else in ``pseudo_arrays`` of :meth:`with_derived`."""
        if not self._derived:
            return pseudo
        return pseudo.with_derived(arrays_read=self._pseudo_arrays)

    def pseudo_split_dir(self, name: str) -> Path:
        """The directory of this store's pseudo split ``name``: beside the split by default;
        for a view, the first of its ``pseudo_roots`` that holds it (else the first root)."""
        roots = self._pseudo_roots or (self.path.parent,)
        return next((r / name for r in roots if (r / name).is_dir()), roots[0] / name)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, split_dir: str | Path, dim: int | None = None) -> EmbeddingStore:
        """Open a split directory.

        Args:
            split_dir: directory with the store files.
            dim: vector dimension; required only for stores without ``meta.json`` (written by
                the original Go ``cmd/embed`` tool, 3840 dims), checked against meta otherwise.

        Raises:
            IncompleteStoreError: an embed run into this directory has not finished.
            StoreFormatError: missing files, sizes that are not whole rows, row counts that
                disagree between files, out-of-range candidate ids, ``dim`` disagreeing with meta.
        """
        path = Path(split_dir)
        if not path.is_dir():
            raise StoreFormatError(f"{path}: store directory not found")
        meta_path = path / META_JSON
        if not meta_path.is_file():
            if (path / PROGRESS_JSON).is_file():
                raise IncompleteStoreError(
                    f"{path}: incomplete store (an embed run was interrupted; no {META_JSON}); "
                    "finish it with `treerank embed ... --resume`"
                )
            splits, pseudo = _root_splits(path)
            if splits or pseudo:
                raise StoreRootError(path, splits, pseudo)
            if dim is None:
                raise StoreFormatError(
                    f"{meta_path}: file not found; for a store written by the Go cmd/embed tool "
                    "pass its dimension (dim=3840)"
                )
            return cls._open_legacy(path, dim)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreFormatError(f"{meta_path}: not valid JSON ({exc})") from None
        if not meta.get("complete", False):
            raise IncompleteStoreError(f"{meta_path}: store is marked incomplete")
        d, k = int(meta["dim"]), int(meta["k"])
        if dim is not None and dim != d:
            raise StoreFormatError(f"{meta_path}: dim is {d}, caller expects {dim}")
        nq = rows_in(path / QUERIES_BIN, d * 4)
        npas = rows_in(path / PASSAGES_BIN, d * 4)
        for name, n, want in ((QUERIES_BIN, nq, "n_queries"), (PASSAGES_BIN, npas, "n_passages")):
            if n != int(meta[want]):
                raise StoreFormatError(f"{path / name}: {n} rows, {META_JSON} says {meta[want]}")
        cand, lab = cls._open_tables(path, INDICES_BIN, SELECTED_BIN, nq, k, npas)
        return cls(
            path,
            memmap_rows(path / QUERIES_BIN, VECTOR_DTYPE, nq, d),
            memmap_rows(path / PASSAGES_BIN, VECTOR_DTYPE, npas, d),
            cand,
            lab,
            meta,
        )

    @classmethod
    def _open_legacy(cls, path: Path, dim: int) -> EmbeddingStore:
        idx_name = INDICES_BIN if (path / INDICES_BIN).is_file() else LEGACY_INDICES_BIN
        sel_name = SELECTED_BIN if (path / SELECTED_BIN).is_file() else LEGACY_SELECTED_BIN
        nq = rows_in(path / QUERIES_BIN, dim * 4)
        npas = rows_in(path / PASSAGES_BIN, dim * 4)
        n_idx = rows_in(path / idx_name, 4)
        if nq == 0:
            k = 0
        elif n_idx % nq:
            raise StoreFormatError(
                f"{path / idx_name}: {n_idx} ids is not a whole number of rows for {nq} queries "
                f"(from {QUERIES_BIN} at dim {dim})"
            )
        else:
            k = n_idx // nq
        cand, lab = cls._open_tables(path, idx_name, sel_name, nq, k, npas)
        meta: dict[str, Any] = {
            "legacy": True,
            "dim": dim,
            "k": k,
            "n_queries": nq,
            "n_passages": npas,
            "normalized": None,
            "relevance_threshold": 1,
            "split": path.name,
            "encoder": {"name": None, "fingerprint": None},
        }
        return cls(
            path,
            memmap_rows(path / QUERIES_BIN, VECTOR_DTYPE, nq, dim),
            memmap_rows(path / PASSAGES_BIN, VECTOR_DTYPE, npas, dim),
            cand,
            lab,
            meta,
        )

    @staticmethod
    def _open_tables(
        path: Path, idx_name: str, sel_name: str, nq: int, k: int, npas: int
    ) -> tuple[np.ndarray, np.ndarray]:
        n_idx = rows_in(path / idx_name, 4)
        n_sel = rows_in(path / sel_name, 1)
        if n_idx != nq * k:
            raise StoreFormatError(
                f"{path / idx_name}: {n_idx} ids, expected {nq} queries x K={k} = {nq * k}"
            )
        if n_sel != nq * k:
            raise StoreFormatError(
                f"{path / sel_name}: {n_sel} labels, expected {nq} queries x K={k} = {nq * k}"
            )
        cand = np.asarray(memmap_rows(path / idx_name, INDEX_DTYPE, nq, k)).astype(np.int32)
        lab = np.array(memmap_rows(path / sel_name, LABEL_DTYPE, nq, k), dtype=np.uint8)
        if cand.size and (int(cand.max()) >= npas or int(cand.min()) < -1):
            raise StoreFormatError(
                f"{path / idx_name}: passage id out of range [-1, {npas}) "
                f"(min {int(cand.min())}, max {int(cand.max())})"
            )
        return cand, lab

    # --------------------------------------------------------------- properties
    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    @property
    def n_passages(self) -> int:
        return int(self.passages.shape[0])

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def k(self) -> int:
        """Candidates per query (columns of ``candidates``)."""
        return int(self.candidates.shape[1])

    @property
    def relevance_threshold(self) -> int:
        """A grade ``>=`` this counts as relevant (1; 2 for TREC DL)."""
        return int(self.meta.get("relevance_threshold", 1))

    @property
    def encoder_name(self) -> str | None:
        return self.meta.get("encoder", {}).get("name")

    @property
    def encoder_fingerprint(self) -> str | None:
        """``"sha256:..."`` of the encoder's weights (`weights_fingerprint`); None for Go stores."""
        return self.meta.get("encoder", {}).get("fingerprint")

    @property
    def query_prompt(self) -> str | None:
        return self.meta.get("encoder", {}).get("query_prompt")

    @property
    def normalized(self) -> bool:
        """Whether stored rows are L2-normalised (False when unknown, as for Go stores)."""
        return bool(self.meta.get("normalized"))

    @property
    def split(self) -> str:
        return str(self.meta.get("split", self.path.name))

    @property
    def source(self) -> str | None:
        return self.meta.get("source")

    # -------------------------------------------------------------- text tables
    def _table(self, name: str) -> list[dict[str, Any]]:
        p = self.path / name
        if not p.is_file():
            raise StoreFormatError(f"{p}: file not found (Go-tool stores have no text tables)")
        # Split on "\n" only: str.splitlines() also breaks on U+0085 / U+2028, which real text
        # (DL19's mojibake) contains inside JSON strings.
        text = p.read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.split("\n") if line]
        want = self.n_queries if name == QUERIES_JSONL else self.n_passages
        if len(rows) != want:
            raise StoreFormatError(f"{p}: {len(rows)} rows, expected {want}")
        return rows

    def _queries_table(self) -> list[dict[str, Any]]:
        if self._query_table is None:
            self._query_table = self._table(QUERIES_JSONL)
        return self._query_table

    def _passages_table(self) -> list[dict[str, Any]]:
        if self._passage_table is None:
            self._passage_table = self._table(PASSAGES_JSONL)
        return self._passage_table

    def query_texts(self) -> list[str]:
        """Text of each query id (without the prompt)."""
        return [r["text"] for r in self._queries_table()]

    def passage_texts(self) -> list[str]:
        """Text of each passage id."""
        return [r["text"] for r in self._passages_table()]

    @property
    def has_texts(self) -> bool:
        """Whether the store has its text tables (Go-tool stores have none)."""
        return (self.path / QUERIES_JSONL).is_file() and (self.path / PASSAGES_JSONL).is_file()

    def query_ids(self) -> list[str]:
        """Source id of each query id (the row number as text for a Go-tool store)."""
        if self.meta.get("legacy") and not self.has_texts:
            return [str(i) for i in range(self.n_queries)]
        return [r["id"] for r in self._queries_table()]

    def passage_ids(self) -> list[str]:
        """Source id of each passage id, its first occurrence (the row number as text for a
        Go-tool store)."""
        if self.meta.get("legacy") and not self.has_texts:
            return [str(i) for i in range(self.n_passages)]
        return [r["id"] for r in self._passages_table()]

    def query_types(self) -> list[str] | None:
        """Per-query type (MS MARCO ``query_type``) or None when the source has none."""
        rows = self._queries_table()
        if not rows or "type" not in rows[0]:
            return None
        return [r["type"] for r in rows]

    def passage_aliases(self) -> dict[str, int]:
        """Every source passage id -> passage id (first occurrences and dedup-folded ones)."""
        out = {sid: i for i, sid in enumerate(self.passage_ids())}
        p = self.path / ALIASES_TSV
        if p.is_file():
            for line in p.read_text(encoding="utf-8").split("\n"):
                if not line:
                    continue
                sid, pid = line.rsplit("\t", 1)
                out[sid] = int(pid)
        return out

    def source_qrels(self) -> list[tuple[str, str, int]] | None:
        """The source's own judgments ``[(query id, doc id, grade)]`` by source ids (``qrels.tsv``),
        judged ids absent from the corpus included; ``None`` when the store has no such file
        (MS MARCO, whose candidate tables are the judgments, and stores written before it).

        Raises:
            StoreFormatError: a line that is not ``query_id<TAB>doc_id<TAB>grade``.
        """
        p = self.path / QRELS_TSV
        if not p.is_file():
            return None
        out: list[tuple[str, str, int]] = []
        for n, line in enumerate(p.read_text(encoding="utf-8").split("\n"), start=1):
            if not line:
                continue
            parts = line.split("\t")
            try:
                out.append((parts[0], parts[1], int(parts[2])))
            except (IndexError, ValueError):
                raise StoreFormatError(
                    f"{p}, line {n}: expected query_id<TAB>doc_id<TAB>grade"
                ) from None
        return out

        # --------------------------------------------------------------- iteration

    def iter_passage_chunks(self, chunk_size: int = ROW_CHUNK) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start_row, float32 (<=chunk_size, dim) block)`` over all passages in order.

        Blocks are memmap slices: only the pages touched are read.
        """
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        for start in range(0, self.n_passages, chunk_size):
            yield start, self.passages[start : start + chunk_size]

    # ---------------------------------------------------------- sidecar arrays
    _derived = False

    def _array_path(self, name: str, write: bool = False) -> Path | None:
        """Where sidecar array ``name`` is written (``write``) or found (None: absent)."""
        if not _ARRAY_NAME.match(name):
            raise ValueError(f"array name {name!r}: use letters, digits, '_', '-', '.'")
        if not self._derived:
            own = self.path / ARRAYS_DIR / f"{name}.npy"
            return own if write or own.is_file() else None
        if write:
            if self._arrays_write is None:
                raise PermissionError(
                    f"{self.path}: a read-only view of the store; array {name!r} not written"
                )
            return self._arrays_write / f"{name}.npy"
        roots = (() if self._arrays_write is None else (self._arrays_write,)) + self._arrays_read
        return next((r / f"{name}.npy" for r in roots if (r / f"{name}.npy").is_file()), None)

    def save_array(self, name: str, arr: np.ndarray, meta: dict[str, Any] | None = None) -> Path:
        """Save a sidecar array ``arrays/<name>.npy`` (+ ``<name>.json`` for ``meta``) atomically.

        Returns:
            the ``.npy`` path.
        """
        import io

        p = self._array_path(name, write=True)
        assert p is not None
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
        if meta is not None:
            atomic_write_json(p.with_suffix(".json"), meta)
        atomic_write_bytes(p, buf.getvalue())
        return p

    def array_file(self, name: str) -> Path | None:
        """The ``.npy`` file of sidecar array ``name`` (None: absent)."""
        return self._array_path(name)

    def has_array(self, name: str) -> bool:
        return self._array_path(name) is not None

    def load_array(self, name: str) -> np.ndarray | None:
        """The sidecar array ``name`` (memory-mapped read-only), or None if absent."""
        p = self._array_path(name)
        if p is None:
            return None
        return np.load(p, mmap_mode="r", allow_pickle=False)

    def load_array_meta(self, name: str) -> dict[str, Any] | None:
        """The JSON saved beside sidecar array ``name``, or None."""
        p = self._array_path(name)
        meta = None if p is None else p.with_suffix(".json")
        return json.loads(meta.read_text(encoding="utf-8")) if meta and meta.is_file() else None

    def __repr__(self) -> str:
        return (
            f"EmbeddingStore({str(self.path)!r}, split={self.split!r}, n_queries={self.n_queries}, "
            f"n_passages={self.n_passages}, dim={self.dim}, k={self.k})"
        )
