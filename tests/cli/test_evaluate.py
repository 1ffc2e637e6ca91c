"""`treerank evaluate` end to end on a tiny on-disk store."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.search.tiny_store import write_tiny_store
from treerank.cli.main import app
from treerank.names import file_name

RRF_FILE = f"{file_name('rrf:bm25+cosine')}.trec"  # a spec with ":" gets a digest


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
    assert "(baseline)" in result.output and "ndcg@10" in result.output
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    for name in ("bm25", "rrf:bm25+cosine"):
        r = res["mcnemar_hit@10"]["cosine"][name]
        assert (
            f"hit@10: {r['b']} queries only {name} hits, {r['c']} only cosine hits "
            f"(McNemar p={r['p_value']:.4g}, "
        ) in " ".join(result.output.split())
    assert "b=" not in result.output
    assert set(res["systems"]) == {"cosine", "bm25", "rrf:bm25+cosine"}
    assert res["trained"] == []  # no trained model: no memorisation caveat applies


def test_evaluate_bad_spec_is_a_clear_error(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    result = CliRunner().invoke(
        app, ["evaluate", "--store", str(tmp_path / "test"), "--system", "bm26"]
    )
    assert result.exit_code == 2
    assert "unknown system kind 'bm26'; did you mean 'bm25'? known: cosine, bm25," in result.output
    assert "BM25 over passage texts" not in result.output  # the kinds, not the whole registry


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


def _invoke(tmp_path, *args: str):
    return CliRunner().invoke(
        app,
        ["evaluate", "--store", str(tmp_path / "test"), "--permutations", "20", "--no-progress"]
        + list(args),
    )


def test_k_is_validated_with_the_flags_name(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    zero = _invoke(tmp_path, "--k", "0")
    assert (
        zero.exit_code == 2
        and "(--k; evaluate.k" in zero.output
        and "chunk_size" not in zero.output
    )
    deep = _invoke(tmp_path, "--k", "5", "--metric", "recall@100")
    flat = " ".join(deep.output.split())
    assert deep.exit_code == 2, deep.output
    assert "recall@100 cannot be measured on a top-5 run" in flat and "--k" in flat
    too_shallow = _invoke(tmp_path, "--k", "5")
    assert too_shallow.exit_code == 2
    assert "--k 5 is below the cutoff of every default metric" in " ".join(
        too_shallow.output.split()
    )
    # a depth that covers all 8 passages serves every cutoff exactly
    full = _invoke(tmp_path, "--k", "8", "--system", "bm25")
    assert full.exit_code == 0, full.output
    assert "left out (deeper" not in full.output and "recall@1000" in full.output


def test_unlabelled_and_empty_stores_are_refused_in_user_terms(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    (tmp_path / "test" / "query_is_selected.bin").write_bytes(bytes(8))
    res = _invoke(tmp_path)
    flat = " ".join(res.output.split())
    assert res.exit_code == 2
    assert f"store {tmp_path / 'test'}: none of its 4 queries has a relevant passage" in flat

    empty = tmp_path / "empty" / "test"
    write_tiny_store(empty)
    meta = json.loads((empty / "meta.json").read_text())
    (empty / "meta.json").write_text(json.dumps({**meta, "n_passages": 0}))
    (empty / "passages.bin").write_bytes(b"")
    (empty / "passages.jsonl").write_text("")
    (empty / "query_indices.bin").write_bytes(b"\xff" * 32)
    (empty / "query_is_selected.bin").write_bytes(bytes(8))
    res = _invoke(tmp_path / "empty")
    flat = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "has no passages, so there is nothing to rank" in flat and "chunk_size" not in flat


def test_sibling_train_store_adds_seen_unseen_split(tmp_path) -> None:
    write_tiny_store(tmp_path / "root" / "test")
    write_tiny_store(tmp_path / "root" / "train")
    # training positives: only query 0's passages (p1, p5); so only test query 0 is "seen"
    (tmp_path / "root" / "train" / "query_is_selected.bin").write_bytes(bytes([2, 1] + [0] * 6))
    args = ["--system", "bm25", "--permutations", "20", "--no-progress"]
    res = CliRunner().invoke(
        app,
        ["evaluate", "--store", str(tmp_path / "root" / "test"), "--out", str(tmp_path / "o")]
        + args,
    )
    assert res.exit_code == 0, res.output
    assert "Seen vs unseen positives" in res.output
    assert "1 queries with a training positive" in res.output
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert (doc["overlap"]["n_seen"], doc["overlap"]["n_unseen"]) == (1, 3)
    assert doc["settings"]["train_store"] == str(tmp_path / "root" / "train")
    assert json.loads((tmp_path / "o" / "overlap.json").read_text()) == doc["overlap"]
    # baselines only: the breakdown is shown without the memorisation caveat
    assert doc["trained"] == [] and "memorised" not in res.output

    off = CliRunner().invoke(
        app,
        ["evaluate", "--store", str(tmp_path / "root" / "test"), "--no-overlap"] + args,
    )
    assert off.exit_code == 0 and "Seen vs unseen" not in off.output


def test_out_folder_never_mixes_two_comparisons(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    out = tmp_path / "o"
    first = _invoke(tmp_path, "--system", "bm25", "--system", "rrf:bm25+cosine", "--out", str(out))
    assert first.exit_code == 0, first.output
    assert (out / "runs" / RRF_FILE).exists()
    refused = _invoke(tmp_path, "--system", "bm25", "--out", str(out))  # no silent overwrite
    assert refused.exit_code == 2 and "pass --overwrite" in refused.output, refused.output
    assert (out / "runs" / RRF_FILE).exists()  # untouched
    second = _invoke(tmp_path, "--system", "bm25", "--out", str(out), "--overwrite")
    assert second.exit_code == 0, second.output
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["bm25.trec", "cosine.trec"]
    doc = json.loads((out / "results.json").read_text())
    assert doc["removed_stale_files"] == [f"runs/{RRF_FILE}"]
    assert "removed" in second.output and RRF_FILE in second.output


def test_out_folder_keeps_files_treerank_did_not_write(tmp_path) -> None:
    write_tiny_store(tmp_path / "test")
    out = tmp_path / "o"
    first = _invoke(tmp_path, "--system", "bm25", "--system", "rrf:bm25+cosine", "--out", str(out))
    assert first.exit_code == 0, first.output
    (out / "runs" / "mine.trec").write_text("x\n")
    second = _invoke(tmp_path, "--system", "bm25", "--out", str(out), "--overwrite")
    assert second.exit_code == 0, second.output
    assert (out / "runs" / "mine.trec").read_text() == "x\n"
    assert not (out / "runs" / RRF_FILE).exists()
    doc = json.loads((out / "results.json").read_text())
    assert doc["removed_stale_files"] == [f"runs/{RRF_FILE}"]
    assert doc["kept_unknown_files"] == ["runs/mine.trec"]
    assert "mine.trec alone (not written by treerank)" in " ".join(second.output.split())
    # a folder without an earlier results.json: nothing is removed
    bare = tmp_path / "bare"
    (bare / "runs").mkdir(parents=True)
    (bare / "runs" / "other.trec").write_text("y\n")
    third = _invoke(tmp_path, "--system", "bm25", "--out", str(bare), "--overwrite")
    assert third.exit_code == 0, third.output
    assert (bare / "runs" / "other.trec").read_text() == "y\n"


def _evaluate_with_ckpt(tmp_path, ckpt):
    """``evaluate`` of bm25 (and the cosine baseline) beside ``ckpt:<ckpt>`` on a tiny store."""
    write_tiny_store(tmp_path / "test")
    args = ["evaluate", "--store", str(tmp_path / "test"), "--system", "bm25"]
    args += ["--system", f"ckpt:{ckpt}", "--out", str(tmp_path / "out")]
    return CliRunner().invoke(app, [*args, "--permutations", "10", "--no-progress"])


def test_evaluate_reports_a_failing_system_and_keeps_the_others(tmp_path) -> None:
    broken = tmp_path / "broken-ckpt"  # a config but no weights: fails when it is loaded
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    result = _evaluate_with_ckpt(tmp_path, broken)
    assert result.exit_code == 1, result.output
    assert f"system ckpt:{broken} failed" in result.output and "(baseline)" in result.output
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(res["systems"]) == {"cosine", "bm25"} and list(res["failed"]) == [f"ckpt:{broken}"]


def test_evaluate_refuses_a_missing_checkpoint_before_any_work(tmp_path) -> None:
    """A ``ckpt:`` path that holds no checkpoint is bad input: exit 2, nothing written."""
    missing = tmp_path / "no-such-ckpt"
    result = _evaluate_with_ckpt(tmp_path, missing)
    assert result.exit_code == 2, result.output
    assert f"bad system spec 'ckpt:{missing}'" in result.output
    assert "config.json: missing (no such directory)" in result.output
    assert not (tmp_path / "out").exists()
