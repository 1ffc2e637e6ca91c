"""Generic TSV collection reader on real DL19 passages and qrels."""

from __future__ import annotations

import pytest

from treerank.readers.dl19 import pool_run_files, read_pool_passages
from treerank.readers.errors import DataFormatError
from treerank.readers.trec import read_trec_qrels, read_trec_topics
from treerank.readers.tsv import read_tsv


def test_tsv_folder(tmp_path, dl19_dir):
    texts = read_pool_passages(pool_run_files(dl19_dir))
    docs = list(texts.items())[:300]
    (tmp_path / "collection.tsv").write_text(
        "".join(f"{d}\t{t}\n" for d, t in docs), encoding="utf-8"
    )
    topics = read_trec_topics(dl19_dir / "topics.dl19-passage.txt")
    (tmp_path / "queries.dev.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in topics))
    (tmp_path / "qrels.dev.tsv").write_text((dl19_dir / "qrels.dl19-passage.txt").read_text())
    s = read_tsv(tmp_path, "dev")
    assert s.n_passages == 300 and s.passage_texts == [t for _, t in docs]
    kept = {d for d, _ in docs}
    qrels = [
        (q, d, g) for q, d, g in read_trec_qrels(dl19_dir / "qrels.dl19-passage.txt") if d in kept
    ]
    assert int((s.candidates >= 0).sum()) == len(qrels)
    source = read_trec_qrels(dl19_dir / "qrels.dl19-passage.txt")
    judged = {q for q, _, _ in source}
    # a topic judged only on passages absent from the collection is kept (scored 0, as by
    # trec_eval); topics without any judgment are dropped
    assert s.query_ids == [q for q, _ in topics if q in judged]
    assert sorted(s.labels[s.candidates >= 0].tolist()) == sorted(g for _, _, g in qrels)
    assert s.qrels is not None and sorted(s.qrels) == sorted(source)
    assert s.meta["n_judgments_on_missing_passages"] == len(source) - len(qrels)


def test_tsv_errors(tmp_path):
    (tmp_path / "collection.tsv").write_text("p1\tfine\np2 missing tab\n")
    with pytest.raises(DataFormatError, match=r"collection\.tsv, row 2: expected 'pid<TAB>text'"):
        read_tsv(tmp_path)
    (tmp_path / "collection.tsv").write_text("p1\tfine\n")
    with pytest.raises(DataFormatError, match=r"queries\.test\.tsv: file not found"):
        read_tsv(tmp_path)
