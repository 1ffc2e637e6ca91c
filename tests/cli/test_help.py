"""`--help`: flags read as flags, and the text uses the terminal's width."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from treerank.cli.main import app, help_width

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["embed", "evaluate", "train", "diagnose", "run"])
def test_flags_show_as_flags(command: str) -> None:
    res = CliRunner().invoke(app, [command, "--help"])
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output and "BOOL" not in res.output
    assert "--progress / --no-progress" in res.output or command == "diagnose"


def test_embed_resume_is_a_plain_flag() -> None:
    out = CliRunner().invoke(app, ["embed", "--help"]).output
    line = next(x for x in out.splitlines() if x.strip().startswith("--resume"))
    assert line.split()[:2] == ["--resume", "Continue"]


def test_help_width_follows_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "150")
    assert help_width() == 150
    env = {**os.environ, "COLUMNS": "150", "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "treerank.cli.main", "evaluate", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    widths = [len(line) for line in out.splitlines()]
    assert 80 < max(widths) <= 150
