"""docs/export.md runs as written: every ``treerank`` line of its ``bash`` blocks (those pointed
at a URL aside: no server here), in order, on the 10-query MS MARCO sample saved as a Hugging
Face ``datasets`` folder, in a fresh working directory; then the outputs are checked."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from treerank.cli.main import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "export.md"
datasets = pytest.importorskip("datasets")
pytest.importorskip("qdrant_client")


def doc_commands(text: str) -> list[list[str]]:
    """Argument lists of the ``treerank`` lines in ``bash`` blocks, URL lines left out."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("treerank ") and "://" not in line:
                out.append(shlex.split(line)[1:])
    return out


def test_doc_commands_run(msmarco_parquet, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cmds = doc_commands(DOC.read_text(encoding="utf-8"))
    assert [c[0] for c in cmds] == ["embed", "train", "export", "export", "evaluate"]
    datasets.load_dataset(
        "parquet",
        data_files={"validation": str(msmarco_parquet)},
        cache_dir=str(tmp_path / "hf-cache"),
    ).save_to_disk(str(tmp_path / "data" / "ms_marco_v2.1"))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    outputs = []
    for args in cmds:
        res = runner.invoke(app, args)
        assert res.exit_code == 0, (args, res.output, res.exception)
        outputs.append(res.output)
    from sentence_transformers import SentenceTransformer

    from treerank.models.registry import load_model
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(tmp_path / "stores/msmarco/validation")
    assert store.meta["source"] == "msmarco" and store.n_queries == 10
    head = load_model(tmp_path / "models/linear", store.encoder_fingerprint)
    st = SentenceTransformer(str(tmp_path / "models/linear-st"), device="cpu")
    want = head.encode_queries(np.asarray(store.queries))
    assert np.abs(st.encode_query(store.query_texts()) - want).max() <= 1e-5
    assert list((tmp_path / "models/linear").glob("events.out.tfevents.*"))
    assert "search it with --system db:qdrant:msmarco-dev" in outputs[3]
    systems = json.loads((tmp_path / "results/msmarco/results.json").read_text())["systems"]
    ckpt, db = systems["ckpt:models/linear"]["mean"], systems["db:qdrant:msmarco-dev"]["mean"]
    assert set(ckpt) == set(db)
    for m, v in ckpt.items():  # the exported split ranks as the checkpoint does
        assert abs(db[m] - v) <= 1e-4, m
    assert "rrf:db:qdrant:msmarco-dev+bm25" in systems
