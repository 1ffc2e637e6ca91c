"""Per-query failure analysis between two systems."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.diagnostics.failures import failure_analysis, per_query_delta


def test_delta_and_summary() -> None:
    a = np.array([1.0, 0.5, 0.0, np.nan, 0.2, 0.9])
    b = np.array([0.5, 0.5, 1.0, 0.3, 0.1, 0.0])
    np.testing.assert_allclose(per_query_delta(a, b), [0.5, 0.0, -1.0, np.nan, 0.1, 0.9])
    texts = ["short one", "a b c d e f g", "x " * 12, "left out", "who is it", "what is that thing"]
    rep = failure_analysis(
        a,
        b,
        texts,
        query_types=["t1", "t2", "t1", "t2", "t1", "t2"],
        groups={"entity": ["no", "no", "no", "no", "yes", "yes"]},
        top_n=2,
        n_examples=1,
        name_a="drt",
        name_b="cos",
        metric="ndcg@10",
    )
    s = rep["summary"]
    assert (s["n_evaluated"], s["n_left_out"], s["wins"], s["losses"], s["ties"]) == (5, 1, 3, 1, 1)
    assert s["mean_delta"] == pytest.approx((0.5 + 0 - 1 + 0.1 + 0.9) / 5)
    assert s["mean_drt"] == pytest.approx((1 + 0.5 + 0 + 0.2 + 0.9) / 5)
    # top wins: largest deltas first (0.9 then 0.5), losses most negative first
    assert rep["top_wins"]["n"] == 2 and rep["top_wins"]["examples"][0]["query_index"] == 5
    assert rep["top_wins"]["examples"][0]["drt"] == 0.9
    assert rep["top_losses"]["n"] == 1 and rep["top_losses"]["examples"][0]["length"] == "11+"
    prof = rep["top_wins"]["profile"]
    assert prof["type"] == {
        "t2": {"n": 1, "share": 0.5, "mean_delta": 0.9},
        "t1": {"n": 1, "share": 0.5, "mean_delta": 0.5},
    }
    assert prof["length"]["<=5"]["n"] == 2
    assert rep["all"]["length"]["<=5"]["n"] == 3
    assert rep["delta"][3] is None
    assert prof["entity"] == {
        "no": {"n": 1, "share": 0.5, "mean_delta": 0.5},
        "yes": {"n": 1, "share": 0.5, "mean_delta": 0.9},
    }
    assert rep["top_losses"]["profile"]["entity"] == {
        "no": {"n": 1, "share": 1.0, "mean_delta": -1.0}
    }


def test_errors() -> None:
    with pytest.raises(ValueError):
        per_query_delta(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="query texts"):
        failure_analysis(np.zeros(2), np.zeros(2), ["a"])
