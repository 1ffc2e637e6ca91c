"""Row access to a training split's vectors that never loads the split whole.

The contrastive trainers (heads, DRT) read a batch's query and passage rows at every step.
:class:`RowSource` wraps the stored ``(n, d)`` array (a read-only ``np.memmap`` of a store, an
ndarray, or any object with ``shape`` and row indexing) and serves ``rows -> float32 (len, d)``
gathers:

* a split under ``in_memory_bytes`` (default 2 GiB, the trainer's behaviour before this module)
  is copied into memory once, which is faster than gathering from the file;
* a larger one is **gathered from the memory map in blocks**: only the requested rows are read
  (``array[sorted unique rows]``), and every ``release_bytes`` of gathered rows the mapping's
  pages are dropped from the resident set (:func:`release_pages`, defined here), so the
  process's peak RSS follows the batch and ``release_bytes``, not the split (808K x 3,840
  float32 queries are 12 GB).

Either way a gather returns exactly the stored float32 values, so training on a memory-mapped
split gives byte-identical weights to training on the same split in memory.

:class:`FileRows` reads a store file's rows with ``pread`` instead of through its map (exact
search's chunk reader: no page of the file enters the resident set).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from typing import Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from treerank.kernels.vectors import F32, I64, Vecs

__all__ = [
    "IN_MEMORY_BYTES",
    "RELEASE_BYTES",
    "FileRows",
    "RowArray",
    "RowSource",
    "StackedRows",
    "release_pages",
]

IN_MEMORY_BYTES = 2 << 30
"""Splits below this many bytes are copied into memory (faster gathers)."""
RELEASE_BYTES = 256 << 20
"""Gathered bytes between two releases of a memory map's resident pages."""


RowSlice: TypeAlias = "slice[int | None, int | None, int | None]"
"""A slice of rows (``x[a:b]``, ``x[::2]``)."""


class RowArray(Protocol):
    """Anything row-indexable as an ``(n, d)`` float table: an ndarray, a ``np.memmap``, a
    :class:`RowSource`, a :class:`StackedRows`, a store view's vectors."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, idx: I64, /) -> Vecs: ...


class RowSource:
    """Row gathers from an ``(n, d)`` vector array without reading it whole (module docstring).

    Args:
        array: ``(n, d)`` float vectors: ``np.memmap``, ndarray, or an object with ``shape`` and
            ``__getitem__(int64 array of rows)`` (a store view); never written.
        in_memory_bytes: copy into memory when ``n * d * 4`` is below this (0: never).
        release_bytes: gathered bytes between page releases of a read-only memmap.

    Attributes:
        rows_read: rows gathered so far (with repeats), for tests and logs.
    """

    def __init__(
        self,
        array: RowArray,
        *,
        in_memory_bytes: int = IN_MEMORY_BYTES,
        release_bytes: int = RELEASE_BYTES,
    ) -> None:
        if isinstance(array, RowSource):
            array = array.array
        shape = tuple(int(s) for s in array.shape)
        if len(shape) != 2:
            raise ValueError(f"RowSource: expected (n, d) vectors, got shape {shape}")
        self.shape: tuple[int, int] = (shape[0], shape[1])
        # only arrays are copied in; any other row source (a store view) is always gathered
        self.in_memory = isinstance(array, np.ndarray) and shape[0] * shape[1] * 4 < in_memory_bytes
        if self.in_memory and isinstance(array, np.memmap):
            array = np.array(array, dtype=np.float32)  # read the file once
        elif self.in_memory:
            array = np.asarray(array, dtype=np.float32)
        self.array: RowArray = array
        self.release_bytes = int(release_bytes)
        self.rows_read = 0
        self._since_release = 0

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dtype(self) -> np.dtype[np.float32]:
        return np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return 2

    def gather(self, rows: I64) -> F32:
        """``float32 (len(rows), d)`` C-contiguous copy of ``rows`` (any order, repeats allowed).

        Raises:
            IndexError: a row outside ``[-n, n)``.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if self.in_memory:
            return np.ascontiguousarray(self.array[rows], dtype=np.float32)
        uniq, inv = np.unique(rows, return_inverse=True)
        block = np.asarray(self.array[uniq], dtype=np.float32)
        out = np.ascontiguousarray(block[inv.reshape(-1)], dtype=np.float32)
        self.rows_read += int(uniq.size)
        self._since_release += int(uniq.size) * self.shape[1] * 4
        if self._since_release >= self.release_bytes:
            self.release()
        return out

    def release(self) -> bool:
        """Drop a read-only memmap's resident pages now (True when released)."""
        self._since_release = 0
        if self.in_memory or not isinstance(self.array, np.ndarray):
            return False
        return release_pages(self.array, 0, self.shape[0])

    def __getitem__(self, idx: I64 | RowSlice) -> F32:
        if isinstance(idx, slice):
            return self.gather(np.arange(*idx.indices(self.shape[0])))
        return self.gather(np.asarray(idx))


