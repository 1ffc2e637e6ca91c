import numpy as np
import pytest

from treerank.training.holdout import holdout_split
from treerank.training.sampler import (
    ContrastiveSampler,
    collision_mask,
    guard_mined_negatives,
    hard_negative_pool,
    relevant_lists,
    text_keys,
)

# 4 queries; K = 4 candidates. Grades: 1 = relevant, 0 = shown but not selected.
CAND = np.array(
    [
        [5, 7, 1, -1],  # q0: relevant 5 and 7, negative 1
        [7, 2, -1, -1],  # q1: relevant 7, negative 2
        [9, 7, -1, -1],  # q2: relevant 9, negative 7 (7 is relevant to q0/q1, negative here)
        [3, 4, 6, 8],  # q3: relevant 3, negatives 4 6 8
    ],
    dtype=np.int32,
)
LAB = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=np.uint8)


def _check_batch(batch, relevant, labelled, pool):
    cols = batch.passage_rows
    assert np.all(np.diff(cols) > 0)  # unique, ascending: duplicates merged
    assert np.all(batch.positive.sum(axis=1) == 1)
    known = {int(q): set(labelled[q][labelled[q] >= 0].tolist()) for q in batch.query_rows}
    for i, q in enumerate(batch.query_rows):
        rel = set(relevant[q][relevant[q] >= 0].tolist())
        lab = set(known[int(q)])
        for other in batch.query_rows:  # the collision rule: rows sharing a labelled passage
            if other != q and known[int(other)] & known[int(q)]:
                lab |= known[int(other)]
        designated = int(cols[batch.positive[i]][0])
        assert designated in rel
        for j, pid in enumerate(cols.tolist()):
            # exact mask: every labelled passage (its own or a colliding query's) except the
            # designated positive, nothing else
            assert batch.mask_out[i, j] == (pid in lab and pid != designated)
    # every column is some query's positive or a hard negative from a pool
    allowed = set(pool[pool >= 0].tolist()) | set(relevant[relevant >= 0].tolist())
    assert set(cols.tolist()) <= allowed


def test_batches_have_exact_masks_over_many_draws():
    relevant, labelled = relevant_lists(CAND, LAB)
    pool = hard_negative_pool(CAND, LAB, source="candidates")
    s = ContrastiveSampler(CAND, LAB, batch_size=4, n_hard=2, hard_pool=pool, seed=3)
    seen_shared_column = False
    for epoch in range(40):
        for batch in s.epoch(epoch):
            _check_batch(batch, relevant, labelled, pool)
            seen_shared_column |= bool((batch.positive.sum(axis=0) > 1).any())
    assert (
        seen_shared_column
    )  # q0 and q1 both drew passage 7 at least once: one column, 2 positives


def test_duplicate_passage_is_positive_for_one_query_and_negative_for_another():
    relevant, labelled = relevant_lists(CAND, LAB)
    pool = hard_negative_pool(CAND, LAB, source="candidates")
    s = ContrastiveSampler(CAND, LAB, batch_size=4, n_hard=1, hard_pool=pool)
    rng = np.random.default_rng(0)
    batch = s.make_batch(np.array([1, 2]), rng)  # q1 positive 7; q2's only negative is 7
    col7 = int(np.searchsorted(batch.passage_rows, 7))
    assert batch.passage_rows.tolist() == [2, 7, 9] or batch.passage_rows.tolist() == [7, 9]
    assert batch.positive[0, col7] and not batch.mask_out[0, col7]
    assert not batch.positive[1, col7] and not batch.mask_out[1, col7]  # a true negative for q2


def test_other_relevant_passage_in_batch_is_masked():
    s = ContrastiveSampler(CAND, LAB, batch_size=4, n_hard=0)
    for seed in range(20):
        batch = s.make_batch(np.array([0, 1]), np.random.default_rng(seed))
        cols = batch.passage_rows.tolist()
        if cols == [5, 7]:  # q0 drew 5, q1 drew 7: 7 is relevant to q0 -> masked for q0
            assert batch.mask_out[0].tolist() == [False, True]
            assert batch.positive.tolist() == [[True, False], [False, True]]
            return
    pytest.fail("q0 never drew passage 5")


