"""Opening stores: Go-tool stores given the dimension, size/row-count errors, sidecar arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treerank.store import EmbeddingStore, IncompleteStoreError, StoreFormatError


def _go_store(root, nq=3, npas=5, dim=3840, k=10):
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    q = rng.standard_normal((nq, dim), dtype=np.float32)
    p = rng.standard_normal((npas, dim), dtype=np.float32)
    cand = np.full((nq, k), -1, dtype="<i4")
    cand[:, :3] = [[0, 1, 2], [2, 3, 4], [4, 0, 1]]
    sel = np.zeros((nq, k), dtype=np.uint8)
    sel[:, 0] = 1
    q.astype("<f4").tofile(root / "queries.bin")
    p.astype("<f4").tofile(root / "passages.bin")
    cand.tofile(root / "queries_passage_ids.bin")
    sel.tofile(root / "queries_is_selected.bin")
    return q, p, cand, sel


def test_go_tool_store_opens_with_dim(tmp_path):
    q, p, cand, sel = _go_store(tmp_path / "validation")
    with pytest.raises(StoreFormatError, match=r"meta\.json: file not found.*dim=3840"):
        EmbeddingStore.open(tmp_path / "validation")
    s = EmbeddingStore.open(tmp_path / "validation", dim=3840)
    assert (s.n_queries, s.n_passages, s.dim, s.k) == (3, 5, 3840, 10)
    assert isinstance(s.passages, np.memmap)
    np.testing.assert_array_equal(s.queries[1], q[1])
    np.testing.assert_array_equal(s.passages[4], p[4])
    np.testing.assert_array_equal(s.candidates, cand)
    np.testing.assert_array_equal(s.labels, sel)
    assert s.encoder_fingerprint is None and not s.normalized and s.relevance_threshold == 1
    assert [(a, b.shape[0]) for a, b in s.iter_passage_chunks(2)] == [(0, 2), (2, 2), (4, 1)]


def test_sizes_and_row_counts_are_checked(tmp_path):
    root = tmp_path / "s"
    _go_store(root)
    with open(root / "passages.bin", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(StoreFormatError, match=r"passages\.bin: size .* not a whole number"):
        EmbeddingStore.open(root, dim=3840)
    _go_store(root)
    with open(root / "queries_is_selected.bin", "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(StoreFormatError, match=r"queries_is_selected\.bin: 40 labels, expected 3"):
        EmbeddingStore.open(root, dim=3840)
    _go_store(root)
    np.full(31, 0, dtype="<i4").tofile(root / "queries_passage_ids.bin")
    with pytest.raises(StoreFormatError, match=r"queries_passage_ids\.bin: 31 ids is not a whole"):
        EmbeddingStore.open(root, dim=3840)
    _go_store(root)
    np.full(30, 7, dtype="<i4").tofile(root / "queries_passage_ids.bin")
    with pytest.raises(
        StoreFormatError, match=r"queries_passage_ids\.bin: passage id out of range"
    ):
        EmbeddingStore.open(root, dim=3840)
    with pytest.raises(StoreFormatError, match="not found"):
        EmbeddingStore.open(tmp_path / "missing")


def test_incomplete_store_is_never_taken_for_finished(tmp_path):
    root = tmp_path / "s"
    _go_store(root)
    (root / "progress.json").write_text("{}")
    with pytest.raises(IncompleteStoreError, match="--resume"):
        EmbeddingStore.open(root, dim=3840)
    (root / "meta.json").write_text(json.dumps({"complete": False, "dim": 3840, "k": 10}))
    with pytest.raises(IncompleteStoreError):
        EmbeddingStore.open(root)


def test_sidecar_arrays(msmarco_store):
    s = msmarco_store["validation"]
    neg = np.arange(12, dtype=np.int32).reshape(3, 4)
    name = "test_sidecar_tmp"
    try:
        s.save_array(name, neg, {"kind": "hard negatives", "k": 4})
        assert s.has_array(name)
        np.testing.assert_array_equal(s.load_array(name), neg)
        assert s.load_array_meta(name) == {"kind": "hard negatives", "k": 4}
        assert s.load_array("absent") is None and not s.has_array("absent")
        with pytest.raises(ValueError):
            s.save_array("../escape", neg)
    finally:
        for suffix in (".npy", ".json"):
            (s.path / "arrays" / f"{name}{suffix}").unlink(missing_ok=True)


def test_text_tables_keep_unicode_line_separators(tmp_path) -> None:
    """A passage containing U+0085 / U+2028 (DL19 mojibake) must round-trip as one row."""
    from tests.search.tiny_store import PASSAGES, write_tiny_store
    from treerank.readers.split import RetrievalSplit
    from treerank.store import EmbeddingStore
    from treerank.store.embed import _write_tables

    store = write_tiny_store(tmp_path)
    texts = ["a\u0085b"] + ["c\u2028d"] + PASSAGES[2:]
    split = RetrievalSplit(
        name="test",
        source="unit",
        query_ids=[f"q{i}" for i in range(store.n_queries)],
        query_texts=["what\u2028is"] + store.query_texts()[1:],
        passage_ids=[f"p{i}" for i in range(store.n_passages)],
        passage_texts=texts,
        candidates=np.asarray(store.candidates).copy(),
        labels=np.asarray(store.labels).copy(),
    )
    _write_tables(split, tmp_path)
    reopened = EmbeddingStore.open(tmp_path)
    assert reopened.passage_texts() == texts
    assert reopened.query_texts()[0] == "what\u2028is"


def test_store_root_error_names_the_splits(tmp_path) -> None:
    import pytest

    from tests.search.tiny_store import write_tiny_store
    from treerank.store import EmbeddingStore, StoreFormatError

    write_tiny_store(tmp_path / "train")
    write_tiny_store(tmp_path / "test")
    with pytest.raises(StoreFormatError, match=r"store root holding the split\(s\) test, train"):
        EmbeddingStore.open(tmp_path)


def test_store_root_error_labels_a_pseudo_split(tmp_path) -> None:
    """A training-data pseudo split beside the real ones is not offered as a split."""
    import json

    import pytest

    from tests.search.tiny_store import write_tiny_store
    from treerank.store import EmbeddingStore, StoreFormatError

    write_tiny_store(tmp_path / "train")
    write_tiny_store(tmp_path / "test")
    write_tiny_store(tmp_path / "pseudo-19e292a124")
    meta_path = tmp_path / "pseudo-19e292a124" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "source": "pseudo", "split": "pseudo"}))
    with pytest.raises(StoreFormatError) as info:
        EmbeddingStore.open(tmp_path)
    msg = str(info.value)
    assert "holding the split(s) test, train (beside them pseudo-19e292a124: pseudo-queries " in msg
    assert f"(e.g. {tmp_path / 'test'})" in msg  # the test split is suggested, not train


def test_store_root_advice_offers_only_what_the_caller_has(tmp_path) -> None:
    """Issue 22: the library message advises a split directory (the test split, never train),
    not a command-line option; a command with ``--split`` adds it; training on a root without
    ``train/`` names the missing split and suggests no other."""
    import pytest

    from tests.search.tiny_store import write_tiny_store
    from treerank.store import EmbeddingStore, StoreRootError
    from treerank.tasks.train import open_train_store

    write_tiny_store(tmp_path / "test")
    write_tiny_store(tmp_path / "train")
    with pytest.raises(StoreRootError) as err:
        EmbeddingStore.open(tmp_path)
    assert "--split" not in str(err.value)
    assert str(err.value).endswith(f"open one split directory (e.g. {tmp_path / 'test'})")
    assert err.value.advice("--split").endswith(", or pass --split test")
    import shutil

    shutil.rmtree(tmp_path / "train")
    with pytest.raises(StoreRootError, match=r"without a 'train' split \(it holds test\)") as err:
        open_train_store(tmp_path, "train")
    assert "--split train" in str(err.value) and str(tmp_path / "test") not in str(err.value)
