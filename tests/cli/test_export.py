"""``treerank export`` refuses what it cannot do with exit 2 and a message, before writing."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.models.checkpoint import Checkpoint, save_checkpoint

runner = CliRunner()


def test_refusals_exit_2_with_a_message(tmp_path):
    forest = tmp_path / "forest"
    save_checkpoint(forest, Checkpoint("forest", {"dim": 4}, {"x": torch.zeros(1)}, "e", "f", 4))
    res = runner.invoke(app, ["export", f"ckpt:{forest}", "--to", "sentence-transformers", "out"])
    assert res.exit_code == 2 and "own retrieval" in res.output
    assert not (tmp_path / "out").exists()
    cases = [
        (["export", f"ckpt:{forest}", "--to", "onnx"], "expected sentence-transformers or db:"),
        (["export", f"ckpt:{forest}", "--to", "sentence-transformers"], "needs OUT"),
        (["export", f"ckpt:{forest}", "--to", "db:qd:x"], "--head ckpt:<dir>"),
        (["export", str(tmp_path), "--to", "db:qd:x", "out"], "takes no OUT"),
        (["export", str(tmp_path), "--to", "db:qd:x", "--head", "models/x"], "expected ckpt:"),
        (["export", str(tmp_path / "nope"), "--to", "db:qd:x"], "nope"),
    ]
    for args, msg in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output, (args, res.output)
