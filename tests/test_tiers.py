"""The two test tiers: which tests ``tests/conftest.py`` puts in the integration tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import conftest


class FakeItem:
    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), slow: bool = False) -> None:
        self.nodeid = nodeid
        self.fixturenames = list(fixtures)
        self.fspath = conftest.REPO / nodeid.partition("::")[0]
        self._slow = slow
        self.marks: list[str] = []

    def get_closest_marker(self, name: str) -> object | None:
        return object() if (name == "slow" and self._slow) else None

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.name)


def _tiers(items: list[FakeItem]) -> list[bool]:
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    return [it.marks == ["integration"] for it in items]


def test_real_data_the_encoder_slow_marks_and_torchrun_are_integration() -> None:
    items = [
        FakeItem("tests/search/test_bm25.py::test_x", ("tmp_path",)),
        FakeItem("tests/search/test_bm25.py::test_y", ("scifact_store", "tmp_path")),
        FakeItem("tests/encoders/test_sentence.py::test_z", ("encoder",)),
        FakeItem("tests/pipeline/test_experiment.py::test_e", (), slow=True),
        FakeItem("tests/distributed/test_gather.py::test_g"),
        FakeItem("tests/cli/test_go_layout.py::test_go_store_runs_as_an_experiment_dataset"),
        FakeItem("tests/cli/test_go_layoutx.py::test_other"),
    ]
    assert _tiers(items) == [False, True, True, True, True, True, False]


def test_the_tier_marker_is_registered_and_test_sh_runs_both_tiers_unit_first() -> None:
    root = Path(conftest.REPO)
    assert "integration:" in (root / "pyproject.toml").read_text(encoding="utf-8")
    script = (root / "scripts" / "test.sh").read_text(encoding="utf-8")
    unit = script.index('tier unit "not integration"')
    assert unit < script.index('tier integration "integration"')
    assert "--durations=25" in (root / ".ci" / "run").read_text(encoding="utf-8")


def test_disk_check_deletes_finished_sessions_folders_then_refuses_a_full_disk(tmp_path) -> None:
    """scripts/disk_check.sh (run by test.sh before the tiers) deletes pytest's base folders of
    finished sessions (no ``.lock``), keeps a live session's, and exits 1 naming the free space
    and NEED_FREE_GB when the disk has less than NEED_FREE_GB GiB free."""
    import getpass
    import os
    import subprocess
    import sys

    root = tmp_path / f"pytest-of-{getpass.getuser()}"
    stale, live = root / "pytest-3", root / "pytest-4"
    for folder in (stale, live):
        (folder / "test_x0").mkdir(parents=True)
    (live / ".lock").write_text("", encoding="utf-8")
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(tmp_path), "PYTHON": sys.executable}
    script = [str(conftest.REPO / "scripts" / "disk_check.sh")]
    ok = subprocess.run(
        ["bash", *script], env={**env, "NEED_FREE_GB": "0"}, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert not stale.exists() and (live / "test_x0").is_dir()
    full = subprocess.run(
        ["bash", *script], env={**env, "NEED_FREE_GB": "1000000000"}, capture_output=True, text=True
    )
    assert full.returncode == 1
    assert "the tests need 1000000000 GiB (set NEED_FREE_GB" in full.stderr
