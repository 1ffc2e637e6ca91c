"""Audit of real miners on SciFact: equals precision@r, sees a planted false negative; CLI."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.diagnostics.false_negatives import audit_miners, write_audit
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.search.specs import build_system


class _Relabelled:
    """A store with its candidate table replaced (everything else delegated)."""

    def __init__(self, store, candidates, labels):
        self._s, self.candidates, self.labels = store, candidates, labels

    def __getattr__(self, name):
        return getattr(self._s, name)


def test_audit_equals_precision_and_sees_a_planted_positive(scifact_store, tmp_path):
    st = scifact_store["test"]
    res = audit_miners(st, ["cosine", "bm25"], depth=20)
    cos = res.curves[0]
    assert cos.miner == "cosine" and cos.n_queries == 300 and cos.depth == 20
    # every query has 20 slots, so F(r) is the mean precision@r of the miner's run
    run = build_system("cosine").retrieve(st, k=20)
    qrels = Qrels(np.asarray(st.candidates), np.asarray(st.labels), st.relevance_threshold)
    mean = evaluate_run(run.ids, qrels, ["precision@1", "precision@10"]).mean
    assert cos.cumulative_rate[0] == np.float64(mean["precision@1"])
    np.testing.assert_allclose(cos.cumulative_rate[9], mean["precision@10"], atol=1e-12)
    assert cos.rate[0] > cos.rate[9] > 0  # relevant passages crowd the top
    assert res.curves[1].miner == "bm25" and res.curves[1].guard_depth >= 1

    # plant: query 0's cosine rank-7 passage (not labelled) becomes a labelled positive
    pid = int(run.ids[0, 6])
    cand, lab = np.asarray(st.candidates), np.asarray(st.labels)
    assert pid not in cand[0][lab[0] > 0]
    cand2 = np.concatenate([cand, np.full((cand.shape[0], 1), -1, np.int32)], axis=1)
    lab2 = np.concatenate([lab, np.zeros((lab.shape[0], 1), np.uint8)], axis=1)
    cand2[0, -1], lab2[0, -1] = pid, 1
    planted = audit_miners(_Relabelled(st, cand2, lab2), ["cosine"], depth=20).curves[0]
    diff = planted.hits - cos.hits
    assert diff[6] == 1 and np.abs(diff).sum() == 1

    paths = write_audit(res, tmp_path / "audit")
    data = json.loads(paths["results"].read_text())
    assert [m["miner"] for m in data["miners"]] == ["cosine", "bm25"]
    assert data["miners"][0]["hits"] == cos.hits.tolist()
    assert paths["plot"].stat().st_size > 0 and "guard depth" in paths["table"].read_text()


def test_audit_cli(scifact_store, tmp_path):
    st = scifact_store["test"]
    out = tmp_path / "a"
    res = CliRunner().invoke(
        app,
        [
            "audit",
            "-s",
            str(st.path),
            "--miner",
            "cosine",
            "--depth",
            "10",
            "--max-queries",
            "50",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert data["n_queries"] == 50 and data["miners"][0]["depth"] == 10
    assert "| cosine | 50 |" in res.output
    bad = CliRunner().invoke(app, ["audit", "-s", str(st.path), "--miner", "nope"])
    assert bad.exit_code == 2 and "unknown system" in bad.output
