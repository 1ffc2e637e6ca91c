"""TREC topics and qrels parsing on the real DL19 files, plus malformed-line errors."""

from __future__ import annotations

import pytest

from treerank.readers.errors import DataFormatError
from treerank.readers.trec import read_trec_qrels, read_trec_topics


def test_real_topics_and_qrels(dl19_dir):
    topics = read_trec_topics(dl19_dir / "topics.dl19-passage.txt")
    assert len(topics) == 43 and topics[0] == ("156493", "do goldfish grow")
    qrels = read_trec_qrels(dl19_dir / "qrels.dl19-passage.txt")
    assert len(qrels) == 9260 and qrels[0] == ("19335", "1017759", 0)
    assert {g for _, _, g in qrels} == {0, 1, 2, 3}


def test_gz_topics(scifact_zip):
    topics = read_trec_topics(scifact_zip.parent / "topics.beir-v1.0.0-scifact.test.tsv.gz")
    assert len(topics) == 300 and topics[0] == (
        "1",
        "0-dimensional biomaterials show inductive properties.",
    )


def test_errors_name_line(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("1\tok\n2 no tab\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"t\.txt, row 2: expected"):
        read_trec_topics(p)
    p.write_text("1\tok\n2\t  \n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"row 2: empty query"):
        read_trec_topics(p)
    q = tmp_path / "q.txt"
    q.write_text("1 0 d1 1\n1 0 d2 x\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"q\.txt, row 2: grade 'x'"):
        read_trec_qrels(q)
    q.write_bytes(b"1 0 d1 1\n1 0 d\xff 1\n")
    with pytest.raises(DataFormatError, match=r"row 2: invalid UTF-8 byte 0xff"):
        read_trec_qrels(q)


def test_lines_split_only_on_newline() -> None:
    from treerank.readers.errors import split_lines

    # U+0085 (NEL) and U+2028 occur inside real MS MARCO / DL19 passage text
    text = "1\tcaf\u00e9 \u0085 ok\r\n2\tline\u2028sep\n"
    assert split_lines(text) == ["1\tcaf\u00e9 \u0085 ok", "2\tline\u2028sep"]
    assert split_lines("") == []


def test_repeated_judgments(tmp_path):
    # issue 10, item 9: the same (query, doc) judged twice with different grades was folded to
    # the max silently; trec_eval refuses such qrels, so does treerank (an identical repeat is
    # read once)
    q = tmp_path / "q.txt"
    q.write_text("1 0 d1 1\n1 0 d2 0\n1 0 d1 1\n2 0 d1 2\n", encoding="utf-8")
    assert read_trec_qrels(q) == [("1", "d1", 1), ("1", "d2", 0), ("2", "d1", 2)]
    q.write_text("1 0 d1 1\n1 0 d2 0\n1 0 d1 2\n", encoding="utf-8")
    with pytest.raises(
        DataFormatError,
        match=r"q\.txt, row 3: query 1 judges document d1 twice with different grades "
        r"\(1 on line 1, 2 on line 3\)",
    ):
        read_trec_qrels(q)


def test_repeated_topic_names_both_lines(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("1\tone\n2\ttwo\n1\tagain\n", encoding="utf-8")
    with pytest.raises(
        DataFormatError, match=r"t\.txt, row 3: query id '1' repeated \(rows 1 and 3\)"
    ):
        read_trec_topics(p)
