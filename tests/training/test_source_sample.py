"""A ``data.sources`` entry read on a seeded sample of the split's queries (``max_queries``,
``sample_seed``): an expensive teacher (a cross-encoder) ranks only those, and a ``labels``
entry with the same sample is its binary-label twin. On the 10-query MS MARCO sample (real
texts) with BM25 as the teacher."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treerank.config import ConfigError
from treerank.search.specs import build_system
from treerank.store import EmbeddingStore
from treerank.tasks.train import ensure_training_sources
from treerank.training.data import (
    SourceSpec,
    build_training_table,
    parse_sources,
    source_rows,
    teacher_array,
)


@pytest.fixture(scope="module")
def store(msmarco_store: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A copy of the MS MARCO sample (teacher sidecars are written into it)."""
    out = tmp_path_factory.mktemp("source-sample") / "validation"
    shutil.copytree(Path(msmarco_store["validation"].path), out)
    return EmbeddingStore.open(out)


def test_source_rows_seeded_sorted_and_shared() -> None:
    spec = SourceSpec(kind="labels", max_queries=4, sample_seed=3)
    rows = source_rows(10, spec)
    expected = np.sort(np.random.default_rng(3).choice(10, size=4, replace=False))
    assert rows is not None
    np.testing.assert_array_equal(rows, expected)
    twin = SourceSpec(kind="teacher", system="bm25", max_queries=4, sample_seed=3)
    np.testing.assert_array_equal(source_rows(10, twin), rows)  # same sample, both kinds
    assert source_rows(10, SourceSpec(kind="labels")) is None
    assert source_rows(4, spec) is None  # not below the split: every query


def test_bad_sample_refused_naming_the_entry() -> None:
    with pytest.raises(ConfigError, match=r"data.sources\[0\].*max_queries"):
        parse_sources([{"kind": "labels", "max_queries": 0}])
    with pytest.raises(ConfigError, match="max_queries"):
        parse_sources([{"kind": "pseudo", "max_queries": 5}])


def test_teacher_key_unchanged_without_a_sample() -> None:
    plain = SourceSpec(kind="teacher", system="bm25", k=50)
    # the digest of {"system", "k"} only, as before the sample existed (existing sidecars reused)
    assert (
        teacher_array(plain)
        == "teacher-"
        + __import__("hashlib").sha256(b'{"k": 50, "system": "bm25"}').hexdigest()[:10]
    )
    sampled = SourceSpec(kind="teacher", system="bm25", k=50, max_queries=4)
    assert teacher_array(sampled) != teacher_array(plain)
    other_seed = SourceSpec(kind="teacher", system="bm25", k=50, max_queries=4, sample_seed=1)
    assert teacher_array(other_seed) != teacher_array(sampled)


def test_sampled_teacher_ranks_only_its_queries(store: Any) -> None:
    raw = [
        {"kind": "labels", "max_queries": 4, "sample_seed": 0},
        {"kind": "teacher", "system": "bm25", "k": 5, "mode": "soft", "max_queries": 4},
    ]
    data = type("Data", (), {"sources": raw})()
    ensure_training_sources(store, data, progress=False)
    specs = parse_sources(raw)
    rows = source_rows(int(store.n_queries), specs[1])
    assert rows is not None and rows.size == 4
    stem = teacher_array(specs[1])
    ids, scores = store.load_array(f"{stem}-ids"), store.load_array(f"{stem}-scores")
    others = np.setdiff1d(np.arange(store.n_queries), rows)
    assert (ids[others] == -1).all() and np.isnan(scores[others]).all()
    # the sampled rows hold BM25's own top 5 of those queries, as a run over all would
    full = build_system("bm25").retrieve(store, 5)
    np.testing.assert_array_equal(ids[rows], full.ids[rows])
    np.testing.assert_allclose(scores[rows], full.scores[rows], rtol=0, atol=1e-6)
    table = build_training_table(store, specs)
    labels, teacher = table.sources
    assert set(labels.query_rows.tolist()) <= set(rows.tolist())
    np.testing.assert_array_equal(np.unique(teacher.query_rows), rows)
    assert table.info["0:labels"]["sampled_queries"] == 4
    # a holdout removes its rows from the sample too
    held_out = rows[:1]
    kept = np.setdiff1d(np.arange(store.n_queries), held_out)
    sub = build_training_table(store, specs, kept)
    assert held_out[0] not in sub.sources[1].query_rows
    assert held_out[0] not in sub.sources[0].query_rows
