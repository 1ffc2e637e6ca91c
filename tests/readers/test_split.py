"""`RetrievalSplit.warnings` and the empty-corpus refusal of `read_split`, on tiny BEIR folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treerank.readers import read_split
from treerank.readers.errors import DataFormatError


def _beir(root: Path, docs: list[tuple[str, str]], qrels: list[tuple[str, str, int]]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in docs)
    )
    qids = dict.fromkeys(q for q, _, _ in qrels)
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": f"question {q}"}) + "\n" for q in qids)
    )
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, d, g in qrels)
    )
    return root


def test_empty_corpus_is_refused_naming_the_corpus_file(tmp_path: Path) -> None:
    root = _beir(tmp_path / "b", [], [("q1", "d1", 1)])
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl: no passages in split 'test'"):
        read_split(root, "beir", "test")
    blank = _beir(tmp_path / "c", [("d1", "  ")], [("q1", "d1", 1)])
    with pytest.raises(DataFormatError, match="every document's text is empty"):
        read_split(blank, "beir", "test")


def test_judgments_on_unknown_passages_are_counted_with_an_example(tmp_path: Path) -> None:
    root = _beir(
        tmp_path / "b",
        [("d1", "cats purr"), ("d2", "dogs bark"), ("d3", "")],
        [("q1", "d1", 1), ("q1", "d9", 1), ("q2", "d7", 1), ("q3", "d2", 0)],
    )
    split = read_split(root, "beir", "test")
    warnings = split.warnings()
    assert warnings[0] == (
        "2 of 4 judgments name a passage that is not in the corpus and were dropped "
        "(e.g. query q1 -> passage d9)"
    )
    assert warnings[1] == "1 documents with empty text were skipped"
    # q2 lost its only judgment, q3 has only a grade-0 one: 2 of 3 queries are left out
    assert warnings[2].startswith("2 of 3 queries have no relevant passage")


def test_unlabelled_split_is_read_but_flagged(tmp_path: Path) -> None:
    root = _beir(tmp_path / "b", [("d1", "cats purr")], [("q1", "d5", 1)])
    split = read_split(root, "beir", "test")  # still readable: label-free training / serving
    assert split.n_passages == 1 and split.n_queries == 1
    assert any("evaluate will refuse it" in w for w in split.warnings())


def test_repr_is_counts_not_texts() -> None:
    """Issue 22: ``print(read_split(...))`` shows counts, never every passage text."""
    import numpy as np

    from treerank.readers.split import RetrievalSplit

    s = RetrievalSplit(
        "test",
        "beir",
        ["q1"],
        ["roasting coffee"],
        ["d1", "d2"],
        ["Beans are roasted. " * 1000, "Lava flows downhill."],
        np.array([[0, 1]], dtype=np.int32),
        np.array([[1, 0]], dtype=np.uint8),
        meta={"path": "data/mybeir"},
    )
    assert repr(s) == (
        "RetrievalSplit(name='test', source='beir', n_queries=1, n_passages=2, k=2, "
        "relevance_threshold=1, path='data/mybeir')"
    )
