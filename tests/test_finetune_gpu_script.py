"""``scripts/finetune_gpu.sh``: its arguments and dry-run plan (cheap; the training itself is
what ``--self-test`` runs, not this test)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "finetune_gpu.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def _plan(stdout: str) -> list[str]:
    return [line.split(" ", 2)[1] for line in stdout.splitlines() if line.startswith("PLAN ")]


def test_self_test_plan_is_cpu_on_a_scifact_slice(tmp_path: Path) -> None:
    res = _run("--self-test", "--dry-run", "--out", str(tmp_path / "o"), "--data", "/d")
    assert res.returncode == 0, res.stderr
    assert _plan(res.stdout) == [
        "embed",
        "config",
        "finetune-qt",
        "drift-qt",
        "finetune-bi",
        "drift-bi",
        "summary",
    ]
    lines = res.stdout.splitlines()
    embed = next(x for x in lines if x.startswith("PLAN embed"))
    assert "/d/beir-scifact/scifact.zip" in embed and "--limit 32" in embed
    assert "--max-passages 300" in embed
    tune = [x for x in lines if x.startswith("PLAN finetune-")]
    assert all("--device cpu" in x and "--eval-split test" in x for x in tune)
    assert '"max_steps": 3' in next(x for x in lines if x.startswith("PLAN config"))
    assert "mode: self-test device: cpu" in lines[0]
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


def test_gpu_plan_is_squad_on_cuda_within_the_slot(tmp_path: Path) -> None:
    res = _run("--dry-run", "--out", str(tmp_path / "o"), "--data", "/d")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "mode: gpu device: cuda" in lines[0]
    assert "/d/squad-v1.1/squad-v1.1.zip" in next(x for x in lines if x.startswith("PLAN embed"))
    tune = [x for x in lines if x.startswith("PLAN finetune-")]
    assert [x.split()[1] for x in tune] == ["finetune-qt", "finetune-bi"]  # query tower first
    assert all("--device cuda" in x and "--eval-split dev" in x for x in tune)
    config = next(x for x in lines if x.startswith("PLAN config"))
    assert "squad_query_tower.yaml" in config and "squad_biencoder.yaml" in config
    # the steps' time limits sum to less than a 15-minute device slot, start-up included
    limits = [int(x.split("(limit ")[1].split("s)")[0]) for x in lines if x.startswith("PLAN ")]
    assert sum(limits) <= 12 * 60


@pytest.mark.parametrize("args", [["--bogus"], ["--out"], ["--device"]])
def test_bad_arguments_exit_2(args: list[str]) -> None:
    res = _run(*args, "--dry-run") if args != ["--out"] and args != ["--device"] else _run(*args)
    assert res.returncode == 2
    assert "error:" in res.stderr


def test_gpu_mode_without_cuda_or_data_exits_2(tmp_path: Path) -> None:
    res = _run("--out", str(tmp_path / "o"), "--data", str(tmp_path / "none"))
    assert res.returncode == 2 and "missing" in res.stderr
