"""``treerank evaluate --sample-queries N --sample-seed S`` on the 10-query MS MARCO sample (real
texts): one seeded query sample for every system, recorded in results.json, scored against
every passage, refused when it asks for more queries than there are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings
from treerank.store.view import QuerySubset


def _evaluate(store: Any, out: Path, *extra: str) -> Any:
    return CliRunner().invoke(
        app,
        [
            "evaluate",
            "--store",
            str(store.path),
            "--system",
            "bm25",
            "--baseline",
            "cosine",
            "--k",
            "20",
            "--permutations",
            "200",
            "--no-progress",
            "--no-overlap",
            "-o",
            str(out),
            *extra,
        ],
    )


def test_sample_is_seeded_shared_by_every_system_and_recorded(
    msmarco_store: dict[str, Any], tmp_path: Path
) -> None:
    ms = msmarco_store["validation"]
    res = _evaluate(ms, tmp_path / "a", "--sample-queries", "4", "--sample-seed", "7")
    assert res.exit_code == 0, res.output
    assert "a seeded query sample: 4 of 10 queries (--sample-seed 7)" in res.output
    doc = json.loads((tmp_path / "a" / "results.json").read_text(encoding="utf-8"))
    assert doc["settings"]["sample"]["queries"] == 4
    assert doc["settings"]["sample"]["seed"] == 7
    assert doc["settings"]["sample"]["of_queries"] == 10
    assert doc["settings"]["n_queries"] == 4
    for name in ("cosine", "bm25"):
        assert doc["systems"][name]["n_evaluated"] == 4
    # the rows: numpy's seeded choice among the queries with a relevant passage, split order
    cand, lab = np.asarray(ms.candidates), np.asarray(ms.labels)
    eligible = np.flatnonzero(((cand >= 0) & (lab >= int(ms.relevance_threshold))).any(axis=1))
    rows = np.sort(np.random.default_rng(7).choice(eligible, size=4, replace=False))
    want = compare_systems(
        QuerySubset(ms, rows),
        ["cosine", "bm25"],
        settings=EvaluationSettings(
            baseline="cosine", k=20, n_permutations=200, metrics=tuple(doc["metrics"])
        ),
    )
    for name in ("cosine", "bm25"):
        for metric, value in want.results[name].mean.items():
            assert doc["systems"][name]["mean"][metric] == pytest.approx(value, abs=1e-12)
    ids = [ms.query_ids()[int(r)] for r in rows]
    lines = (tmp_path / "a" / "per_query.jsonl").read_text(encoding="utf-8").splitlines()
    seen = {json.loads(line)["query_id"] for line in lines}
    assert seen == set(ids)
    # the same seed gives the same sample; another seed another one
    again = _evaluate(ms, tmp_path / "b", "--sample-queries", "4", "--sample-seed", "7")
    other = _evaluate(ms, tmp_path / "c", "--sample-queries", "4", "--sample-seed", "8")
    assert again.exit_code == 0 and other.exit_code == 0
    b = json.loads((tmp_path / "b" / "results.json").read_text(encoding="utf-8"))
    assert {n: r["mean"] for n, r in b["systems"].items()} == {
        n: r["mean"] for n, r in doc["systems"].items()
    }
    per_c = (tmp_path / "c" / "per_query.jsonl").read_text(encoding="utf-8").splitlines()
    assert {json.loads(line)["query_id"] for line in per_c} != seen


@pytest.mark.parametrize(
    ("n", "match"),
    [
        ("6", "--sample-queries 6 asks for more queries than the 5 with a relevant passage"),
        ("0", ">= 1"),
    ],
)
def test_bad_sample_exits_2_before_any_work(
    msmarco_store: dict[str, Any], tmp_path: Path, n: str, match: str
) -> None:
    res = _evaluate(msmarco_store["validation"], tmp_path / "out", "--sample-queries", n)
    assert res.exit_code == 2
    assert match in " ".join(res.output.split())
    assert not (tmp_path / "out" / "results.json").exists()
