"""embed_split: round trip on real data, resume byte-identical after an interrupt, reuse, errors."""

from __future__ import annotations

import filecmp
import json

import numpy as np
import pytest

from treerank.encoders import SentenceEncoder
from treerank.readers import read_split
from treerank.readers.msmarco import read_msmarco
from treerank.store import (
    EmbeddingStore,
    IncompleteStoreError,
    StoreExistsError,
    StoreFormatError,
    embed_split,
)

COMPARED = [
    "queries.bin",
    "passages.bin",
    "query_indices.bin",
    "query_is_selected.bin",
    "queries.jsonl",
    "passages.jsonl",
    "passage_aliases.tsv",
]


@pytest.fixture(scope="module")
def small_encoder():
    """The default model with a tiny token budget: many batches on little text."""
    return SentenceEncoder(token_budget=400, max_batch_size=4)


@pytest.fixture(scope="module")
def small_split(msmarco_parquet):
    return read_msmarco(msmarco_parquet, "validation", limit=2)


def _reencode_check(store: EmbeddingStore, encoder, n=20, seed=0):
    rng = np.random.default_rng(seed)
    pids = rng.choice(store.n_passages, size=min(n, store.n_passages), replace=False)
    texts = store.passage_texts()
    fresh = encoder.encode_passages([texts[i] for i in pids])
    cos = (fresh * np.asarray(store.passages[pids])).sum(1)
    assert np.all(cos > 0.9999), cos.min()
    qids = rng.choice(store.n_queries, size=min(n, store.n_queries), replace=False)
    qtexts = store.query_texts()
    fresh_q = encoder.encode_queries([qtexts[i] for i in qids])
    assert np.all((fresh_q * np.asarray(store.queries[qids])).sum(1) > 0.9999)


def _same_tables(store: EmbeddingStore, split):
    np.testing.assert_array_equal(store.candidates, split.candidates)
    np.testing.assert_array_equal(store.labels, split.labels)
    assert store.query_ids() == split.query_ids and store.query_texts() == split.query_texts
    assert store.passage_ids() == split.passage_ids
    assert store.passage_texts() == split.passage_texts
    assert store.passage_aliases() == split.passage_aliases


def test_scifact_round_trip(scifact_store, encoder, scifact_zip):
    from treerank.readers.scifact import read_scifact

    for name in ("train", "test"):
        st = scifact_store[name]
        assert st.meta["source"] == "scifact" and st.normalized and st.dim == 384
        assert st.encoder_fingerprint == encoder.fingerprint
        _same_tables(st, read_scifact(scifact_zip, name))
        _reencode_check(st, encoder, seed=len(name))
    # the test split reused train's passage vectors (same corpus, same encoder)
    np.testing.assert_array_equal(scifact_store["train"].passages, scifact_store["test"].passages)


def test_msmarco_round_trip(msmarco_store, encoder, msmarco_parquet):
    st = msmarco_store["validation"]
    _same_tables(st, read_msmarco(msmarco_parquet, "validation"))
    assert st.query_types() is not None and st.k == 10
    _reencode_check(st, encoder, seed=3)


def test_dl19_round_trip(dl19_store, encoder, dl19_dir):
    from tests.conftest import DL19_TEST_MAX_PASSAGES, DL19_TEST_TOPICS

    st = dl19_store["test"]
    _same_tables(
        st, read_split(dl19_dir, "trec-dl", "test", DL19_TEST_TOPICS, DL19_TEST_MAX_PASSAGES)
    )
    assert st.relevance_threshold == 2
    _reencode_check(st, encoder, seed=4)


