import os
import stat
from pathlib import Path

import pytest

from treerank.atomic import atomic_savefig, atomic_write_json, atomic_write_text


def _boom():
    yield "partial line\n"
    raise RuntimeError("disk on fire")


def test_failed_write_keeps_previous_file_and_leaves_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "results.json"
    atomic_write_json(p, {"ndcg@10": 0.645})
    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write_text(p, _boom())
    assert p.read_text() == '{\n  "ndcg@10": 0.645\n}\n'
    assert os.listdir(p.parent) == ["results.json"]


def test_permissions_follow_umask_not_mkstemp(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644


def test_savefig_writes_png_and_closes(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    p = atomic_savefig(fig, tmp_path / "plot.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)]
)
def test_checkpoints_and_stage_dirs_follow_the_umask(tmp_path: Path, umask, file_mode, dir_mode):
    """Checkpoints (weights included) and swapped-in stage directories get the umask's modes,
    not mkdtemp's 0700 / safetensors' 0600 (issue 22)."""
    import torch

    from treerank.atomic import make_temp_dir
    from treerank.models.checkpoint import Checkpoint, save_checkpoint
    from treerank.pipeline.stages import run_stage

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    old = os.umask(umask)
    try:
        ck = save_checkpoint(
            tmp_path / "ckpt", Checkpoint("linear", {}, {"w": torch.zeros(2)}, "enc", "fp", 2)
        )
        stage = tmp_path / "runs" / "lin"
        run_stage("lin", "k", stage, lambda d: (d / "x.txt").write_text("x") and None, log=str)
        tmp = make_temp_dir(tmp_path / "t", ".x.")
    finally:
        os.umask(old)
    assert mode(ck) == dir_mode and mode(stage) == dir_mode and mode(tmp) == dir_mode
    assert mode(ck / "weights.safetensors") == file_mode
    assert mode(ck / "config.json") == file_mode
    assert mode(stage / "x.txt") == file_mode


def test_check_output_dir_refuses_files_before_creating_anything(tmp_path: Path) -> None:
    from treerank.atomic import OutputPathError, check_output_dir

    f = tmp_path / "afile"
    f.write_text("keep me")
    with pytest.raises(OutputPathError, match=r"afile: exists and is not a directory"):
        check_output_dir(f, "--out")
    with pytest.raises(OutputPathError, match=r"afile is a file"):
        check_output_dir(f / "sub" / "eval")
    assert check_output_dir(tmp_path / "new" / "eval") == tmp_path / "new" / "eval"
    assert sorted(os.listdir(tmp_path)) == ["afile"]  # nothing created
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):  # root can write anyway
            with pytest.raises(OutputPathError, match=r"ro is not writable"):
                check_output_dir(ro / "eval")
    finally:
        ro.chmod(0o700)
