"""Format detection and the `read_split` entry point on every real dataset."""

from __future__ import annotations

import pytest

from treerank.readers import DataFormatError, detect_format, read_split


def test_detect_real(shared_data):
    assert detect_format(shared_data / "beir-scifact") == "scifact"
    assert detect_format(shared_data / "beir-scifact" / "scifact.zip") == "scifact"
    assert detect_format(shared_data / "msmarco-trec-dl19") == "trec-dl"
    assert detect_format(shared_data / "msmarco-qna-v2.1-validation10") == "msmarco"
    p = shared_data / "msmarco-qna-v2.1-validation10" / "ms_marco_v2.1_validation_10.parquet"
    assert detect_format(p) == "msmarco"


def test_unknown_and_missing(tmp_path, shared_data):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataFormatError, match=r"x\.csv: cannot detect"):
        detect_format(tmp_path / "x.csv")
    with pytest.raises(DataFormatError, match="not found"):
        detect_format(tmp_path / "nope")
    with pytest.raises(DataFormatError, match="unknown format 'foo'"):
        read_split(shared_data / "beir-scifact", "foo")


def test_read_split_defaults(shared_data):
    s = read_split(shared_data / "beir-scifact", limit=3, max_passages=10)
    assert s.name == "test" and s.meta["format"] == "scifact" and s.n_queries == 3
    m = read_split(shared_data / "msmarco-qna-v2.1-validation10", limit=2)
    assert m.name == "validation" and m.n_queries == 2 and m.k == 10
