"""The top-level API: `import treerank` is cheap, and the README's notebook example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import treerank
from tests.search.tiny_store import write_tiny_store

REPO = Path(__file__).resolve().parents[1]


def test_main_api_names_resolve_to_their_modules() -> None:
    from treerank.evaluation.compare import compare_systems
    from treerank.pipeline.experiment import run_experiment
    from treerank.store import EmbeddingStore, embed_split
    from treerank.tasks.train import train_model

    assert treerank.EmbeddingStore is EmbeddingStore
    assert treerank.embed_split is embed_split
    assert treerank.compare_systems is compare_systems
    assert treerank.train_model is train_model
    assert treerank.run_experiment is run_experiment
    assert set(treerank.__all__) == {"__version__", *treerank._API}
    assert set(treerank.__all__) <= set(dir(treerank))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = treerank.nope  # type: ignore[attr-defined]


def test_import_treerank_loads_no_heavy_library() -> None:
    code = (
        "import sys, treerank; "
        "print(sorted(m for m in ('torch', 'bm25s', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "src")},
    ).stdout
    assert out.strip() == "[]"


def test_readme_notebook_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(from treerank import .*?)```", readme, re.S)
    assert block is not None
    code = block.group(1)
    assert len([ln for ln in code.strip().splitlines() if ln.strip()]) == 6  # short, as promised
    write_tiny_store(tmp_path / "test")
    assert "stores/mybeir/test" in code  # the tour's store (tests/test_readme.py runs the tour)
    code = code.replace("stores/mybeir/test", str(tmp_path / "test"))
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    printed = capsys.readouterr().out
    assert "Against baseline `cosine`" in printed and "rrf:bm25+cosine" in printed
    comp = scope["comp"]
    assert 0.0 < comp.mean("rrf:bm25+cosine", "ndcg@10") <= 1.0  # type: ignore[attr-defined]
