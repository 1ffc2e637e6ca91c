"""Store protocols: what one store split offers to the layers above the store.

A function that takes a store split is typed with the narrowest of these protocols that it
reads, never ``Any``:

- :class:`Split` (every protocol below is one): ``path`` (the split directory, named in
  messages and caches), ``meta`` (the parsed ``meta.json``, a JSON object);
- :class:`Vectors`: ``queries``
  ``float32 (n_queries, dim)``, ``passages`` ``float32 (n_passages, dim)`` (ndarrays or
  read-only memmaps; row = id), ``n_queries``, ``n_passages``, ``dim``,
  ``iter_passage_chunks(chunk_size)`` (``(start row, float32 (m, dim))`` blocks);
- :class:`Judgments`: ``n_queries``, ``n_passages``, ``candidates``
  ``int32 (n_queries, K)`` passage ids (``-1`` = padding), ``labels`` ``uint8 (n_queries, K)``
  grades, ``k`` (= K), ``relevance_threshold``, ``query_ids()`` / ``passage_ids()`` (source ids
  by row), ``source_qrels()`` (the source's own ``(query id, doc id, grade)`` judgments or None),
  ``passage_aliases()`` (document ids merged into a passage row: qrels expansion);
- :class:`Texts`: ``has_texts``, ``query_ids()``, ``passage_ids()``,
  ``query_texts()``, ``passage_texts()``, ``query_types()``;
- :class:`Arrays`: sidecar arrays by name, ``has_array`` / ``load_array`` /
  ``load_array_meta`` / ``save_array``;
- :class:`StoreLike`: all of them, plus the split's description: ``split``,
  ``encoder_name``, ``encoder_fingerprint`` (binds checkpoints to the encoder),
  ``query_prompt``, ``normalized``.

:class:`~treerank.store.EmbeddingStore` (the memory-mapped split),
:class:`~treerank.store.view.QuerySubset` (some of its queries, every passage) and
:class:`~treerank.search.query.QueryView` (new query texts) are ``StoreLike``; a validation
split of query and passage vectors (``tasks.train``) is only :class:`Vectors`. The
protocols are structural (``typing.Protocol``): nothing subclasses them, and they are
``runtime_checkable`` so a test can assert that a stand-in is complete.

``meta_object`` / ``meta_text`` read a block or a string of ``meta`` without trusting its shape.

They live in the base layer (they need numpy only) so that any layer, the metric layer
included, can name them without importing the store package.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "Arrays",
    "Judgments",
    "SidecarArray",
    "Split",
    "StoreLike",
    "Texts",
    "Vectors",
    "meta_object",
    "meta_text",
]


SidecarArray = npt.NDArray[
    np.bool_ | np.uint8 | np.int32 | np.int64 | np.float16 | np.float32 | np.float64
]
"""A sidecar array (``arrays/<name>.npy``): its dtype is the writer's (int32 or int64 ids,
float32 scores, ...), so a reader converts it."""


@runtime_checkable
class Split(Protocol):
    """What every protocol here offers: the split's directory and its parsed ``meta.json``."""

    @property
    def path(self) -> Path: ...

    @property
    def meta(self) -> dict[str, object]: ...


@runtime_checkable
class Vectors(Split, Protocol):
    """A split's query and passage vectors (see the module docstring)."""

    @property
    def queries(self) -> npt.NDArray[np.float32]: ...

    @property
    def passages(self) -> npt.NDArray[np.float32]: ...

    @property
    def n_queries(self) -> int: ...

    @property
    def n_passages(self) -> int: ...

    @property
    def dim(self) -> int: ...

    def iter_passage_chunks(
        self, chunk_size: int = ...
    ) -> Iterator[tuple[int, npt.NDArray[np.float32]]]: ...


@runtime_checkable
class Judgments(Split, Protocol):
    """A split's relevance judgments (see the module docstring)."""

    @property
    def n_queries(self) -> int: ...

    @property
    def n_passages(self) -> int: ...

    @property
    def candidates(self) -> npt.NDArray[np.int32]: ...

    @property
    def labels(self) -> npt.NDArray[np.uint8]: ...

    @property
    def k(self) -> int: ...

    @property
    def relevance_threshold(self) -> int: ...

    def query_ids(self) -> list[str]: ...

    def passage_ids(self) -> list[str]: ...

    def source_qrels(self) -> list[tuple[str, str, int]] | None: ...

    def passage_aliases(self) -> dict[str, int]: ...


@runtime_checkable
class Texts(Split, Protocol):
    """A split's source ids and texts (see the module docstring)."""

    @property
    def has_texts(self) -> bool: ...

    def query_ids(self) -> list[str]: ...

    def passage_ids(self) -> list[str]: ...

    def query_texts(self) -> list[str]: ...

    def passage_texts(self) -> list[str]: ...

    def query_types(self) -> list[str] | None: ...


@runtime_checkable
class Arrays(Split, Protocol):
    """A split's sidecar arrays by name (``arrays/<name>.npy`` + ``<name>.json``)."""

    def has_array(self, name: str) -> bool: ...

    def load_array(self, name: str) -> SidecarArray | None: ...

    def load_array_meta(self, name: str) -> dict[str, object] | None: ...

    def save_array(
        self, name: str, arr: SidecarArray, meta: dict[str, object] | None = None
    ) -> Path: ...


@runtime_checkable
class StoreLike(Vectors, Judgments, Texts, Arrays, Protocol):
    """One whole store split as the layers above the store read it (see the module docstring)."""

    @property
    def split(self) -> str: ...

    @property
    def encoder_name(self) -> str | None: ...

    @property
    def encoder_fingerprint(self) -> str | None: ...

    @property
    def query_prompt(self) -> str | None: ...

    @property
    def normalized(self) -> bool: ...


def meta_object(meta: Mapping[str, object], key: str) -> dict[str, object]:
    """``meta[key]`` when it is a JSON object (such as ``meta.json``'s ``encoder`` block), else
    ``{}`` (missing, ``null`` or not an object)."""
    value = meta.get(key)
    return value if isinstance(value, dict) else {}


def meta_text(meta: Mapping[str, object], key: str) -> str | None:
    """``meta[key]`` when it is a string, else None (missing, ``null`` or not a string)."""
    value = meta.get(key)
    return value if isinstance(value, str) else None
