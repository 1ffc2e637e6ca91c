"""StoreLike: every kind of store split the library passes around offers the whole protocol."""

from __future__ import annotations

import numpy as np

from tests.search.tiny_store import write_tiny_store
from treerank.search.query import QueryView
from treerank.store.view import QuerySubset
from treerank.storelike import StoreLike


def test_stores_views_and_query_views_are_store_like(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    subset = QuerySubset(store, np.array([1, 0]))
    view = QueryView(store, np.asarray(store.queries[:1]), ["a new query"])
    for st in (store, subset, view):
        assert isinstance(st, StoreLike), type(st).__name__
    assert subset.n_passages == store.n_passages and subset.n_queries == 2
    assert view.path == store.path and view.encoder_fingerprint == store.encoder_fingerprint


def test_an_incomplete_stand_in_is_not_store_like() -> None:
    class VectorsOnly:
        queries = np.zeros((1, 2), np.float32)
        passages = np.zeros((3, 2), np.float32)

    assert not isinstance(VectorsOnly(), StoreLike)
