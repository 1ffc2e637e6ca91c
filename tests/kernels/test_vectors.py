"""One normalisation rule: every "cosine" in treerank L2-normalises, tested on a store whose
vectors are not unit length (``normalized: false``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tests.training.conftest import make_toy_store
from treerank.diagnostics.procedure import _run_ids
from treerank.forest.data import mine_hard_negatives
from treerank.kernels.device import DEFAULT_DEVICE
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.search.specs import parse_spec
from treerank.training.sampler import guard_mined_negatives


def _non_normalised():
    unit = make_toy_store(n_queries=40, n_passages=200, seed=3)
    rng = np.random.default_rng(0)
    qs = rng.uniform(0.2, 5.0, size=(unit.n_queries, 1)).astype(np.float32)
    ps = rng.uniform(0.2, 5.0, size=(unit.n_passages, 1)).astype(np.float32)
    raw = dataclasses.replace(unit, queries=unit.queries * qs, passages=unit.passages * ps)
    # the test can fail: raw inner products rank differently from cosine on this store
    dot_top, _ = exact_search(raw.queries, raw.passages, k=10)
    cos_top, _ = exact_search(unit.queries, unit.passages, k=10)
    assert (dot_top[:, 0] != cos_top[:, 0]).mean() > 0.3
    return unit, raw


def test_l2_normalize_unit_rows_and_zero_rows() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(l2_normalize(x), [[0.6, 0.8], [0.0, 0.0]])


def test_diagnostics_baseline_is_the_cosine_system() -> None:
    unit, raw = _non_normalised()
    want, _ = exact_search(unit.queries, unit.passages, k=10)
    np.testing.assert_array_equal(_run_ids(parse_spec("cosine"), raw, 10, DEFAULT_DEVICE), want)


def test_forest_mining_is_cosine() -> None:
    unit, raw = _non_normalised()
    pos_q = np.arange(unit.n_queries, dtype=np.int64)
    pos_p = unit.candidates[:, 0].astype(np.int64)
    got = mine_hard_negatives(raw.queries, raw.passages, pos_q, pos_p, 5)
    want = mine_hard_negatives(unit.queries, unit.passages, pos_q, pos_p, 5)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].size == 5 * unit.n_queries


def test_sampler_margin_guard_is_cosine() -> None:
    # unit case by hand: query at angle 0; positive p0 at cos 0.8; negatives at 0.9, 0.75, 0.1
    ang = np.arccos([0.8, 0.9, 0.75, 0.1])
    passages = np.stack([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    queries = np.array([[1.0, 0.0]], dtype=np.float32)
    relevant, mined = np.array([[0, -1]]), np.array([[1, 2, 3]])
    # scaled rows: raw dots would be 12 (pos) vs 2.25, 7.5, 3.5 and drop nothing at margin 0.1
    scale = np.array([[3.0], [0.5], [2.0], [7.0]], np.float32)
    got = guard_mined_negatives(
        mined,
        margin=0.1,
        query_vectors=queries * 5,
        passage_vectors=passages * scale,
        relevant=relevant,
    )
    assert got.tolist() == [[-1, -1, 3]]
