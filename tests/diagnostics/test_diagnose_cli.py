"""``treerank diagnose`` on the real SciFact test store."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.models.checkpoint import save_checkpoint
from treerank.models.drt import DRTConfig, DRTHead


def test_diagnose_command(scifact_store, tmp_path) -> None:
    store = scifact_store["test"]
    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=store.dim, k=2, slot_dim=8, hidden=32, attn_hidden=8))
    save_checkpoint(
        tmp_path / "ck", head.to_checkpoint(store.encoder_name, store.encoder_fingerprint)
    )
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "diagnose",
            str(tmp_path / "ck"),
            "--store",
            str(store.path),
            "--out",
            str(tmp_path / "d"),
            "--k",
            "100",
            "--no-plots",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "decision rules" in res.output and "concat-cosine" in res.output
    assert (tmp_path / "d" / "report.md").is_file() and not (tmp_path / "d" / "cka.png").exists()
    bad = runner.invoke(
        app,
        [
            "diagnose",
            str(tmp_path / "nope"),
            "--store",
            str(store.path),
            "--out",
            str(tmp_path / "e"),
        ],
    )
    assert bad.exit_code == 2 and "nope" in bad.output