def test_seeded_and_deterministic():
    pool = hard_negative_pool(CAND, LAB, source="candidates")
    a = ContrastiveSampler(CAND, LAB, batch_size=2, n_hard=1, hard_pool=pool, seed=7)
    b = ContrastiveSampler(CAND, LAB, batch_size=2, n_hard=1, hard_pool=pool, seed=7)
    for x, y in zip(a.epoch(1), b.epoch(1), strict=True):
        assert np.array_equal(x.query_rows, y.query_rows)
        assert np.array_equal(x.passage_rows, y.passage_rows)
        assert np.array_equal(x.positive, y.positive)
    orders = {tuple(np.concatenate([bt.query_rows for bt in a.epoch(e)])) for e in range(10)}
    assert len(orders) > 1  # epochs reshuffle
    assert len(a) == 2


def test_queries_without_positive_are_skipped():
    lab = LAB.copy()
    lab[3] = 0
    s = ContrastiveSampler(CAND, lab, batch_size=8, drop_last=False)
    assert sorted(s.query_rows.tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match="no training query"):
        ContrastiveSampler(CAND, np.zeros_like(LAB))


def test_hard_negative_pool_sources():
    cand = hard_negative_pool(CAND, LAB, source="candidates")
    assert cand[3].tolist() == [4, 6, 8] and cand[0, 0] == 1 and cand[2, 0] == 7
    mined = np.array([[7, 5, 11, 12], [7, 13, -1, 14], [9, 7, 15, 16], [3, 17, 18, 19]])
    got = hard_negative_pool(CAND, LAB, mined, source="mined")
    # labelled passages removed (q0: 5 and 7; q1: 7; q2: 9; q3: 3), rank order kept, compacted
    assert got[0, :2].tolist() == [11, 12]
    assert got[1, :2].tolist() == [13, 14]
    assert got[2, :3].tolist() == [7, 15, 16]  # 7 is not labelled for q2: a valid negative
    assert got[3].tolist() == [17, 18, 19]
    assert hard_negative_pool(CAND, LAB, mined, source="mined", depth=2).shape == (4, 2)
    # auto: candidates have grade-0 entries here
    assert np.array_equal(hard_negative_pool(CAND, LAB, mined, source="auto"), cand)
    # auto without grade-0 candidates (SciFact-like) -> mined
    only_pos = np.where(LAB > 0, CAND, -1).astype(np.int32)
    assert np.array_equal(
        hard_negative_pool(only_pos, LAB, mined, "auto"),
        hard_negative_pool(only_pos, LAB, mined, "mined"),
    )
    with pytest.raises(ValueError, match="no mined array"):
        hard_negative_pool(CAND, LAB, None, source="mined")


def test_guard_skip_top_and_margin_by_hand():
    # 2-d unit vectors: query 0 at angle 0; positive p0 at cos 0.8; negatives at cos 0.9, 0.75, 0.1
    ang = np.arccos([0.8, 0.9, 0.75, 0.1])
    passages = np.stack([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    queries = np.array([[1.0, 0.0]], dtype=np.float32)
    relevant = np.array([[0, -1]])
    mined = np.array([[1, 2, 3]])
    assert guard_mined_negatives(mined, skip_top=1).tolist() == [[-1, 2, 3]]
    kw = dict(query_vectors=queries, passage_vectors=passages, relevant=relevant)
    # margin 0: drop negatives scoring >= the positive (0.9)
    assert guard_mined_negatives(mined, margin=0.0, **kw).tolist() == [[-1, 2, 3]]
    # margin 0.1: also drop 0.75 (>= 0.8 - 0.1)
    assert guard_mined_negatives(mined, margin=0.1, **kw).tolist() == [[-1, -1, 3]]
    with pytest.raises(ValueError, match="needs"):
        guard_mined_negatives(mined, margin=0.1)


def test_holdout_split():
    has = np.array([True] * 8 + [False] * 2)
    tr, va = holdout_split(has, 0.25, seed=1)
    assert va.size == 2 and set(va) <= set(range(8))
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(10))
    tr2, va2 = holdout_split(has, 0.25, seed=1)
    assert np.array_equal(va, va2)
    assert holdout_split(has, 0.5, max_queries=3)[1].size == 3
    assert holdout_split(has, 0.0)[1].size == 0
    with pytest.raises(ValueError):
        holdout_split(has, 1.0)


def test_passage_groups_connect_queries_sharing_a_relevant_passage():
    from treerank.training.holdout import passage_groups

    # q0-q1 share 7; q2 alone; q3 alone; q4 shares 3 with q3; q5 has no relevant passage
    cand = np.array([[5, 7], [7, -1], [9, -1], [3, 4], [3, -1], [1, -1]], dtype=np.int32)
    lab = np.array([[1, 1], [1, 0], [1, 0], [1, 0], [1, 0], [0, 0]], dtype=np.uint8)
    g = passage_groups(cand, lab)
    assert g[0] == g[1] and g[3] == g[4]
    assert len({g[0], g[2], g[3], g[5]}) == 4
    # grouped holdout never splits a group: held-out relevant passages are never training ones
    has = (lab > 0).any(axis=1)
    for seed in range(10):
        tr, va = holdout_split(has, 0.4, seed=seed, groups=g)
        assert va.size >= 2
        train_rel = set(cand[tr][lab[tr] > 0].tolist())
        held_rel = set(cand[va][lab[va] > 0].tolist())
        assert not train_rel & held_rel
        assert 5 not in va  # no relevant passage: never held out


# issue 24 case 8: two training queries with the same text and different positives
TWIN_CAND = np.array([[10, 11, -1], [20, 21, -1], [30, 12, -1], [40, -1, -1]], np.int32)
TWIN_LAB = np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]], np.uint8)
TWIN_TEXTS = ["what causes fever", "what causes fever", "is aspirin safe", "other"]


