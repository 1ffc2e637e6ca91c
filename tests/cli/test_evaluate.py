"""`treerank evaluate` end to end on a tiny on-disk store."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.search.tiny_store import write_tiny_store
from treerank.cli.main import app


def test_evaluate_prints_table_and_writes_files(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--store",
            str(tmp_path / "test"),
            "--system",
            "bm25",
            "--system",
            "rrf:bm25+cosine",
            "--baseline",
            "cosine",
            "--out",
            str(tmp_path / "out"),
            "--permutations",
            "100",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        "(baseline)" in result.output and "ndcg@10" in result.output and "McNemar" in result.output
    )
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(res["systems"]) == {"cosine", "bm25", "rrf:bm25+cosine"}


def test_evaluate_bad_spec_is_a_clear_error(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    result = CliRunner().invoke(
        app, ["evaluate", "--store", str(tmp_path / "test"), "--system", "bm26"]
    )
    assert result.exit_code == 2
    assert "unknown system" in result.output


def test_evaluate_store_root_with_split_and_missing_store(tmp_path) -> None:
    write_tiny_store(tmp_path / "root" / "test")
    ok = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--store",
            str(tmp_path / "root"),
            "--split",
            "test",
            "--system",
            "bm25",
            "--metric",
            "mrr@10",
            "--permutations",
            "50",
            "--no-progress",
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert "mrr@10" in ok.output and "recall@1000" not in ok.output
    missing = CliRunner().invoke(app, ["evaluate", "--store", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_evaluate_reports_a_failing_system_and_keeps_the_others(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    missing = tmp_path / "no-such-ckpt"
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--store",
            str(tmp_path / "test"),
            "--system",
            "bm25",
            "--system",
            f"ckpt:{missing}",
            "--out",
            str(tmp_path / "out"),
            "--permutations",
            "10",
            "--no-progress",
        ],
    )
    assert result.exit_code == 1, result.output
    assert f"system ckpt:{missing} failed" in result.output and "(baseline)" in result.output
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(res["systems"]) == {"cosine", "bm25"} and list(res["failed"]) == [f"ckpt:{missing}"]