class StackedRows:
    """Rows of ``first`` then rows of ``second`` (a training table's store rows then pseudo rows)
    as one row-indexable ``(n1 + n2, d)`` source, without concatenating them."""

    def __init__(self, first: RowArray, second: RowArray) -> None:
        if int(first.shape[1]) != int(second.shape[1]):
            raise ValueError(f"StackedRows: dims differ ({first.shape} vs {second.shape})")
        self.first, self.second = first, second
        self.n1 = int(first.shape[0])
        self.shape = (self.n1 + int(second.shape[0]), int(first.shape[1]))
        self.dtype = np.dtype(np.float32)
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> F32:
        """The whole table, concatenated (what a caller that needs it in memory gets)."""
        whole = np.concatenate(
            [np.asarray(self.first, dtype=np.float32), self.second[np.arange(self.second.shape[0])]]
        )
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __getitem__(self, idx: I64 | RowSlice) -> F32:
        rows = (
            np.arange(*idx.indices(self.shape[0]))
            if isinstance(idx, slice)
            else np.asarray(idx, dtype=np.int64)
        )
        out = np.empty((rows.size, self.shape[1]), dtype=np.float32)
        a = rows < self.n1
        if a.any():
            out[a] = np.asarray(self.first[rows[a]], dtype=np.float32)
        if (~a).any():
            out[~a] = np.asarray(self.second[rows[~a] - self.n1], dtype=np.float32)
        return out


