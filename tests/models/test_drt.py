"""DRTHead: the DenseScorer equality, slot outputs, slot dropout, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treerank.models.base import DenseScorer
from treerank.models.checkpoint import load_checkpoint, save_checkpoint
from treerank.models.drt import DRTConfig, DRTHead, slot_dropout
from treerank.models.registry import load_model

DIM = 32


def _head(**kw) -> DRTHead:
    torch.manual_seed(0)
    cfg = DRTConfig(
        dim=DIM, k=kw.pop("k", 4), slot_dim=kw.pop("slot_dim", 8), hidden=16, attn_hidden=8, **kw
    )
    return DRTHead(cfg)


def _vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_is_dense_scorer_and_shapes() -> None:
    m = _head()
    assert isinstance(m, DenseScorer)
    q, p = _vectors(5, 1), _vectors(7, 2)
    assert m.encode_queries(q).shape == (5, 32) and m.encode_queries(q).dtype == np.float32
    assert m.encode_passages(p).shape == (7, 32)
    slots = m.query_slots(q)
    assert slots.shape == (5, 4, 8)
    np.testing.assert_allclose(np.linalg.norm(slots, axis=-1), 1.0, atol=1e-6)
    alpha = m.query_alpha(q)
    assert alpha.shape == (5, 4) and np.all(alpha > 0)
    np.testing.assert_allclose(alpha.sum(axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("shared", [True, False])
def test_inner_product_equals_slot_score(shared: bool) -> None:
    """encode_queries(q) . encode_passages(p) == sum_i alpha_i(q) (q_i . p_i), computed per slot."""
    m = _head(shared_towers=shared)
    q, p = _vectors(6, 3), _vectors(9, 4)
    flat = m.encode_queries(q) @ m.encode_passages(p).T
    qs, ps, a = m.query_slots(q), m.passage_slots(p), m.query_alpha(q)
    by_hand = np.zeros((6, 9))
    for i in range(m.k):
        by_hand += a[:, i : i + 1] * (qs[:, i] @ ps[:, i].T)
    np.testing.assert_allclose(flat, by_hand, atol=1e-6)
    with torch.no_grad():
        fwd = m.eval()(torch.from_numpy(q), torch.from_numpy(p)).numpy()
    np.testing.assert_allclose(fwd, by_hand, atol=1e-6)
    assert np.all(np.abs(flat) <= 1 + 1e-6)  # a convex mix of cosines


def test_shared_towers_give_same_slots_both_sides() -> None:
    m = _head(shared_towers=True)
    x = _vectors(4, 5)
    np.testing.assert_array_equal(m.query_slots(x), m.passage_slots(x))
    m2 = _head(shared_towers=False)
    assert not np.allclose(m2.query_slots(x), m2.passage_slots(x))


def test_slot_dropout_preserves_expected_magnitude() -> None:
    p = 0.15
    x = torch.ones(20000, 6, 4)
    g = torch.Generator().manual_seed(0)
    y = slot_dropout(x, p, generator=g)
    kept = y[:, :, 0] != 0
    # whole slots are dropped, survivors are scaled by exactly 1 / (1 - p)
    survivor = torch.isclose(y, torch.tensor(1 / (1 - p)), rtol=1e-6, atol=0)
    assert torch.all((y == 0).all(dim=-1) | survivor.all(dim=-1))
    assert abs(1 - kept.float().mean().item() - p) < 0.01
    assert abs(y.mean().item() - 1.0) < 0.01
    assert slot_dropout(x, 0.0) is x
    with pytest.raises(ValueError):
        slot_dropout(x, 1.0)


def test_training_mode_applies_dropout_to_queries_only() -> None:
    m = _head(slot_dropout=0.5)
    q = torch.from_numpy(_vectors(3, 6))
    m.train()
    torch.manual_seed(1)
    n = 4000  # each row of one big batch draws its own mask
    draws = m.query_tower(q.repeat(n, 1)).detach().view(n, 3, -1)
    eval_q = torch.from_numpy(m.encode_queries(q.numpy()))
    # some slots are zeroed, and the expectation equals the eval-mode vector
    assert (draws.view(n, 3, m.k, -1).abs().sum(-1) == 0).any()
    assert torch.allclose(draws.mean(0), eval_q, atol=0.03)
    # the recorded slots are the un-dropped ones (the decorrelation term sees them)
    assert m.last_query_slots is not None
    np.testing.assert_allclose(
        m.last_query_slots.detach().numpy(), m.query_slots(q.numpy()), atol=1e-6
    )
    # passages are never dropped
    m.train()
    p1, p2 = m.passage_tower(q), m.passage_tower(q)
    assert torch.equal(p1, p2)


@pytest.mark.parametrize("shared", [True, False])
def test_checkpoint_round_trip(tmp_path, shared: bool) -> None:
    m = _head(shared_towers=shared)
    save_checkpoint(tmp_path / "ck", m.to_checkpoint("enc", "fp123", extra={"epochs": 1}))
    ck = load_checkpoint(tmp_path / "ck", "fp123")
    assert ck.model_type == "drt" and ck.config["k"] == 4 and ck.extra == {"epochs": 1}
    n_passage_keys = sum(k.startswith("passage_decomposer.") for k in ck.state)
    assert (n_passage_keys == 0) == shared  # a shared decomposition is stored once
    m2 = load_model(tmp_path / "ck", "fp123")
    assert isinstance(m2, DRTHead) and m2.config == m.config
    x = _vectors(5, 7)
    np.testing.assert_array_equal(m.encode_queries(x), m2.encode_queries(x))
    np.testing.assert_array_equal(m.encode_passages(x), m2.encode_passages(x))


def test_errors() -> None:
    m = _head()
    with pytest.raises(ValueError, match=r"\(n, 32\)"):
        m.encode_queries(np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="slot_dropout"):
        DRTConfig(dim=4, slot_dropout=1.0)
    with pytest.raises(ValueError, match="unknown DRT model option"):
        DRTConfig.from_dict({"dim": 4, "slots": 3})
    ck = m.to_checkpoint("e", "f")
    ck.model_type = "mlp"
    with pytest.raises(ValueError, match="holds a .mlp. model, not .drt."):
        DRTHead.from_checkpoint(ck)
    assert m.encode_queries(np.zeros((0, DIM), np.float32)).shape == (0, 32)
