"""MS MARCO v2.1 reader on the real HF parquet sample, shards, JSON/JSONL, dedup and errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from treerank.readers.errors import DataFormatError
from treerank.readers.msmarco import read_msmarco


@pytest.fixture(scope="module")
def rows(msmarco_parquet):
    return pq.read_table(msmarco_parquet).to_pylist()


def test_candidates_and_labels_equal_source(msmarco_parquet, rows):
    s = read_msmarco(msmarco_parquet, "validation")
    assert s.n_queries == 10 and s.k == 10
    assert s.query_ids == [str(r["query_id"]) for r in rows]
    assert s.query_texts == [r["query"] for r in rows]
    assert s.query_types == [r["query_type"] for r in rows]
    for i, r in enumerate(rows):
        texts = r["passages"]["passage_text"]
        sel = r["passages"]["is_selected"]
        for j in range(10):
            if j < len(texts) and texts[j].strip():
                assert s.passage_texts[s.candidates[i, j]] == texts[j]
                assert s.labels[i, j] == sel[j]
            else:
                assert s.candidates[i, j] == -1 and s.labels[i, j] == 0


def _jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def test_dedup_shares_ids_and_empty_slot_skipped(tmp_path, rows):
    a, b = rows[0], rows[1]
    shared_text = a["passages"]["passage_text"][0]
    b2 = json.loads(json.dumps(b))
    b2["passages"]["passage_text"][3] = shared_text  # real MS MARCO repeats passages
    b2["passages"]["passage_text"][5] = ""
    s = read_msmarco(_jsonl(tmp_path / "x.jsonl", [a, b2]), "validation")
    assert s.candidates[1, 3] == s.candidates[0, 0] == 0
    assert s.candidates[1, 5] == -1 and s.labels[1, 5] == 0
    assert s.n_passages == 20 - 2
    assert s.passage_aliases[f"{b2['query_id']}:3"] == 0
    assert s.meta["n_empty_passages_skipped"] == 1


def test_shards_json_and_jsonl_agree_with_parquet(tmp_path, msmarco_parquet, rows):
    ref = read_msmarco(msmarco_parquet, "validation")
    t = pq.read_table(msmarco_parquet)
    d = tmp_path / "shards"
    d.mkdir()
    pq.write_table(t.slice(0, 4), d / "validation-00000-of-00002.parquet")
    pq.write_table(t.slice(4), d / "validation-00001-of-00002.parquet")
    pq.write_table(t.slice(0, 1), d / "train-00000-of-00001.parquet")  # other split: ignored
    (tmp_path / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    for src in (d, _jsonl(tmp_path / "rows.jsonl", rows), tmp_path / "rows.json"):
        s = read_msmarco(src, "validation")
        assert s.query_ids == ref.query_ids and s.passage_texts == ref.passage_texts
        np.testing.assert_array_equal(s.candidates, ref.candidates)
        np.testing.assert_array_equal(s.labels, ref.labels)


def test_limit_reads_first_rows(msmarco_parquet):
    s = read_msmarco(msmarco_parquet, "validation", limit=3)
    assert s.n_queries == 3 and s.n_passages <= 30


def test_errors_name_file_and_row(tmp_path, rows):
    bad = json.loads(json.dumps(rows[:3]))
    bad[2]["query"] = "   "
    with pytest.raises(DataFormatError, match=r"x\.jsonl, row 3: empty query"):
        read_msmarco(_jsonl(tmp_path / "x.jsonl", bad))
    p = tmp_path / "bad.jsonl"
    p.write_bytes(json.dumps(rows[0]).encode() + b"\n" + b'{"query": "caf\xe9"}\n')
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, row 2: invalid UTF-8"):
        read_msmarco(p)
    pq.write_table(pa.table({"query": ["q"]}), tmp_path / "s.parquet")
    with pytest.raises(DataFormatError, match=r"s\.parquet: not the MS MARCO v2.1 schema"):
        read_msmarco(tmp_path / "s.parquet")
    with pytest.raises(DataFormatError, match="not found"):
        read_msmarco(tmp_path / "missing.parquet")


def test_original_column_oriented_json(tmp_path, msmarco_parquet, rows):
    ref = read_msmarco(msmarco_parquet, "validation")
    cols = {c: {} for c in ("query_id", "query", "query_type", "passages")}
    for i, r in enumerate(rows):
        p = r["passages"]
        cols["query_id"][str(i)] = r["query_id"]
        cols["query"][str(i)] = r["query"]
        cols["query_type"][str(i)] = r["query_type"]
        cols["passages"][str(i)] = [
            {"is_selected": s, "passage_text": t, "url": u}
            for s, t, u in zip(p["is_selected"], p["passage_text"], p["url"], strict=True)
        ]
    (tmp_path / "dev_v2.1.json").write_text(json.dumps(cols), encoding="utf-8")
    s = read_msmarco(tmp_path / "dev_v2.1.json", "validation")
    assert s.query_ids == ref.query_ids and s.passage_texts == ref.passage_texts
    np.testing.assert_array_equal(s.candidates, ref.candidates)
    np.testing.assert_array_equal(s.labels, ref.labels)


def test_unlabelled_rows_and_repeated_query_ids(tmp_path, rows):
    # issue 10, item 3: the public test split marks every passage is_selected = -1, which used
    # to raise an uncaught OverflowError; it reads as unlabelled (grade 0), never 255
    test_rows = json.loads(json.dumps(rows[:2]))
    for r in test_rows:
        r["passages"]["is_selected"] = [-1] * len(r["passages"]["is_selected"])
    s = read_msmarco(_jsonl(tmp_path / "test.jsonl", test_rows))
    n = sum(len(r["passages"]["is_selected"]) for r in test_rows)
    assert s.labels.max() == 0 and s.meta["n_unlabelled_passages"] == n
    assert (s.candidates >= 0).sum() == n
    test_rows[1]["passages"]["is_selected"][0] = -2
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, row 2: is_selected -2 is not -1"):
        read_msmarco(_jsonl(tmp_path / "bad.jsonl", test_rows))
    twice = json.loads(json.dumps([rows[0], rows[1], rows[0]]))
    with pytest.raises(
        DataFormatError, match=rf"twice\.jsonl, row 3: query id {rows[0]['query_id']} repeated"
    ):
        read_msmarco(_jsonl(tmp_path / "twice.jsonl", twice))
