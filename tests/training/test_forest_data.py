"""Forest training data: per-pair seeds and draws; examples from the shared data.sources."""

from __future__ import annotations

import numpy as np

from treerank.forest.data import pair_seed


def test_pair_seed_draws_do_not_depend_on_the_group() -> None:
    a = np.random.default_rng(pair_seed(0, 5)).integers(1 << 30, size=4)
    b = np.random.default_rng(pair_seed(0, 5)).integers(1 << 30, size=4)
    c = np.random.default_rng(pair_seed(0, 6)).integers(1 << 30, size=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def _pairs(name, rows, ids, weights, exclude, mode="sample"):
    from treerank.training.sources import PairSet

    return PairSet(
        name,
        np.asarray(rows, np.int64),
        np.asarray(ids, np.int64),
        np.asarray(weights, np.float32),
        np.asarray(exclude, np.int64),
        np.arange(len(rows), dtype=np.int64),
        mode,
    )


def test_source_pairs_by_hand(toy_store) -> None:
    """Labels (sample) + a soft teacher + pseudo rows: positives, weights, exclusions by hand."""
    from types import SimpleNamespace

    from treerank.forest.data import source_pair_data
    from treerank.training.data import SourceSpec

    st = toy_store  # 96 queries, 400 passages; query i's gold passage is candidates[i, 0]
    gold = st.candidates[:, 0].astype(np.int64)
    st.labels[2, 1], st.candidates[2, 1] = 0, 7  # a judged non-selected candidate of query 2
    pseudo_q = st.queries[:2] * 0.5 + st.queries[2:4] * 0.5
    table = SimpleNamespace(
        queries=np.concatenate([st.queries, pseudo_q / np.linalg.norm(pseudo_q, axis=1)[:, None]]),
        passages=st.passages,
        sources=[
            _pairs("labels", [0, 2], [[gold[0]], [gold[2]]], [[1.0], [1.0]], [[-1], [-1]]),
            # soft teacher over query 2: top-1 by mass is passage 11 (0.6); 12 (0.4) is dropped
            _pairs("teacher", [2], [[12, 11]], [[0.4, 0.6]], [[gold[2]]], mode="soft"),
            # pseudo-queries are table rows 96, 97; the second repeats query 0's gold passage
            _pairs("pseudo", [96, 97], [[5], [gold[0]]], [[1.0], [1.0]], [[-1], [-1]]),
        ],
    )
    specs = [
        SourceSpec(kind="labels", weight=1.0),
        SourceSpec(kind="teacher", system="bm25", weight=0.5, mode="soft", n_positives=1),
        SourceSpec(kind="pseudo", weight=2.0),
    ]
    view, data = source_pair_data(st, table, specs, hard_negatives=2)
    assert view.n_passages == 400 and view.n_queries == 98
    assert data.queries.tolist() == [0, 2, 96, 97]
    got = sorted(
        zip(
            data.queries[data.pos_q].tolist(),
            data.pos_p.tolist(),
            data.pos_weight.tolist(),
            strict=True,
        )
    )
    want = sorted(
        [(0, gold[0], 1.0), (2, gold[2], 1.0), (2, 11, 0.5), (96, 5, 2.0), (97, gold[0], 2.0)]
    )
    assert got == want
    neg = set(zip(data.queries[data.neg_q].tolist(), data.neg_p.tolist(), strict=True))
    assert (2, 7) in neg  # the judged non-selected candidate
    # two mined per query, never a positive of the query nor an excluded passage (query 2: gold)
    for q in data.queries.tolist():
        pos = {p for qq, p, _ in want if qq == q}
        sims = view.passages @ view.queries[q]
        ranked = [int(p) for p in np.argsort(-sims, kind="stable") if p not in pos][:2]
        assert {p for qq, p in neg if qq == q} == set(ranked) | ({7} if q == 2 else set())
    assert {1 * 400 + 11, 1 * 400 + int(gold[2])} <= set(data.pos_keys.tolist())  # query index 1
