"""`treerank embed` end to end: stats table, bad input exit codes, a real Ctrl-C then --resume."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.store import EmbeddingStore

runner = CliRunner()


def test_embed_msmarco_sample(tmp_path, msmarco_parquet):
    res = runner.invoke(
        app, ["embed", str(msmarco_parquet), "-o", str(tmp_path), "--limit", "1", "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    for row in ("queries", "passages encoded", "tokens", "non-pad tokens", "padding ratio"):
        assert row in res.output
    st = EmbeddingStore.open(tmp_path / "validation")
    assert (
        st.n_queries == 1
        and st.k == 10
        and st.encoder_name == "sentence-transformers/all-MiniLM-L6-v2"
    )
    res = runner.invoke(app, ["embed", str(msmarco_parquet), "-o", str(tmp_path), "--limit", "1"])
    assert res.exit_code == 2 and "--overwrite" in res.output


@pytest.mark.parametrize(
    ("content", "fmt", "expect"),
    [
        (None, "auto", "not found"),
        (b"a,b\n", "auto", "cannot detect"),
        (b"{}", "nosuch", "unknown format 'nosuch'"),
        (
            b'{"query_id": 1, "query": " ", "passages": {"passage_text": [], "is_selected": []}}\n',
            "msmarco",
            "row 1: empty query",
        ),
        (b'{"query_id": 1, "query": "caf\xe9"}\n', "msmarco", "row 1: invalid UTF-8 byte 0xe9"),
        (b'{"query_id": 1, "text": "q"}\n', "msmarco", "row 1: row lacks 'query'"),
    ],
)
def test_bad_input_exits_2_naming_file_and_row(tmp_path, content, fmt, expect):
    path = tmp_path / ("in.jsonl" if fmt != "auto" else "in.csv")
    if content is not None:
        path.write_bytes(content)
    res = runner.invoke(app, ["embed", str(path), "-f", fmt, "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert expect in flat and "in." in flat
    assert not (tmp_path / "out" / "validation" / "meta.json").exists()


def _cli(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return [sys.executable, "-m", "treerank.cli.main", "embed", *args], env


# `treerank embed` in a subprocess that sends itself a real SIGINT (Ctrl-C) as the third passage
# batch starts, i.e. after two passage batches were checkpointed: deterministic on any machine,
# however fast it encodes.
CTRL_C_AT_THIRD_PASSAGE_BATCH = """
import os, signal, sys
from treerank.encoders.sentence import SentenceEncoder
from treerank.cli.main import app

encode_batch = SentenceEncoder.encode_batch
seen = {"passage": 0}
# Ctrl-C raises KeyboardInterrupt even when this process inherited SIGINT as ignored (a job
# started in the background by a non-interactive shell does)
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupted(self, texts, kind="passage"):
    if kind == "passage":
        seen["passage"] += 1
        if seen["passage"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
    return encode_batch(self, texts, kind)

SentenceEncoder.encode_batch = interrupted
sys.argv = ["treerank", "embed", *sys.argv[1:]]
app()
"""


def test_ctrl_c_then_resume_is_byte_identical(tmp_path, msmarco_parquet):
    common = [
        str(msmarco_parquet),
        "--limit",
        "2",
        "--token-budget",
        "300",
        "--max-batch-size",
        "2",
        "--no-reuse",
        "--no-progress",
    ]
    cmd, env = _cli(*common, "-o", str(tmp_path / "full"))
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    part = tmp_path / "part" / "validation"
    cmd = [sys.executable, "-c", CTRL_C_AT_THIRD_PASSAGE_BATCH, *common]
    proc = subprocess.run(cmd + ["-o", str(tmp_path / "part")], env=env, capture_output=True)
    err = proc.stderr
    assert json.loads((part / "progress.json").read_text())["passage_batches_done"] == 2
    assert proc.returncode == 130, err.decode()
    assert b"--resume" in err
    assert (part / "progress.json").exists() and not (part / "meta.json").exists()
    cmd, env = _cli(*common, "-o", str(tmp_path / "part"), "--resume")
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    for name in (
        "queries.bin",
        "passages.bin",
        "query_indices.bin",
        "query_is_selected.bin",
        "queries.jsonl",
        "passages.jsonl",
    ):
        assert filecmp.cmp(tmp_path / "full" / "validation" / name, part / name, shallow=False)
    meta = json.loads((part / "meta.json").read_text())
    assert meta["stats"]["resumed"] is True


def test_empty_corpus_exits_2_naming_the_corpus_file(tmp_path):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "what is it"}\n')
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    res = runner.invoke(app, ["embed", str(root), "-f", "beir", "-o", str(tmp_path / "out")])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert f"{root / 'corpus.jsonl'}: no passages in split 'test'" in flat
    assert not (tmp_path / "out" / "test").exists()
