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
