"""A grouped holdout on connected qrels (issue 33): CISI's 39 training queries, 38 of them in
one passage-connected group. Whole groups held out 38 queries and trained on 1; the holdout is
now capped at its fraction (the giant group is split) and accounted for."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.training.holdout import (
    MIN_TRAINING_QUERIES,
    HoldoutError,
    holdout_split,
    passage_groups,
)


def cisi_shaped() -> tuple[np.ndarray, np.ndarray]:
    """39 queries: q0..q37 chained (q_i and q_i+1 share passage i), q38 alone (passage 100);
    each query has two relevant passages (candidates ``int32 (39, 2)``)."""
    cand = np.array([[i, i + 1] for i in range(38)] + [[100, 101]], np.int32)
    return cand, np.ones_like(cand, dtype=np.uint8)


def test_the_fixture_is_one_giant_group_and_a_singleton() -> None:
    cand, lab = cisi_shaped()
    g = passage_groups(cand, lab)
    assert np.bincount(g).tolist() == [38, 1]


@pytest.mark.parametrize("seed", range(6))
def test_holdout_is_capped_at_its_fraction(seed: int) -> None:
    cand, lab = cisi_shaped()
    has = np.ones(39, bool)
    stats: dict[str, int] = {}
    tr, va = holdout_split(has, 0.2, seed, 2000, passage_groups(cand, lab), stats=stats)
    # round(0.2 * 39) = 8 held out, 31 trained on: what group_by_passage: false gives
    assert va.size == 8 and tr.size == 31
    assert stats == {
        "heldout_queries": 8,
        "training_queries": 31,
        "target_heldout": 8,
        "split_groups": 1,
    }
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(39))
    again = holdout_split(has, 0.2, seed, 2000, passage_groups(cand, lab))[1]
    assert np.array_equal(va, again)  # seeded


def test_groups_that_fit_are_kept_whole() -> None:
    # three groups of 2 and one of 10: target round(0.25 * 16) = 4 -> the old draw could hold
    # out 10 + ...; capped: whole small groups first, the big group split only if needed
    cand = np.array(
        [[0, 1], [1, 2]] + [[10, 11], [11, 12]] + [[20, 21], [21, 22]]
        + [[30 + i, 31 + i] for i in range(10)],
        np.int32,
    )  # fmt: skip
    lab = np.ones_like(cand, dtype=np.uint8)
    g = passage_groups(cand, lab)
    has = np.ones(16, bool)
    for seed in range(20):
        stats: dict[str, int] = {}
        tr, va = holdout_split(has, 0.25, seed, None, g, stats=stats)
        assert va.size <= 2.0 * 4, (seed, va.size)
        if stats["split_groups"]:
            assert va.size == 4


def test_too_few_training_queries_is_refused_with_advice() -> None:
    has = np.array([True, True])
    with pytest.raises(HoldoutError, match=r"leaves 1 training query .*lower validation\.fraction"):
        holdout_split(has, 0.5, 0)
    assert MIN_TRAINING_QUERIES == 2
    assert holdout_split(np.array([True]), 0.2, 0)[1].size == 0  # nothing held out: no refusal


def test_accounting_counts_by_hand_and_reaches_the_report_table() -> None:
    from treerank.pipeline.report import _training_rows
    from treerank.tasks.train import training_accounting

    # 4 queries: q0 2 positives, q1 1, q2 none, q3 1; q3 held out
    relevant = np.array([[1, 1], [1, 0], [0, 0], [0, 1]], bool)
    has = relevant.any(axis=1)
    acc = training_accounting(
        relevant, has, np.array([0, 1, 2]), np.array([3]), {"split_groups": 1}
    )
    assert acc == {
        "training_queries": 2,
        "positive_pairs": 3,
        "heldout_queries": 1,
        "split_groups": 1,
    }
    (row,) = _training_rows("lin", {"summary": {**acc, "steps": 7}})
    assert row == (
        "| `lin` | training_queries=2, positive_pairs=3, heldout_queries=1, split_groups=1, "
        "steps=7 |"
    )
