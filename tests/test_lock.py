"""Writer locks (issue 10, item 12): a second writer of a directory stops with a message naming
the holder's pid, or waits; a lock left by a dead process is taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from treerank.evaluation.settings import EvaluationSettings
from treerank.lock import LockHeldError, lock_path, writer_lock

HOLD = """
import sys, time
from treerank.lock import writer_lock
with writer_lock(sys.argv[1], "embed"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(directory: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_stops_naming_the_holder(tmp_path) -> None:
    d = tmp_path / "stores" / "test"
    proc = _holder(d, 30)
    try:
        with pytest.raises(LockHeldError, match=rf"pid {proc.pid} \(embed\)") as err:
            with writer_lock(d, "evaluate"):
                pass
        assert err.value.holder["pid"] == proc.pid and str(d) in str(err.value)
    finally:
        proc.kill()
        proc.wait()
    # the kernel released the killed holder's lock; its record is noticed as stale
    with writer_lock(d, "evaluate") as info:
        assert info.stale_holder == proc.pid
    assert not lock_path(d).exists()  # a clean release removes its lock file
    with writer_lock(d, "evaluate") as info:
        assert info.stale_holder is None


def test_killed_holder_leaves_a_stale_lock_that_is_taken_over(tmp_path) -> None:
    d = tmp_path / "run"
    lock_path(d).write_text(json.dumps({"pid": 999_999_999, "what": "run"}))  # died holding it
    with writer_lock(d, "run") as info:
        assert info.stale_holder == 999_999_999
        assert json.loads(lock_path(d).read_text())["what"] == "run"


TRY = """
import sys
from treerank.lock import LockHeldError, writer_lock
try:
    with writer_lock(sys.argv[1], "probe"):
        print("took it")
except LockHeldError:
    print("held elsewhere")
"""


def _other_process_can_take(directory: Path) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", TRY, str(directory)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out in ("took it", "held elsewhere"), out
    return out == "took it"


def test_waiting_writer_gets_the_lock_when_released(tmp_path) -> None:
    d = tmp_path / "ckpt"
    proc = _holder(d, 1.0)
    with pytest.raises(LockHeldError):  # held: a writer that does not wait stops
        with writer_lock(d, "train"):
            pass
    # a generous wait (no timing is asserted): the lock is ours once the holder lets go
    with writer_lock(d, "train", wait=600):
        holder = json.loads(lock_path(d).read_text())
        assert holder["pid"] == os.getpid() and holder["what"] == "train"
    proc.wait()


def test_reentrant_in_one_process(tmp_path) -> None:
    d = tmp_path / "x"
    with writer_lock(d, "outer"):
        with writer_lock(d, "inner"):  # the same process re-enters instead of deadlocking
            assert json.loads(lock_path(d).read_text())["what"] == "outer"
            assert not _other_process_can_take(d)
        # leaving the inner block must not release the outer one
        assert json.loads(lock_path(d).read_text())["pid"] == os.getpid()
        assert not _other_process_can_take(d)
    # released by the outermost exit only: the lock file goes with the release
    assert not lock_path(d).exists()
    assert _other_process_can_take(d)


def test_every_writing_stage_takes_the_lock(tmp_path) -> None:
    from tests.search.tiny_store import write_tiny_store
    from treerank.evaluation.compare import compare_systems
    from treerank.store import embed_split

    store = write_tiny_store(tmp_path / "test")
    out = tmp_path / "eval"
    proc = _holder(out, 30)
    try:
        with pytest.raises(LockHeldError, match=f"pid {proc.pid}"):
            compare_systems(
                store,
                ["cosine"],
                settings=EvaluationSettings(baseline="cosine", n_permutations=10),
                out_dir=out,
            )
        assert not out.exists()  # nothing written
        compare_systems(
            store, ["cosine"], settings=EvaluationSettings(baseline="cosine", n_permutations=10)
        )  # no out dir
    finally:
        proc.kill()
        proc.wait()
    dest = tmp_path / "stores" / "train"
    proc = _holder(dest, 30)
    try:
        with pytest.raises(LockHeldError, match=f"pid {proc.pid}"):
            embed_split(None, None, dest)  # type: ignore[arg-type]  # stops before reading either
    finally:
        proc.kill()
        proc.wait()


def test_release_leaves_no_lock_file_nor_the_parents_it_created(tmp_path) -> None:
    d = tmp_path / "runs" / "deep" / "mine"
    with writer_lock(d, "run"):
        assert lock_path(d).is_file()
    assert not (tmp_path / "runs").exists()  # a pre-check that stopped here left nothing
    with writer_lock(d, "run"):
        d.mkdir()
        (d / "out.txt").write_text("x")
    assert (d / "out.txt").is_file() and not lock_path(d).exists()
    assert sorted(p.name for p in d.parent.iterdir()) == ["mine"]


COUNT = """
import sys
from pathlib import Path
from treerank.lock import writer_lock
d, counter = Path(sys.argv[1]), Path(sys.argv[2])
for _ in range(25):
    with writer_lock(d, "count", wait=60):
        n = int(counter.read_text())
        counter.write_text(str(n + 1))
"""


def test_removed_lock_files_still_exclude_concurrent_writers(tmp_path) -> None:
    """Removing the lock file at release races with a writer that opened it: the inode
    check makes the increments below never overlap (a lost update would show)."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs = [
        subprocess.Popen([sys.executable, "-c", COUNT, str(tmp_path / "d"), str(counter)])
        for _ in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert counter.read_text() == "100"
    assert not lock_path(tmp_path / "d").exists()


def test_evaluate_into_an_existing_file_fails_before_scoring(tmp_path, monkeypatch) -> None:
    """Trial mistake #35: the library call refuses before any system runs; no lock is left."""
    from tests.search.tiny_store import write_tiny_store
    from treerank.atomic import OutputPathError
    from treerank.evaluation import compare

    store = write_tiny_store(tmp_path / "test")
    f = tmp_path / "afile"
    f.write_text("mine")
    monkeypatch.setattr(compare, "_compare", lambda *a, **k: pytest.fail("scored anyway"))
    with pytest.raises(OutputPathError, match=r"afile: exists and is not a directory"):
        compare.compare_systems(
            store, ["cosine"], settings=EvaluationSettings(baseline="cosine"), out_dir=f
        )
    assert f.read_text() == "mine" and not lock_path(f).exists()
