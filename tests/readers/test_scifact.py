"""SciFact export -> BEIR's splits exactly (counts, qrels identical to the bundled BEIR qrels)."""

from __future__ import annotations

import csv
import gzip
import io
import zipfile

import numpy as np
import pytest

from treerank.readers.errors import DataFormatError
from treerank.readers.scifact import parse_sentence_array, read_scifact
from treerank.readers.trec import read_trec_qrels


def _pairs(split) -> set[tuple[str, str]]:
    out = set()
    for i, row in enumerate(split.candidates):
        for pid in row[row >= 0]:
            out.add((split.query_ids[i], split.passage_ids[pid]))
    return out


def test_parse_sentence_array_hand_fixture():
    cell = "['First one.'\n 'It\\'s \"quoted\".'\n \"Don't stop\" 'x\\ny']"
    assert parse_sentence_array(cell) == ["First one.", 'It\'s "quoted".', "Don't stop", "x\ny"]
    assert parse_sentence_array("[]") == []
    with pytest.raises(ValueError):
        parse_sentence_array("['a' junk 'b']")


def test_test_split_equals_beir_qrels(scifact_zip):
    s = read_scifact(scifact_zip, "test")
    assert (s.n_queries, s.n_passages) == (300, 5183)
    assert int((s.candidates >= 0).sum()) == 339
    qrels_path = scifact_zip.parent / "qrels.beir-v1.0.0-scifact.test.txt"
    beir = {(q, d) for q, d, g in read_trec_qrels(qrels_path) if g > 0}
    assert len(beir) == 339
    assert _pairs(s) == beir
    assert set(np.unique(s.labels[s.candidates >= 0])) == {1}
    assert s.relevance_threshold == 1


def test_test_query_texts_equal_beir_topics(scifact_zip):
    s = read_scifact(scifact_zip, "test")
    path = scifact_zip.parent / "topics.beir-v1.0.0-scifact.test.tsv.gz"
    topics = dict(
        line.split("\t", 1) for line in gzip.open(path, "rt", encoding="utf-8").read().splitlines()
    )
    assert dict(zip(s.query_ids, s.query_texts, strict=True)) == topics


def test_train_split_counts(scifact_zip):
    s = read_scifact(scifact_zip, "train")
    assert (s.n_queries, s.n_passages) == (809, 5183)
    assert int((s.candidates >= 0).sum()) == 919
    assert len(set(s.query_ids)) == 809


def test_passage_text_is_title_space_sentences(scifact_zip):
    s = read_scifact(scifact_zip, "test")
    with zipfile.ZipFile(scifact_zip) as zf:
        rows = list(csv.DictReader(io.StringIO(zf.read("corpus_train.csv").decode("utf-8"))))
    assert s.passage_ids == [r["doc_id"] for r in rows]
    first = rows[0]
    assert s.passage_texts[0].startswith(first["title"] + " Alterations of the architecture")
    # sentence boundaries inside the repr are joined by exactly one space
    assert "(1.4 +/- 0.24 versus 1.15 +/- 0.09 microm2/ms, p = 0.016)" in s.passage_texts[0]
    assert len(set(s.passage_texts)) == 5183


def test_unknown_split_and_missing_file(tmp_path, scifact_zip):
    with pytest.raises(DataFormatError, match="unknown SciFact split"):
        read_scifact(scifact_zip, "dev")
    with pytest.raises(DataFormatError, match="not found"):
        read_scifact(tmp_path / "nope.zip", "test")
