"""TREC run / qrels files: round trips and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.evaluation.qrels import Qrels
from treerank.evaluation.trec_io import (
    read_qrels,
    read_trec_run,
    run_from_dict,
    write_qrels,
    write_trec_run,
)
from treerank.search.run import Run


def test_run_round_trip(tmp_path) -> None:
    run = Run(
        "my sys",
        np.array([[2, 0, -1], [1, 2, 0]]),
        np.array([[0.9, 0.5, -np.inf], [3.0, 2.0, 1.0]]),
    )
    qids, pids = ["q1", "q2"], ["d0", "d1", "d2"]
    path = write_trec_run(tmp_path / "r.trec", run, qids, pids)
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d2 1 0.9 my_sys"
    assert len(lines) == 5
    back = run_from_dict("x", read_trec_run(path), qids, {p: i for i, p in enumerate(pids)})
    assert back.ids.tolist() == run.ids.tolist()
    np.testing.assert_allclose(back.scores[1], [3.0, 2.0, 1.0])


def test_qrels_round_trip_and_errors(tmp_path) -> None:
    q = Qrels(np.array([[1, 2], [0, -1]]), np.array([[2, 0], [1, 0]]))
    path = write_qrels(tmp_path / "q.txt", q, ["a", "b"], ["d0", "d1", "d2"])
    assert read_qrels(path) == {"a": {"d1": 2}, "b": {"d0": 1}}
    q2 = Qrels.from_dict(read_qrels(path), ["a", "b"], {"d0": 0, "d1": 1, "d2": 2})
    assert q2.n_relevant().tolist() == [1, 1]
    (tmp_path / "bad.txt").write_text("a 0 d1\n")
    with pytest.raises(ValueError, match=r"bad.txt:1"):
        read_qrels(tmp_path / "bad.txt")
    (tmp_path / "bad.trec").write_text("a Q0 d1 x 1.0 t\n")
    with pytest.raises(ValueError, match=r"bad.trec:1: rank/score"):
        read_trec_run(tmp_path / "bad.trec")
