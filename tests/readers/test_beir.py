"""BEIR folder reader: SciFact converted to BEIR's layout reads back as the SciFact split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treerank.readers.beir import read_beir
from treerank.readers.errors import DataFormatError
from treerank.readers.scifact import read_scifact_corpus, read_scifact_qrels


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory, scifact_zip):
    root = tmp_path_factory.mktemp("beir-scifact")
    ids, titles, texts = read_scifact_corpus(scifact_zip)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for d, t, x in zip(ids, titles, texts, strict=True):
            f.write(json.dumps({"_id": d, "title": t, "text": x}) + "\n")
    qids, claims, cited = read_scifact_qrels(scifact_zip, "test")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
        for q, c in reversed(list(zip(qids, claims, strict=True))):  # order comes from qrels
            f.write(json.dumps({"_id": q, "text": c}) + "\n")
    (root / "qrels").mkdir()
    with open(root / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q, docs in zip(qids, cited, strict=True):
            for d in docs:
                f.write(f"{q}\t{d}\t1\n")
    return root


def test_beir_equals_scifact(beir_dir, scifact_zip):
    from treerank.readers.scifact import read_scifact

    ref = read_scifact(scifact_zip, "test")
    s = read_beir(beir_dir, "test")
    assert s.query_ids == ref.query_ids and s.query_texts == ref.query_texts
    assert s.passage_ids == ref.passage_ids and s.passage_texts == ref.passage_texts
    np.testing.assert_array_equal(s.candidates, ref.candidates)
    np.testing.assert_array_equal(s.labels, ref.labels)


def test_beir_errors(beir_dir, tmp_path):
    with pytest.raises(DataFormatError, match=r"qrels/dev\.tsv: file not found"):
        read_beir(beir_dir, "dev")
    bad = tmp_path / "bad"
    (bad / "qrels").mkdir(parents=True)
    (bad / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (bad / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "", "text": "x"}\n{"_id": "d2", "text": \n'
    )
    (bad / "queries.jsonl").write_text('{"_id": "q1", "text": "q"}\n')
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl, row 2: invalid JSON"):
        read_beir(bad, "test")
    (bad / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "x"}\n')
    (bad / "queries.jsonl").write_text('{"_id": "q1", "text": ""}\n')
    with pytest.raises(DataFormatError, match=r"queries\.jsonl, row 1: empty query"):
        read_beir(bad, "test")