class FileRows:
    """Rows of the file behind a read-only ``np.memmap``, read with ``pread`` into memory this
    process owns, never through the mapping.

    Reading a memory map leaves its pages in the process's resident set (``RssFile``) until they
    are released, and every page fault also maps up to 64 KiB of neighbouring pages that the page
    cache holds (the kernel's fault-around), so a scattered gather of ``m`` rows can map
    ``m * 64 KiB`` of the file whatever the rows' size. ``pread`` goes through the page cache
    (so re-reads stay fast) without mapping anything: a streaming pass holds exactly the buffer
    it reads into (:meth:`read`, one reused block) and a gather exactly its result
    (:meth:`gather`). The bytes are the file's, so results are bit-identical to reading the map.

    Use :meth:`of` to get one; it answers ``None`` for anything that is not a whole read-only
    ``np.memmap`` of a C-ordered 2-D file (an ndarray, a slice of a map, a writable map), for
    which callers read the array itself.
    """

    def __init__(
        self,
        path: str,
        offset: int,
        shape: tuple[int, int],
        dtype: np.dtype[np.float16 | np.float32 | np.float64],
    ) -> None:
        self.path, self.offset, self.shape, self.dtype = path, int(offset), shape, np.dtype(dtype)
        self.row_bytes = shape[1] * self.dtype.itemsize
        self._fd: int | None = None

    @classmethod
    def of(cls, array: object) -> FileRows | None:
        """A reader for ``array`` when it is a whole read-only ``np.memmap`` (module rules)."""
        if not (
            isinstance(array, np.memmap)
            and array.mode == "r"
            and isinstance(array.base, mmap.mmap)  # the map itself, not a view of it
            and array.ndim == 2
            and array.flags.c_contiguous
            and array.filename is not None
        ):
            return None
        shape = (int(array.shape[0]), int(array.shape[1]))
        return cls(str(array.filename), int(array.offset), shape, array.dtype)

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def close(self) -> None:
        """Close the file (a later read opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def _pread(self, out: Vecs, row: int) -> None:
        """Fill ``out`` (C-contiguous rows) from file row ``row`` on."""
        view = memoryview(out.reshape(-1).view(np.uint8).data)
        pos, done = self.offset + row * self.row_bytes, 0
        fd = self._file()
        while done < len(view):
            n = os.preadv(fd, [view[done:]], pos + done)
            if n <= 0:
                raise OSError(f"{self.path}: short read at byte {pos + done} (file truncated?)")
            done += n

    def read(self, start: int, stop: int, out: Vecs | None = None) -> Vecs:
        """Rows ``start .. stop - 1`` as ``(stop - start, d)`` of the file's dtype, read into
        ``out[: stop - start]`` (a reused ``(>= stop - start, d)`` C-contiguous buffer) or a new
        array.

        Raises:
            ValueError: a range outside the file, or an ``out`` of the wrong shape or dtype.
        """
        n, d = self.shape
        if not 0 <= start <= stop <= n:
            raise ValueError(f"{self.path}: rows {start}..{stop} outside 0..{n}")
        if out is None:
            out = np.empty((stop - start, d), self.dtype)
        if out.dtype != self.dtype or out.ndim != 2 or out.shape[1] != d:
            raise ValueError(f"read buffer {out.dtype} {out.shape} does not hold rows of ({d},)")
        if out.shape[0] < stop - start or not out.flags.c_contiguous:
            raise ValueError(f"read buffer {out.shape} holds fewer than {stop - start} rows")
        block = out[: stop - start]
        if block.size:
            self._pread(block, start)
        return block

    def gather(self, ids: I64) -> Vecs:
        """``(len(ids), d)`` rows ``ids`` (any order, repeats allowed), each distinct row read
        once; consecutive ids are read by one ``pread``.

        Raises:
            IndexError: an id outside ``[0, n)``.
        """
        ids = np.asarray(ids, dtype=np.int64).ravel()
        n, d = self.shape
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise IndexError(f"{self.path}: row ids must lie in [0, {n})")
        uniq, inverse = np.unique(ids, return_inverse=True)
        rows = np.empty((uniq.size, d), self.dtype)
        if uniq.size == 0:
            return rows
        # runs of consecutive ids: [first, last] positions in uniq
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        starts = np.concatenate([[0], breaks]).astype(np.int64)
        stops = np.concatenate([breaks, [uniq.size]]).astype(np.int64)
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            self._pread(rows[a:b], int(uniq[a]))
        return rows if uniq.size == ids.size and (np.diff(ids) > 0).all() else rows[inverse]


_LIBC: ctypes.CDLL | None = None


def release_pages(passages: object, start: int, stop: int) -> bool:
    """Drop rows ``[start, stop)`` of a read-only ``np.memmap`` from this process's resident set.

    Pages of a file mapping stay resident (and counted in RSS) after they were read; this
    ``madvise(MADV_DONTNEED)``s the whole pages of the range so that streaming a corpus keeps RSS
    bounded by the chunk size. Safe only for read-only file mappings (the page cache keeps the
    data; a later read faults it back in): anything else is left alone.

    Returns:
        True when pages were released.
    """
    global _LIBC
    if not (isinstance(passages, np.memmap) and passages.mode == "r" and sys.platform == "linux"):
        return False
    if not passages.flags.c_contiguous or stop <= start:
        return False
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    row = passages.strides[0]
    page = mmap.PAGESIZE
    lo = passages.ctypes.data + start * row
    hi = passages.ctypes.data + stop * row
    lo = -(-lo // page) * page
    hi = hi // page * page
    if hi <= lo:
        return False
    return _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4) == 0  # MADV_DONTNEED