def test_resume_is_byte_identical(tmp_path, small_split, small_encoder):
    full, part = tmp_path / "full", tmp_path / "part"
    stats = embed_split(small_split, small_encoder, full, progress=False, reuse=False)
    assert stats.passage_batches > 4
    with pytest.raises(KeyboardInterrupt):
        embed_split(
            small_split, small_encoder, part, progress=False, stop_after_batches=3, reuse=False
        )
    with pytest.raises(IncompleteStoreError):
        EmbeddingStore.open(part)
    progress = json.loads((part / "progress.json").read_text())
    assert progress["query_batches_done"] + progress["passage_batches_done"] == 3
    with pytest.raises(StoreExistsError, match="--resume"):
        embed_split(small_split, small_encoder, part, progress=False)
    resumed = embed_split(
        small_split, small_encoder, part, progress=False, resume=True, reuse=False
    )
    assert resumed.resumed
    assert resumed.passage_batches == stats.passage_batches
    assert resumed.passage_real_tokens == stats.passage_real_tokens
    for name in COMPARED:
        assert filecmp.cmp(full / name, part / name, shallow=False), name
    assert not (part / "progress.json").exists()
    a = json.loads((full / "meta.json").read_text())
    b = json.loads((part / "meta.json").read_text())
    for m in (a, b):
        m.pop("stats"), m.pop("created_unix")
    assert a == b


def test_resume_with_other_settings_overwrites_nothing(tmp_path, small_split, small_encoder):
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        embed_split(small_split, small_encoder, out, progress=False, stop_after_batches=2)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    other = SentenceEncoder(token_budget=800, max_batch_size=4)
    with pytest.raises(StoreExistsError, match="nothing was overwritten"):
        embed_split(small_split, other, out, progress=False, resume=True)
    with pytest.raises(StoreExistsError):
        embed_split(
            read_msmarco_limit(small_split, 1), small_encoder, out, progress=False, resume=True
        )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    (out / "passages.bin").write_bytes(b"\0" * 12)
    with pytest.raises(Exception, match=r"passages\.bin: 12 bytes"):
        embed_split(small_split, small_encoder, out, progress=False, resume=True)


def read_msmarco_limit(split, n):
    from treerank.readers.subset import subset_split

    return subset_split(split, limit=n)


def test_finished_store_is_not_overwritten(tmp_path, small_split, small_encoder):
    out = tmp_path / "s"
    embed_split(small_split, small_encoder, out, progress=False)
    meta = (out / "meta.json").read_bytes()
    with pytest.raises(StoreExistsError, match="--overwrite"):
        embed_split(small_split, small_encoder, out, progress=False)
    # resume on a finished store with the same signature is a no-op
    embed_split(small_split, small_encoder, out, progress=False, resume=True)
    assert (out / "meta.json").read_bytes() == meta


def test_reuse_from_sibling_split(tmp_path, small_split, small_encoder):
    from treerank.readers.subset import subset_split

    root = tmp_path / "root"
    embed_split(small_split, small_encoder, root / "a", progress=False)
    one = subset_split(small_split, limit=1)
    one.name = "b"
    stats = embed_split(one, small_encoder, root / "b", progress=False)
    assert stats.n_reused_passages == one.n_passages and stats.passage_batches == 0
    a, b = EmbeddingStore.open(root / "a"), EmbeddingStore.open(root / "b")
    texts_a = a.passage_texts()
    rows = [texts_a.index(t) for t in b.passage_texts()]
    np.testing.assert_array_equal(np.asarray(a.passages)[rows], b.passages)
    assert b.meta["stats"]["n_reused_passages"] == one.n_passages
    # a finished store made with reuse: --resume is a no-op even though siblings changed
    again = embed_split(one, small_encoder, root / "b", progress=False, resume=True)
    assert again.n_reused_passages == one.n_passages
    fresh = embed_split(one, small_encoder, tmp_path / "alone" / "b", progress=False, reuse=False)
    assert fresh.n_reused_passages == 0
    c = EmbeddingStore.open(tmp_path / "alone" / "b")
    assert np.all((np.asarray(c.passages) * np.asarray(b.passages)).sum(1) > 0.9999)