def _twin_check(batch, keys, labelled) -> None:
    cols = batch.passage_rows.tolist()
    for i, q in enumerate(batch.query_rows):
        own = int(cols[int(np.flatnonzero(batch.positive[i])[0])])
        for k, other in enumerate(batch.query_rows):
            if k == i or keys[q] != keys[other]:
                continue
            theirs = int(cols[int(np.flatnonzero(batch.positive[k])[0])])
            if theirs != own:  # the twin's positive is never an unmasked negative
                assert batch.mask_out[i, cols.index(theirs)], (q, other, theirs)


def test_same_text_queries_never_push_each_others_positive_default_sampler() -> None:
    keys = text_keys(TWIN_TEXTS)
    assert keys[0] == keys[1] and keys[0] != keys[2]
    _, labelled = relevant_lists(TWIN_CAND, TWIN_LAB)
    s = ContrastiveSampler(TWIN_CAND, TWIN_LAB, batch_size=4, n_hard=0, query_keys=keys)
    batch = s.make_batch(np.array([0, 1, 2, 3]), np.random.default_rng(0))
    assert batch.passage_rows.tolist() == [10, 20, 30, 40]
    # q0's row: 20 (its twin's positive) masked; 30 and 40 are true in-batch negatives
    assert batch.mask_out.tolist() == [
        [False, True, False, False],
        [True, False, False, False],
        [False, False, False, False],
        [False, False, False, False],
    ]
    for epoch in range(10):
        for b in s.epoch(epoch):
            _twin_check(b, keys, labelled)
    # without the keys (the old default path) q0's row would leave 20 unmasked
    plain = ContrastiveSampler(TWIN_CAND, TWIN_LAB, batch_size=4, n_hard=0)
    assert not plain.make_batch(np.array([0, 1]), np.random.default_rng(0)).mask_out.any()


def test_same_text_queries_pair_sampler_with_and_without_collision_avoidance() -> None:
    from treerank.training.sources import PairSampler, label_pairs

    keys = text_keys(TWIN_TEXTS)
    pairs = label_pairs(TWIN_CAND, TWIN_LAB, TWIN_TEXTS)
    _, labelled = relevant_lists(TWIN_CAND, TWIN_LAB)
    for collisions in (True, False):
        s = PairSampler([pairs], weights=[1.0], batch_size=4, seed=0, collisions=collisions)
        for epoch in range(5):
            for b in s.epoch(epoch):
                _twin_check(b, keys, labelled)


def test_collision_mask_by_hand() -> None:
    cols = np.array([1, 2, 3, 4])
    keys = np.array([7, 8, 9])
    # rows 0 and 1 share passage 2 (different texts); row 2 collides with nobody
    mask = collision_mask(keys, [np.array([1, 2]), np.array([2, 3, -1]), np.array([4])], cols)
    assert mask.tolist() == [
        [False, True, True, False],
        [True, True, False, False],
        [False, False, False, False],
    ]
