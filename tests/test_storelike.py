"""Store protocols: every kind of store split the library passes around offers the whole
`StoreLike`; the validation split offers `Vectors` only."""

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


def test_a_store_offers_every_narrow_protocol(tmp_path) -> None:
    from treerank.storelike import Arrays, Judgments, Split, Texts, Vectors

    store = write_tiny_store(tmp_path / "test")
    for proto in (Split, Vectors, Judgments, Texts, Arrays):
        assert isinstance(store, proto), proto.__name__


def test_the_validation_split_is_vectors_only(tmp_path) -> None:
    """``pipeline.training._Split`` (a family's own retrieval during validation) is a real
    :class:`Vectors`, and no more: it has no judgments or texts to offer."""
    from treerank.storelike import Judgments, Texts, Vectors
    from treerank.tasks.train import _Split

    q, p = np.zeros((2, 3), np.float32), np.ones((5, 3), np.float32)
    split = _Split(tmp_path, q, p)
    assert isinstance(split, Vectors)
    assert not isinstance(split, Judgments) and not isinstance(split, Texts)
    assert (split.n_queries, split.n_passages, split.dim) == (2, 5, 3)
    blocks = list(split.iter_passage_chunks(2))
    assert [s for s, _ in blocks] == [0, 2, 4] and blocks[-1][1].shape == (1, 3)
