import json
import os
from pathlib import Path

import pytest

from treerank.pipeline.stages import (
    StageError,
    StageInterrupted,
    file_sha256,
    fingerprint,
    read_stage,
    run_stage,
    skip_stage,
)


def _writer(text: str, calls: list[str]):
    def work(d: Path) -> dict:
        calls.append(text)
        (d / "out.txt").write_text(text)
        return {"chars": len(text)}

    return work


def test_stage_runs_once_then_reuses_on_same_key(tmp_path: Path) -> None:
    calls: list[str] = []
    out = tmp_path / "s"
    r1 = run_stage("a", "k1", out, _writer("hello", calls), log=lambda _: None)
    r2 = run_stage("a", "k1", out, _writer("other", calls), log=lambda _: None)
    assert calls == ["hello"]
    assert (r1.reused, r2.reused) == (False, True)
    assert r2.summary == {"chars": 5}
    assert (out / "out.txt").read_text() == "hello"
    assert read_stage(out)["key"] == "k1"


def test_changed_key_reruns_and_replaces(tmp_path: Path) -> None:
    calls: list[str] = []
    out = tmp_path / "s"
    run_stage("a", "k1", out, _writer("v1", calls), log=lambda _: None)
    run_stage("a", "k2", out, _writer("v2", calls), log=lambda _: None)
    assert calls == ["v1", "v2"]
    assert (out / "out.txt").read_text() == "v2"


def test_failure_names_stage_and_keeps_previous_result(tmp_path: Path) -> None:
    out = tmp_path / "s"
    run_stage("train:mlp", "k1", out, _writer("good", []), log=lambda _: None)

    def boom(d: Path) -> dict:
        (d / "out.txt").write_text("half-written")
        raise ValueError("loss is NaN")

    with pytest.raises(StageError, match=r"train:mlp.*ValueError: loss is NaN"):
        run_stage("train:mlp", "k2", out, boom, log=lambda _: None)
    assert (out / "out.txt").read_text() == "good"
    assert json.loads((out / "stage.json").read_text())["key"] == "k1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temp dirs left


def test_in_place_failure_leaves_no_stage_file(tmp_path: Path) -> None:
    out = tmp_path / "s"
    run_stage("embed", "k1", out, _writer("a", []), in_place=True, log=lambda _: None)

    def boom(d: Path) -> dict:
        (d / "partial.bin").write_bytes(b"\0" * 4)
        raise OSError("disk full")

    with pytest.raises(StageError):
        run_stage("embed", "k2", out, boom, in_place=True, log=lambda _: None)
    assert read_stage(out) is None  # partial work kept for resume, never taken as finished
    assert (out / "partial.bin").exists()


def test_fingerprints_are_order_insensitive_for_dict_keys(tmp_path: Path) -> None:
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    f = tmp_path / "x.bin"
    f.write_bytes(b"abc")
    # sha256("abc"), the FIPS 180-2 test vector
    assert file_sha256(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    with pytest.raises(FileNotFoundError, match="nope"):
        file_sha256(tmp_path / "nope")


def test_ctrl_c_names_the_stage_and_keeps_finished_results(tmp_path: Path) -> None:
    out = tmp_path / "s"
    run_stage("train:mlp", "k1", out, _writer("good", []), log=lambda _: None)

    def interrupted(d: Path) -> dict:
        (d / "out.txt").write_text("half-written")
        raise KeyboardInterrupt

    with pytest.raises(StageInterrupted) as info:
        run_stage("train:mlp", "k2", out, interrupted, log=lambda _: None)
    assert isinstance(info.value, KeyboardInterrupt)
    assert info.value.stage == "train:mlp" and not info.value.in_place
    assert "'train:mlp'" in info.value.advice() and "starts this stage again" in info.value.advice()
    assert (out / "out.txt").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]

    with pytest.raises(StageInterrupted) as info2:
        run_stage("embed:x:test", "k", tmp_path / "e", interrupted, in_place=True, log=print)
    assert "continues this stage where it stopped" in info2.value.advice()


def test_skipped_stage_says_why(tmp_path: Path) -> None:
    lines: list[str] = []
    rec = skip_stage("train:msmarco", "no train_split", tmp_path / "m", log=lines.append)
    assert lines == ["[skip]  train:msmarco  (no train_split)"]
    assert rec.status == "skipped: no train_split" and not rec.reused
    assert not (tmp_path / "m").exists()
    ran = run_stage("a", "k", tmp_path / "a", _writer("x", []), log=lambda _: None)
    assert ran.status == "ran"
    assert run_stage("a", "k", tmp_path / "a", _writer("x", []), log=lambda _: None).status == (
        "reused"
    )


def test_temporaries_of_dead_processes_are_removed_live_ones_kept(tmp_path: Path) -> None:
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    gone = [tmp_path / f".s.tmp-{pid}-abc", tmp_path / f".s.old-{pid}"]
    for d in gone:
        d.mkdir()
        (d / "half.bin").write_bytes(b"x")
    gone_lock = tmp_path / f"..s.tmp-{pid}-abc.lock"
    gone_lock.write_text("")
    live = tmp_path / f".s.tmp-{os.getpid()}-xyz"
    live.mkdir()
    other = tmp_path / f".t.tmp-{pid}-abc"  # another stage's: not this stage's business
    other.mkdir()
    run_stage("s", "k", tmp_path / "s", lambda d: {"ok": 1}, log=lambda s: None)
    assert not any(d.exists() for d in gone) and not gone_lock.exists()
    assert live.is_dir() and other.is_dir()
    # the stage leaves no temporary (nor a lock file of one) behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "s"])
