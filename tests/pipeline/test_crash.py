"""Crash consistency of ``treerank run`` (issue 24): kill the process at chosen points of every
stage kind (``TREERANK_CRASH_AT``, :mod:`treerank.faults`), re-run, and get the uninterrupted
run's report.

One output directory goes through a chain of runs, each killed (``os._exit(97)``: no cleanup, no
flushing, as ``kill -9``) at the next point of :data:`CHAIN`; each re-run continues from what the
killed one left. After every crash the stage that was running must not look finished (no
``stage.json`` with its key: a re-run logs ``[run]`` for it, never ``[reuse]``), the run lock the
dead process held is taken over, and the last run's report numbers and files equal an
uninterrupted run's. The ``sci`` dataset reads the shared slice store (``store:``), so only the
tiny dataset is embedded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.slice_experiment import (
    differences,
    report_lines,
    report_numbers,
    write_experiment,
)
from treerank.faults import CRASH_EXIT_CODE, ENV
from treerank.lock import lock_path
from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import run_experiment

REPO = Path(__file__).resolve().parents[2]

# <stage kind>:<point>, in the order a run reaches them (sci's given store, its train stages,
# then tiny's embedding, the evaluations, the diagnostics, the report); every stage kind has at
# least one (the BM25 mining of the mine stage included).
CHAIN = [
    "mining:after-mine",
    "train:after-weights",
    "train:before-stage-json",
    "embed:mid",
    "embed:before-meta",
    "evaluate:after-runs",
    "diagnose:before-stage-json",
    "report:mid-write",
]


def _treerank_run(cfg: Path, out: Path, crash: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO / "src") + os.pathsep + str(REPO))
    if crash is not None:
        env[ENV] = crash
    code = "import sys; from treerank.cli.main import app; sys.argv[0] = 'treerank'; app()"
    return subprocess.run(
        [sys.executable, "-c", code, "run", str(cfg), "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def _ran(log: str) -> list[str]:
    return re.findall(r"^\[run\]\s+(\S+)", log, flags=re.M)


def _files(out: Path) -> list[str]:
    """Every file of the run's output (path relative to it), temporaries included."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() or p.is_symlink())


@pytest.mark.slow
def test_killed_at_every_point_then_rerun_equals_an_uninterrupted_run(
    scifact_slice: Path, tmp_path: Path
) -> None:
    cfg = write_experiment(tmp_path / "exp.yaml", scifact_slice, tmp_path / "tiny")
    ref = tmp_path / "ref"
    run_experiment(load_experiment(cfg, output_dir=ref), progress=False, log=lambda s: None)

    out = tmp_path / "out"
    running: str | None = None  # the stage the previous (killed) run was in
    for point in [*CHAIN, None]:
        proc = _treerank_run(cfg, out, point)
        log = proc.stdout + proc.stderr
        ran = _ran(log)
        if running is not None:  # the killed stage is never taken as finished
            assert running in ran, (point, running, log[-3000:])
            assert f"[reuse] {running} " not in log
        if point is None:
            assert proc.returncode == 0, log[-3000:]
            break
        assert proc.returncode == CRASH_EXIT_CODE, (point, log[-3000:])
        kind = point.partition(":")[0]  # our own test constant, not a stage name
        if kind == "report":  # every stage finished; report.json new, report.md not yet
            running = None
            assert (out / "report.json").exists()
        else:
            running = ran[-1]  # mining is a stage of its own (mine:<ds>:<part>)
            assert running.startswith("mine:" if kind == "mining" else f"{kind}:"), point
        assert lock_path(out).exists()  # the dead holder's lock file, taken over next time

    a, b = report_numbers(out), report_numbers(ref)
    assert a == b, differences(a, b)[:10]
    assert report_lines(out) == report_lines(ref)
    assert _files(out) == _files(ref)  # no temporaries or half-written files left behind
