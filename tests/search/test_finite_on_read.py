"""Vectors are checked where they are read in bulk (issue 36): a ``passages.bin`` that got a NaN
row after ``embed`` (its ``meta.json`` still records every vector finite) is refused by every
system that reads passage vectors, naming the store file and the row, never ranked silently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.kernels.topk import NonFiniteVectorError, finite_record
from treerank.search.specs import build_system
from treerank.store import EmbeddingStore

BAD_ROW = 0  # "the dog barked loudly at night": BM25 retrieves it for "dogs bark loudly"

SYSTEMS = [
    "cosine",
    "faiss:flat",
    "faiss:hnsw",
    "faiss:int8",
    "faiss:binary",
    "faiss:fp16",
    "faiss:ivfflat:nlist=2",
    "faiss:hnsw:rescore=4",
    "rescore:bm25:depth=8",
    "rescore:faiss:int8:depth=8",
]


def _corrupted_after_embed(root: Path) -> EmbeddingStore:
    store = write_tiny_store(root)
    meta = json.loads((root / "meta.json").read_text())
    meta.update(finite_record(np.asarray(store.queries), np.asarray(store.passages)))
    assert meta["finite"] is True  # what embed recorded
    (root / "meta.json").write_text(json.dumps(meta))
    mm = np.memmap(root / "passages.bin", dtype="<f4", mode="r+", shape=(store.n_passages, 16))
    mm[BAD_ROW, 5] = np.nan  # the damage comes later, in place
    mm.flush()
    del mm
    return EmbeddingStore.open(root)


@pytest.mark.parametrize("spec", SYSTEMS)
def test_a_nan_row_written_after_embed_is_refused_by_every_system(spec: str, tmp_path) -> None:
    store = _corrupted_after_embed(tmp_path / "s")
    assert store.meta["finite"] is True  # the record says finite: it is not trusted
    system = build_system(spec)
    where = f"{tmp_path / 's'}" + ("/passages.bin" if "faiss" in spec else "")
    with pytest.raises(NonFiniteVectorError) as err:
        system.retrieve(store, 4)
    assert str(err.value).startswith(f"{where}: passage row {BAD_ROW} holds a non-finite value")
    assert not list((tmp_path / "s").glob("indexes/*/index.faiss"))  # no index was cached


def test_a_finite_store_still_builds_and_ranks(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "ok")
    for spec in ("faiss:flat", "faiss:int8", "cosine"):
        run = build_system(spec).retrieve(store, 2)
        assert run.ids[:, 0].tolist() == [1, 0, 2, 3], spec  # each query's nearest passage
