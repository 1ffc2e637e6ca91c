"""`treerank sweep` CLI: bad grids and key paths fail with exit code 2 and a message naming them."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from treerank.cli.main import app

REPO = Path(__file__).resolve().parents[2]


def _exp(tmp_path: Path) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "sample.yaml").read_text())
    for ds in raw["datasets"]:
        ds["path"] = str((REPO / "configs" / ds["path"]).resolve())
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_sweep_rejects_bad_grid_and_key_paths(tmp_path: Path) -> None:
    exp = _exp(tmp_path)
    out = str(tmp_path / "o")
    r = CliRunner().invoke(app, ["sweep", str(exp), "--grid", "models.linear.seed", "-o", out])
    assert r.exit_code == 2 and "key.path=value1,value2" in r.output
    r = CliRunner().invoke(app, ["sweep", str(exp), "--grid", "models.nope.seed=1,2", "-o", out])
    assert r.exit_code == 2 and "no key 'nope'" in r.output
    r = CliRunner().invoke(app, ["sweep", str(exp), "-o", out])
    assert r.exit_code == 2 and "grid is empty" in r.output
    r = CliRunner().invoke(
        app,
        ["sweep", str(exp), "-g", "models.linear.seed=0,1", "--reference", "models.linear.seed=5"],
    )
    assert r.exit_code == 2 and "not a setting of the grid" in r.output
