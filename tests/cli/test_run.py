"""`treerank run` from the command line: what the user sees on Ctrl-C and on bad configs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A `treerank run` whose first stage waits for Ctrl-C: run_experiment is replaced by one that
# runs a single real pipeline stage (run_stage) that sleeps, so the signal lands inside it.
_SCRIPT = """
import signal, sys, time
# a shell that starts jobs in the background ignores SIGINT in them; Python then keeps it ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
import treerank.pipeline.experiment as exp
from treerank.pipeline.stages import run_stage

def fake_run_experiment(cfg, **kw):
    def work(d):
        print("stage started", flush=True)
        time.sleep(60)
    run_stage("embed:scifact:test", "k", cfg.output_dir / "s", work, in_place=True,
              log=kw["log"])

exp.run_experiment = fake_run_experiment
from treerank.cli.main import app
sys.argv = ["treerank", "run", sys.argv[1], "--out", sys.argv[2]]
app()
"""


def test_sigint_during_run_names_the_stage_and_says_rerun_continues(tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    data = tmp_path / "data"
    data.mkdir()
    cfg.write_text(
        f"name: t\ndatasets:\n  - {{name: scifact, path: {data}, format: beir, eval_split: test}}\n"
        "diagnose: {model: null}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(cfg), str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "stage started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted during stage 'embed:scifact:test'" in err
    assert "Re-run the same command to continue" in err
    assert "continues this stage where it stopped" in err
