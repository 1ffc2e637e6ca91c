"""BEIR zips read directly: same split as the folder, several qrels splits over one corpus, each
passage embedded once for all splits; errors name the member inside the archive."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from treerank.readers import detect_format, read_split
from treerank.readers.beir import beir_splits, read_beir
from treerank.readers.errors import DataFormatError
from treerank.readers.scifact import read_scifact_corpus, read_scifact_qrels


def _write_beir(root: Path, scifact_zip: Path, n_docs: int | None = None) -> None:
    """SciFact in BEIR's layout (train and test qrels), optionally the first ``n_docs`` only."""
    ids, titles, texts = read_scifact_corpus(scifact_zip)
    keep = set(ids[:n_docs]) if n_docs else set(ids)
    root.mkdir(parents=True)
    (root / "qrels").mkdir()
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for d, t, x in zip(ids, titles, texts, strict=True):
            if d in keep:
                f.write(json.dumps({"_id": d, "title": t, "text": x}) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as fq:
        for split in ("train", "test"):
            qids, claims, cited = read_scifact_qrels(scifact_zip, split)
            with open(root / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                for q, c, docs in zip(qids, claims, cited, strict=True):
                    docs = [d for d in docs if d in keep]
                    if docs:
                        fq.write(json.dumps({"_id": q, "text": c}) + "\n")
                    for d in docs:
                        f.write(f"{q}\t{d}\t1\n")


def _zip(folder: Path, out: Path) -> Path:
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, f"{folder.name}/{p.relative_to(folder)}")
    return out


@pytest.fixture(scope="module")
def scifact_beir(tmp_path_factory, scifact_zip):
    base = tmp_path_factory.mktemp("beirzip")
    folder = base / "scifact"
    _write_beir(folder, scifact_zip)
    return folder, _zip(folder, base / "scifact-beir.zip")


def test_zip_equals_folder_for_every_split(scifact_beir, scifact_zip):
    from treerank.readers.scifact import read_scifact

    folder, archive = scifact_beir
    assert detect_format(archive) == "beir"
    assert beir_splits(archive) == beir_splits(folder) == ["test", "train"]
    for split in ("train", "test"):
        a, b = read_split(archive, split=split), read_beir(folder, split)
        ref = read_scifact(scifact_zip, split)
        assert a.query_ids == b.query_ids == ref.query_ids
        assert a.passage_texts == b.passage_texts == ref.passage_texts  # one shared corpus
        np.testing.assert_array_equal(a.candidates, ref.candidates)
        np.testing.assert_array_equal(a.labels, ref.labels)
        assert a.meta["zip_member_prefix"] == "scifact/"


def test_zip_errors_name_the_member(scifact_beir, tmp_path):
    _, archive = scifact_beir
    with pytest.raises(DataFormatError, match=r"scifact-beir\.zip/scifact/qrels/dev\.tsv"):
        read_beir(archive, "dev")
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("x/corpus.jsonl", '{"_id": "1", "text": "a"}\n{not json\n')
        zf.writestr("x/queries.jsonl", '{"_id": "q", "text": "a"}\n')
        zf.writestr("x/qrels/test.tsv", "q\t1\t1\n")
    with pytest.raises(DataFormatError, match=r"bad\.zip/x/corpus\.jsonl, row 2: invalid JSON"):
        read_beir(bad, "test")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("readme.txt", "hi")
    with pytest.raises(DataFormatError, match="cannot detect"):
        detect_format(other)


def test_embed_two_splits_from_a_zip_encodes_each_passage_once(tmp_path, scifact_zip):
    from treerank.cli.main import app
    from treerank.store import EmbeddingStore

    folder = tmp_path / "tiny"
    _write_beir(folder, scifact_zip, n_docs=40)
    archive = _zip(folder, tmp_path / "tiny.zip")
    out = tmp_path / "stores"
    res = CliRunner().invoke(
        app,
        [
            "embed",
            str(archive),
            "-o",
            str(out),
            "--split",
            "train",
            "--split",
            "test",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    train, test = EmbeddingStore.open(out / "train"), EmbeddingStore.open(out / "test")
    assert train.n_passages == test.n_passages == 40
    assert test.meta["stats"]["n_reused_passages"] == 40  # the test split encoded none
    np.testing.assert_array_equal(np.asarray(train.passages), np.asarray(test.passages))
