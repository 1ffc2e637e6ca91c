"""Forest model: stacked classifiers, class prediction, not-retrievable outcome, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treerank.families import load_model
from treerank.forest.model import (
    NOT_RETRIEVABLE,
    Forest,
    ForestConfig,
    passage_init_from_query,
    stacked_forward,
)
from treerank.models.checkpoint import load_checkpoint, save_checkpoint


def _hand_forest(nr_threshold: float = 0.5) -> Forest:
    """M=2, C=2, d=2. Model 0 classifies by the larger coordinate; model 1 by the smaller.
    Passage model 0 = query model 0 plus a not-retrievable logit 10 * x[1] - 5 (fires when
    x[1] is large); passage model 1 = query model 1, NR never."""
    cfg = ForestConfig(n_models=2, n_classes=2, dim=2, nr_threshold=nr_threshold)
    qw = torch.tensor([[[4.0, 0.0], [0.0, 4.0]], [[0.0, 4.0], [4.0, 0.0]]])
    qb = torch.zeros(2, 2)
    pw = torch.cat([qw, torch.tensor([[[0.0], [10.0]], [[0.0], [0.0]]])], dim=-1)
    pb = torch.tensor([[0.0, 0.0, -5.0], [0.0, 0.0, -50.0]])
    return Forest(cfg, [qw], [qb], [pw], [pb], name="hand")


def test_stacked_forward_equals_per_model_loop() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g)
    ws = [torch.randn(3, 5, 4, generator=g), torch.randn(3, 4, 6, generator=g)]
    bs = [torch.randn(3, 4, generator=g), torch.randn(3, 6, generator=g)]
    out = stacked_forward(x, ws, bs)
    assert out.shape == (3, 7, 6)
    for m in range(3):
        ref = torch.relu(x @ ws[0][m] + bs[0][m]) @ ws[1][m] + bs[1][m]
        torch.testing.assert_close(out[m], ref)


def test_query_and_passage_classes_hand_fixture() -> None:
    f = _hand_forest()
    x = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], dtype=np.float32)
    qc, qp = f.query_classes(x)
    np.testing.assert_array_equal(qc, [[0, 1], [1, 0], [0, 1]])
    # softmax of logits (4*0.9, 4*0.1) -> class 0 with prob sigmoid(3.2)
    assert qp[0, 0] == pytest.approx(1 / (1 + np.exp(-3.2)), rel=1e-6)
    pc, pp = f.passage_classes(x)
    # model 0 NR logit 10*x1 - 5: row 1 -> 3.0 vs class logits (0.8, 3.2)
    p_nr_row1 = np.exp(3.0) / (np.exp(0.8) + np.exp(3.2) + np.exp(3.0))
    assert p_nr_row1 < 0.5
    np.testing.assert_array_equal(pc, [[0, 1], [1, 0], [0, 1]])
    # with a lower threshold row 1 becomes not retrievable for model 0 only
    pc2, pp2 = _hand_forest(nr_threshold=0.3).passage_classes(x)
    np.testing.assert_array_equal(pc2, [[0, 1], [NOT_RETRIEVABLE, 0], [0, 1]])
    assert pp2[1, 0] == 0.0 and pp2[1, 1] > 0.5
    # probs are the (C+1)-way softmax of the chosen real class
    z = np.array([3.6, 0.4, -4.0])
    assert pp[0, 0] == pytest.approx(np.exp(z[0]) / np.exp(z).sum(), rel=1e-5)


def test_passage_init_copies_query_and_adds_rare_nr_class() -> None:
    g = torch.Generator().manual_seed(1)
    qw, qb = [torch.randn(3, 4, 5, generator=g)], [torch.randn(3, 5, generator=g)]
    pw, pb = passage_init_from_query(qw, qb, nr_bias=-4.0)
    assert pw[0].shape == (3, 4, 6) and pb[0].shape == (3, 6)
    torch.testing.assert_close(pw[0][..., :5], qw[0])
    assert torch.all(pw[0][..., 5] == 0) and torch.all(pb[0][:, 5] == -4.0)
    cfg = ForestConfig(3, 5, 4)
    f = Forest(cfg, qw, qb, pw, pb)
    x = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32) * 0.1
    qc, _ = f.query_classes(x)
    pc, _ = f.passage_classes(x)
    np.testing.assert_array_equal(qc, pc)  # same weights -> same classes


def test_checkpoint_roundtrip_through_registry(tmp_path) -> None:
    cfg = ForestConfig(n_models=6, n_classes=7, dim=8, hidden=(5,), nr_threshold=0.4)
    f = Forest.random(cfg, seed=3, name="rt")
    x = np.random.default_rng(2).standard_normal((40, 8)).astype(np.float32)
    save_checkpoint(tmp_path / "ck", f.to_checkpoint("enc", "fp123"))
    g = load_model(tmp_path / "ck", expected_fingerprint="fp123")
    assert isinstance(g, Forest) and g.name == "rt" and g.config == cfg
    for a, b in zip(f.query_classes(x), g.query_classes(x), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(f.passage_classes(x), g.passage_classes(x), strict=True):
        np.testing.assert_array_equal(a, b)
    assert load_checkpoint(tmp_path / "ck").model_type == "forest"


def test_subset_keeps_first_models_and_bad_inputs_raise() -> None:
    f = Forest.random(ForestConfig(5, 4, 3), seed=0)
    x = np.random.default_rng(0).standard_normal((9, 3)).astype(np.float32)
    np.testing.assert_array_equal(f.subset(2).query_classes(x)[0], f.query_classes(x)[0][:, :2])
    with pytest.raises(ValueError, match="shape"):
        f.query_classes(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="n_models"):
        f.subset(6)
    with pytest.raises(ValueError, match="nr_threshold"):
        ForestConfig(2, 2, 2, nr_threshold=0.0)
    with pytest.raises(ValueError, match="do not match"):
        Forest(
            ForestConfig(2, 3, 4),
            [torch.zeros(2, 4, 4)],
            [torch.zeros(2, 4)],
            [torch.zeros(2, 4, 4)],
            [torch.zeros(2, 4)],
        )
