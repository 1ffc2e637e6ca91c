"""DRT scoring variants: the registry, and the reductions to cosine that must hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treerank.diagnostics.variants import (
    VARIANTS,
    default_variant_names,
    get_variant,
    l2_normalize,
    top_m_alpha,
)
from treerank.models.drt import DRTConfig, DRTHead


def _slots(n: int, k: int, d_s: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.random.default_rng(seed).standard_normal((n, k, d_s)).astype(np.float32)
    return l2_normalize(raw), raw


def _scores(name: str, k: int, qs, qraw, alpha, ps, praw) -> np.ndarray:
    v = get_variant(name, k)
    return v.query_vectors(qs, alpha, qraw) @ v.passage_vectors(ps, praw).T


def _alpha(n: int, k: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).random((n, k)).astype(np.float32) + 0.1
    return a / a.sum(axis=1, keepdims=True)


def test_k1_every_variant_is_the_cosine_of_the_slot() -> None:
    (qs, qraw), (ps, praw) = _slots(5, 1, 6, 0), _slots(8, 1, 6, 1)
    alpha = np.ones((5, 1), np.float32)
    cosine = l2_normalize(qraw[:, 0]) @ l2_normalize(praw[:, 0]).T
    for name in default_variant_names(1):
        np.testing.assert_allclose(_scores(name, 1, qs, qraw, alpha, ps, praw), cosine, atol=1e-6)


def test_uniform_alpha_equals_concat_cosine() -> None:
    k = 4
    (qs, qraw), (ps, praw) = _slots(6, k, 5, 2), _slots(9, k, 5, 3)
    alpha = _alpha(6, k, 4)
    uniform = _scores("uniform", k, qs, qraw, alpha, ps, praw)
    concat = _scores("concat-cosine", k, qs, qraw, alpha, ps, praw)
    np.testing.assert_allclose(uniform, concat, atol=1e-6)
    # and both are plain cosine of the concatenated unit slots
    flat_q, flat_p = qs.reshape(6, -1), ps.reshape(9, -1)
    cos = (flat_q @ flat_p.T) / (
        np.linalg.norm(flat_q, axis=1)[:, None] * np.linalg.norm(flat_p, axis=1)
    )
    np.testing.assert_allclose(concat, cos, atol=1e-6)
    # learned alpha with alpha = 1/k is uniform
    flat = np.full((6, k), 1 / k, np.float32)
    np.testing.assert_allclose(_scores("learned", k, qs, qraw, flat, ps, praw), uniform, atol=1e-6)


def test_learned_slot_and_top2_by_hand() -> None:
    k = 3
    (qs, qraw), (ps, praw) = _slots(4, k, 2, 5), _slots(5, k, 2, 6)
    alpha = _alpha(4, k, 7)
    slot_cos = np.stack([qs[:, i] @ ps[:, i].T for i in range(k)], axis=-1)  # (4, 5, k)
    np.testing.assert_allclose(
        _scores("learned", k, qs, qraw, alpha, ps, praw),
        (slot_cos * alpha[:, None, :]).sum(-1),
        atol=1e-6,
    )
    for i in range(k):
        np.testing.assert_allclose(
            _scores(f"slot-{i}", k, qs, qraw, alpha, ps, praw), slot_cos[..., i], atol=1e-6
        )
    a2 = top_m_alpha(alpha, 2)
    assert np.all((a2 > 0).sum(axis=1) == 2)
    np.testing.assert_allclose(a2.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(
        _scores("top2", k, qs, qraw, alpha, ps, praw),
        (slot_cos * a2[:, None, :]).sum(-1),
        atol=1e-6,
    )
    # ties keep the lower slot index
    np.testing.assert_array_equal(
        top_m_alpha(np.array([[0.25, 0.25, 0.25, 0.25]]), 2), [[0.5, 0.5, 0, 0]]
    )


def test_concat_raw_cosine_uses_prenormalised_slots() -> None:
    k = 2
    (qs, qraw), (ps, praw) = _slots(3, k, 4, 8), _slots(4, k, 4, 9)
    got = _scores("concat-raw-cosine", k, qs, qraw, _alpha(3, k, 1), ps, praw)
    want = l2_normalize(qraw.reshape(3, -1)) @ l2_normalize(praw.reshape(4, -1)).T
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_learned_variant_equals_the_model() -> None:
    torch.manual_seed(0)
    m = DRTHead(DRTConfig(dim=12, k=3, slot_dim=4, hidden=8, attn_hidden=4))
    rng = np.random.default_rng(0)
    q, p = (
        rng.standard_normal((5, 12)).astype(np.float32),
        rng.standard_normal((6, 12)).astype(np.float32),
    )
    v = get_variant("learned")
    qraw, praw = m.query_raw_slots(q), m.passage_raw_slots(p)
    got = (
        v.query_vectors(l2_normalize(qraw), m.query_alpha(q), qraw)
        @ v.passage_vectors(l2_normalize(praw), praw).T
    )
    np.testing.assert_allclose(got, m.encode_queries(q) @ m.encode_passages(p).T, atol=1e-6)


def test_registry() -> None:
    assert default_variant_names(3) == [*VARIANTS, "slot-0", "slot-1", "slot-2"]
    assert {"learned", "uniform", "concat-cosine", "top2"} <= set(VARIANTS)
    with pytest.raises(KeyError, match="slot-0..slot-2"):
        get_variant("slot-3", 3)
    with pytest.raises(KeyError, match="unknown DRT scoring variant"):
        get_variant("bogus")