def test_cranfield_round_trip(tmp_path, encoder, shared_data):
    """Cranfield (SMART tarball): 20 queries, their judged documents + others up to 300."""
    split = read_split(shared_data / "cranfield" / "cran.tar.gz", "cranfield", None, 20, 300)
    embed_split(split, encoder, tmp_path / "test", progress=False)
    st = EmbeddingStore.open(tmp_path / "test")
    assert st.meta["source"] == "cranfield" and st.n_passages == 300 and st.n_queries == 20
    _same_tables(st, split)
    _reencode_check(st, encoder, seed=5)


def test_truncation_is_counted(tmp_path, small_split):
    # issue 10, item 11: passages longer than the encoder's max sequence length were cut silently
    enc = SentenceEncoder(max_seq_length=48)
    stats = embed_split(small_split, enc, tmp_path / "s", progress=False, reuse=False)
    tok = enc.model.tokenizer
    full = [len(ids) for ids in tok(small_split.passage_texts, verbose=False)["input_ids"]]
    cut = [n - 48 for n in full if n > 48]
    assert 0 < len(cut) < small_split.n_passages
    assert (stats.n_truncated_passages, stats.truncated_passage_tokens) == (len(cut), sum(cut))
    assert stats.n_truncated_queries == 0  # MS MARCO questions are short
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["stats"]["n_truncated_passages"] == len(cut)
    assert meta["stats"]["truncated_passage_tokens"] == sum(cut)
    rows = {what: total for what, total, _ in stats.rows()}
    assert rows["passages truncated"] == len(cut) and rows["tokens cut by truncation"] == sum(cut)


def test_source_qrels_added_to_an_older_store(tmp_path, encoder, shared_data):
    # a store embedded before stores kept qrels.tsv gets it without re-embedding
    from treerank.metrics.qrels import Qrels
    from treerank.readers.subset import subset_split
    from treerank.store import add_source_qrels

    full = read_split(shared_data / "msmarco-trec-dl19", "trec-dl", "test")
    split = subset_split(full, 2, 60)
    assert split.qrels is not None
    dest = tmp_path / "test"
    embed_split(split, encoder, dest, progress=False)
    (dest / "qrels.tsv").unlink()  # as written before
    before = Qrels.from_store(EmbeddingStore.open(dest))
    assert before.doc_ids is None and before.n_relevant().sum() < sum(
        1 for _, _, g in split.qrels if g >= 2
    )
    vectors = (dest / "passages.bin").read_bytes()
    add_source_qrels(split, dest)
    st = EmbeddingStore.open(dest)
    assert st.source_qrels() == split.qrels and (dest / "passages.bin").read_bytes() == vectors
    after = Qrels.from_store(st)
    assert after.n_relevant().sum() == sum(1 for _, _, g in split.qrels if g >= 2)
    other = subset_split(full, 3, 60)
    with pytest.raises(StoreFormatError, match="not embedded from this split"):
        add_source_qrels(other, dest)


def test_finiteness_is_recorded_when_vectors_are_written(tmp_path, small_split, small_encoder):
    ok = embed_split(small_split, small_encoder, tmp_path / "ok", progress=False, reuse=False)
    assert ok.n_passages > 0
    meta = json.loads((tmp_path / "ok" / "meta.json").read_text())
    assert meta["finite"] is True
    assert meta["non_finite_rows"] == {"queries": 0, "passages": 0}
    poisoned: list[int] = []

    def source(kind, b_i, idx):  # the encoder's batch, one passage row NaN (a diverged model)
        res = small_encoder.encode_batch([small_split_texts(kind)[i] for i in idx], kind)
        if kind == "passage" and b_i == 1:
            res.vectors[0, 5] = np.nan
            poisoned.append(int(idx[0]))
        return res

    def small_split_texts(kind):
        return small_split.query_texts if kind == "query" else small_split.passage_texts

    embed_split(
        small_split,
        small_encoder,
        tmp_path / "bad",
        progress=False,
        reuse=False,
        batch_source=source,
    )
    meta = json.loads((tmp_path / "bad" / "meta.json").read_text())
    assert meta["finite"] is False
    assert meta["non_finite_rows"] == {"queries": 0, "passages": 1}
    assert meta["first_non_finite_row"] == {"queries": None, "passages": poisoned[0]}
