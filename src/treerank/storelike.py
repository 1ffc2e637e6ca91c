"""``StoreLike``: what one store split offers to the layers above the store.

Every function that takes a store split is typed with this protocol, not ``Any``:
:class:`~treerank.store.EmbeddingStore` (the memory-mapped split),
:class:`~treerank.store.view.QuerySubset` (some of its queries, every passage),
:class:`~treerank.search.query.QueryView` (new query texts) and test stand-ins all provide it.
The protocol is structural (``typing.Protocol``): nothing subclasses it, and it is
``runtime_checkable`` so a test can assert that a stand-in is complete.

Members (all read-only):

- vectors: ``queries`` ``float32 (n_queries, dim)``, ``passages`` ``float32 (n_passages, dim)``
  (ndarrays or read-only memmaps; row = id); ``n_queries``, ``n_passages``, ``dim``;
- judgments: ``candidates`` ``int32 (n_queries, K)`` passage ids (``-1`` = padding), ``labels``
  ``uint8 (n_queries, K)`` grades, ``relevance_threshold``; ``source_qrels()`` the source's own
  ``(query id, doc id, grade)`` judgments or None;
- ids and texts: ``query_ids()``, ``passage_ids()`` (source ids by row), ``query_texts()``,
  ``passage_texts()``;
- identity: ``path`` (the split directory, named in messages and caches), ``split``,
  ``encoder_fingerprint`` (binds checkpoints to the encoder);
- arrays: sidecar arrays by name, ``has_array`` / ``load_array`` / ``load_array_meta`` /
  ``save_array``;
- the rest of a split's description: ``k`` (candidates per query), ``encoder_name``,
  ``query_prompt``,
  ``normalized``, ``has_texts``, ``query_types()``, ``passage_aliases()``, ``meta`` (the parsed
  ``meta.json``), ``iter_passage_chunks(chunk_size)``.

It lives in the base layer (it needs numpy only) so that any layer, the metric layer included,
can name it without importing the store package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["StoreLike"]


@runtime_checkable
class StoreLike(Protocol):
    """One store split as the layers above the store read it (see the module docstring)."""

    @property
    def path(self) -> Path: ...

    @property
    def queries(self) -> np.ndarray: ...

    @property
    def passages(self) -> np.ndarray: ...

    @property
    def candidates(self) -> np.ndarray: ...

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def n_queries(self) -> int: ...

    @property
    def n_passages(self) -> int: ...

    @property
    def dim(self) -> int: ...

    @property
    def relevance_threshold(self) -> int: ...

    @property
    def split(self) -> str: ...

    @property
    def encoder_fingerprint(self) -> str | None: ...

    def query_ids(self) -> list[str]: ...

    def passage_ids(self) -> list[str]: ...

    def query_texts(self) -> list[str]: ...

    def passage_texts(self) -> list[str]: ...

    def source_qrels(self) -> list[tuple[str, str, int]] | None: ...

    def has_array(self, name: str) -> bool: ...

    def load_array(self, name: str) -> np.ndarray | None: ...

    def load_array_meta(self, name: str) -> dict[str, Any] | None: ...

    def save_array(self, name: str, arr: np.ndarray, meta: dict[str, Any] | None = None) -> Any: ...

    @property
    def k(self) -> int: ...

    @property
    def encoder_name(self) -> str | None: ...

    @property
    def query_prompt(self) -> str | None: ...

    @property
    def normalized(self) -> bool: ...

    @property
    def has_texts(self) -> bool: ...

    @property
    def meta(self) -> dict[str, Any]: ...

    def query_types(self) -> list[str] | None: ...

    def passage_aliases(self) -> dict[str, int]: ...

    def iter_passage_chunks(self, chunk_size: int = ...) -> Iterator[tuple[int, np.ndarray]]: ...
