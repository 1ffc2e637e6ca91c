"""TREC run / qrels files: round trips and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.evaluation.trec_io import (
    read_qrels,
    read_trec_run,
    run_from_dict,
    trec_scores,
    write_qrels,
    write_trec_run,
)
from treerank.metrics.qrels import Qrels
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


def test_scores_round_trip_float32_and_keep_tie_order(tmp_path) -> None:
    # issue 10, item 4: "%.6g" made neighbouring float32 scores equal text and trec_eval then
    # re-ordered them; ties broken by passage id must survive too
    a = np.float32(0.61234567)
    b = np.nextafter(a, np.float32(0))  # one float32 step below: equal under %.6g
    assert f"{float(a):.6g}" == f"{float(b):.6g}"
    scores = np.array([[a, b, b, b, 1e-30, 0.0, 0.0, -3.5]], np.float32)
    texts = trec_scores(scores[0])
    got = [np.float32(float(t)) for t in texts]  # as trec_eval reads them (float32)
    assert all(x > y for x, y in zip(got, got[1:], strict=False))  # strictly decreasing
    below = np.nextafter(b, np.float32(-1))
    want = [a, b, below, np.nextafter(below, np.float32(-1)), 1e-30, 0.0, -1e-45, -3.5]
    assert got == np.array(want, np.float32).tolist()  # untied scores round-trip exactly
    assert texts[:2] == ["0.6123457", "0.61234564"] and texts[4:] == [
        "1e-30",
        "0",
        "-1e-45",
        "-3.5",
    ]
    # ir-measures re-sorts by score (ties by doc id descending): it must keep treerank's order
    ids = np.array([[7, 6, 1, 5, 4, 0, 3, 2]])
    pids = [f"d{i}" for i in range(8)]
    path = write_trec_run(tmp_path / "r.trec", Run("r", ids, scores), ["q"], pids)
    import ir_measures
    from ir_measures import RR

    for rel in range(8):  # the relevant doc at each rank gives RR 1 / (rank)
        qrels = {"q": {pids[ids[0, rel]]: 1}}
        got = ir_measures.calc_aggregate([RR], qrels, ir_measures.read_trec_run(str(path)))
        assert got[RR] == pytest.approx(1.0 / (rel + 1))


def test_ids_with_white_space_are_not_written(tmp_path) -> None:
    run = Run("r", np.array([[0]]), np.array([[1.0]]))
    with pytest.raises(ValueError, match="'doc 1' is empty or holds white space"):
        write_trec_run(tmp_path / "r.trec", run, ["q"], ["doc 1"])


def test_read_qrels_rejects_conflicting_grades(tmp_path) -> None:
    p = tmp_path / "q.txt"
    p.write_text("a 0 d1 1\na 0 d1 1\nb 0 d1 2\n")
    assert read_qrels(p) == {"a": {"d1": 1}, "b": {"d1": 2}}
    p.write_text("a 0 d1 1\nb 0 d1 2\na 0 d1 2\n")
    with pytest.raises(
        ValueError, match=r"q\.txt:3: query a judges d1 twice with different grades"
    ):
        read_qrels(p)
