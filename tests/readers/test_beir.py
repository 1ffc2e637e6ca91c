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


def _beir(root, corpus: list[dict], queries: list[dict], qrels: str):
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return root


def test_repeated_ids_are_rejected_naming_both_lines(tmp_path):
    # issue 10, item 2: a repeated corpus _id (different texts) used to be kept twice, and a
    # repeated query _id silently folded two questions into one
    corpus = [{"_id": "d1", "text": "alpha"}, {"_id": "d2", "text": "beta"}]
    queries = [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": "b"}]
    root = _beir(
        tmp_path / "dup-doc", [*corpus, {"_id": "d1", "text": "gamma"}], queries, "q1\td1\t1\n"
    )
    with pytest.raises(
        DataFormatError, match=r"corpus\.jsonl, row 3: document id 'd1' repeated \(rows 1 and 3\)"
    ):
        read_beir(root, "test")
    root = _beir(tmp_path / "dup-q", corpus, [*queries, {"_id": "q1", "text": "c"}], "q1\td1\t1\n")
    with pytest.raises(
        DataFormatError, match=r"queries\.jsonl, row 3: query id 'q1' repeated \(rows 1 and 3\)"
    ):
        read_beir(root, "test")
    ok = read_beir(_beir(tmp_path / "ok", corpus, queries, "q1\td1\t1\nq2\td2\t1\n"), "test")
    assert ok.query_ids == ["q1", "q2"] and ok.passage_ids == ["d1", "d2"]


def test_tsv_qrels_split_on_tabs_only(tmp_path):
    # issue 10, item 5: "q1<TAB>doc 1<TAB>1" was split on white space and judged document "1"
    corpus = [{"_id": "1", "text": "one"}, {"_id": "doc1", "text": "two"}]
    queries = [{"_id": "q1", "text": "a"}]
    root = _beir(tmp_path / "space", corpus, queries, "q1\tdoc 1\t1\n")
    with pytest.raises(
        DataFormatError, match=r"test\.tsv, row 2: document id 'doc 1' is empty or contains white"
    ):
        read_beir(root, "test")
    root = _beir(tmp_path / "ok", corpus, queries, "q1\tdoc1 \t1\n")  # padding around a tab is fine
    s = read_beir(root, "test")
    assert s.qrels == [("q1", "doc1", 1)] and s.candidates.tolist() == [[1]]
    corpus_space = [{"_id": "doc 1", "text": "one"}]
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl, row 1: document id 'doc 1'"):
        read_beir(_beir(tmp_path / "c", corpus_space, queries, "q1\tdoc1\t1\n"), "test")


def test_judged_ids_absent_from_corpus_stay_in_the_source_qrels(tmp_path):
    corpus = [{"_id": "d1", "text": "alpha"}, {"_id": "d2", "text": "alpha"}]  # same text
    queries = [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": "b"}]
    s = read_beir(_beir(tmp_path / "x", corpus, queries, "q1\td2\t1\nq2\tgone\t2\n"), "test")
    assert s.passage_ids == ["d1"] and s.passage_aliases == {"d1": 0, "d2": 0}
    assert s.qrels == [("q1", "d2", 1), ("q2", "gone", 2)]
    assert s.candidates.tolist() == [[0], [-1]]  # q2 kept: scored 0, as by trec_eval
    assert s.meta["n_judgments_on_missing_passages"] == 1


def test_documents_without_text_are_kept_as_their_title_with_a_warning(tmp_path):
    corpus = [
        {"_id": "d1", "title": "Alpha", "text": "alpha body"},
        {"_id": "d2", "title": "Beta"},
        {"_id": "d3", "title": "Gamma", "text": "gamma body"},
        {"_id": "d4", "title": "Delta"},
    ]
    queries = [{"_id": "q1", "text": "a"}]
    split = read_beir(_beir(tmp_path / "b", corpus, queries, "q1\td1\t1\n"), "test")
    assert split.passage_texts[1] == "Beta"
    (warning,) = [w for w in split.warnings() if 'no "text" field' in w]
    assert warning == (
        f'{tmp_path / "b" / "corpus.jsonl"}: 2 documents have no "text" field and are stored '
        "as their title only (row 2, 4)"
    )
    full = read_beir(_beir(tmp_path / "c", corpus[::2], queries, "q1\td1\t1\n"), "test")
    assert not [w for w in full.warnings() if "text" in w]
