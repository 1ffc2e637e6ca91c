"""Real incremental re-runs on a small slice: the report after a re-run equals a fresh run's.

Issue 21's stale case: change only ``models.linear.trainer.lr`` and re-run over the old output:
the train stages and the evaluations must re-run (an evaluation reads the runs' train keys
through its declared edges; before, it fell back to the unchanged checkpoint path) and the report
must equal a fresh run of the changed file. The fresh runs are the two settings of a sweep over
``lr`` (its shared stage cache is checked on the way). Seeds (``linear`` with seeds 0, 1) and
transfer (``tiny`` evaluates the runs trained on ``sci``) are in every run. Same machine, same
kernels on both sides: compared exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.slice_experiment import (
    differences,
    report_lines,
    report_numbers,
    write_experiment,
)
from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import run_experiment
from treerank.pipeline.sweep import run_sweep

OLD_LR, NEW_LR = 0.001, 0.01


def _run(cfg: Path, out: Path) -> dict[str, str]:
    res = run_experiment(load_experiment(cfg, output_dir=out), progress=False, log=lambda s: None)
    return {r.name: r.status for r in res.stages}


def _runs(out: Path, dataset: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / "eval" / dataset / "runs").iterdir())}


@pytest.mark.slow
def test_changed_lr_reruns_evaluation_and_equals_a_fresh_run(
    scifact_slice: Path, tmp_path: Path
) -> None:
    tiny = tmp_path / "tiny"
    old = write_experiment(tmp_path / "old.yaml", scifact_slice, tiny, OLD_LR, diagnose=False)
    new = write_experiment(tmp_path / "new.yaml", scifact_slice, tiny, NEW_LR, diagnose=False)

    # fresh runs of both settings: a two-setting sweep (one shared stage cache)
    sweep = run_sweep(
        old,
        [f"models.linear.trainer.lr={OLD_LR},{NEW_LR}"],
        out=tmp_path / "sweep",
        progress=False,
        log=lambda s: None,
    )
    ran = [r.name for recs in sweep.stages.values() for r in recs if not r.reused]
    assert ran.count("embed:tiny:test") == 1  # shared by both settings
    assert ran.count("evaluate:tiny") == 2 and ran.count("train:sci:linear@seed0") == 2
    slug = {s.values["models.linear.trainer.lr"]: s.slug for s in sweep.settings}
    fresh_old = tmp_path / "sweep" / "settings" / slug[OLD_LR]
    fresh_new = tmp_path / "sweep" / "settings" / slug[NEW_LR]

    out = tmp_path / "out"
    _run(old, out)
    a, b = report_numbers(out), report_numbers(fresh_old)
    assert a == b, differences(a, b)[:10]
    runs_before = {d: _runs(out, d) for d in ("sci", "tiny")}

    status = _run(new, out)  # only the learning rate changed
    assert status["embed:tiny:test"] == "reused"
    for stage in (
        "train:sci:linear@seed0",
        "train:sci:linear@seed1",
        "evaluate:sci",
        "evaluate:tiny",  # the transfer evaluation reads the same runs
    ):
        assert status[stage] == "ran", (stage, status)
    a, b = report_numbers(out), report_numbers(fresh_new)
    assert a == b, differences(a, b)[:10]
    assert report_lines(out) == report_lines(fresh_new)
    # the change was real: every trained run's ranking moved, the baselines' did not
    for d, before in runs_before.items():
        after = _runs(out, d)
        moved = {name for name in after if after[name] != before.get(name)}
        assert moved and all("linear" in name for name in moved), (d, moved)
    # the report says which seeds it used
    seeds = report_numbers(out)["sci"]["seeds"]
    assert seeds["training"] == {"linear@seed0": 0, "linear@seed1": 1}
    assert "Seeds used: training `linear@seed0` 0, `linear@seed1` 1" in "\n".join(report_lines(out))
