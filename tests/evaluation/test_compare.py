"""compare_systems on a tiny on-disk store: numbers, files, baseline checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.metrics import evaluate_run
from treerank.evaluation.qrels import Qrels
from treerank.search.systems import build_system


def test_compare_writes_everything(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    comp = compare_systems(
        store,
        ["cosine", "bm25", "rrf:bm25+cosine"],
        baseline="cosine",
        k=8,
        out_dir=tmp_path / "out",
        metrics=("mrr@10", "ndcg@10", "recall@5"),
        n_permutations=200,
        second_baseline="bm25",
    )
    cos = evaluate_run(build_system("cosine").retrieve(store, 8), Qrels.from_store(store))
    assert comp.mean("cosine", "mrr@10") == pytest.approx(cos.mean["mrr@10"])
    assert comp.tests["cosine"]["bm25"]["mrr@10"].delta == pytest.approx(
        comp.mean("bm25", "mrr@10") - comp.mean("cosine", "mrr@10")
    )
    assert set(comp.tests) == {"cosine", "bm25"} and "cosine" not in comp.tests["cosine"]
    out = tmp_path / "out"
    res = json.loads((out / "results.json").read_text())
    assert res["systems"]["bm25"]["n_evaluated"] == 4
    assert set(res["mcnemar_hit@10"]["cosine"]) == {"bm25", "rrf:bm25+cosine"}
    lines = (out / "per_query.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 4 and json.loads(lines[0])["query_id"] == "q0"
    assert (out / "runs" / "rrf_bm25+cosine.trec").read_text().startswith("q0 Q0 p")
    assert (out / "plots" / "deltas.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "plots" / "recall_at_k.png").stat().st_size > 1000
    table = (out / "table.md").read_text()
    assert "cosine (baseline)" in table and "Δ ndcg@10" in table
    header, rows = comp.table()
    assert header[:4] == ["system", "mrr@10", "Δ mrr@10", "p"] and len(rows) == 3


def test_baseline_must_be_a_system(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    with pytest.raises(ValueError, match="baseline"):
        compare_systems(store, ["bm25"], baseline="cosine")


def test_threshold_two_leaves_out_queries(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test", threshold=2)
    comp = compare_systems(store, ["cosine"], baseline="cosine", k=8, n_permutations=10)
    r = comp.results["cosine"]
    assert (r.n_evaluated, r.n_left_out) == (1, 3)  # only query 0 has a grade-2 passage
    assert np.isnan(r.per_query["mrr@10"][1])
