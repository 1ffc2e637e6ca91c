"""Forest loss maths: uniformity, sharpness, the boosting formula, not-retrievable targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treerank.forest.losses import (
    boosting_weights,
    not_retrievable_targets,
    sharpness_loss,
    uniformity_loss,
)


@pytest.mark.parametrize("kind", ["entropy", "gini"])
def test_uniformity_loss_uniform_is_zero_collapsed_is_one(kind) -> None:
    c = 8
    uniform = torch.full((c,), 1.0 / c)
    collapsed = torch.zeros(c)
    collapsed[3] = 1.0
    assert float(uniformity_loss(uniform, kind)) == pytest.approx(0.0, abs=1e-6)
    assert float(uniformity_loss(collapsed, kind)) == pytest.approx(1.0, abs=1e-5)
    # batched rows
    out = uniformity_loss(torch.stack([uniform, collapsed]), kind)
    np.testing.assert_allclose(out.numpy(), [0.0, 1.0], atol=1e-5)


def test_uniformity_loss_hand_values() -> None:
    half = torch.tensor([0.5, 0.5, 0.0, 0.0])  # two of four classes used
    # entropy: (log 4 - log 2) / log 4 = 0.5; gini: (4 * 0.5 - 1) / 3 = 1/3
    assert float(uniformity_loss(half, "entropy")) == pytest.approx(0.5, abs=1e-6)
    assert float(uniformity_loss(half, "gini")) == pytest.approx(1 / 3, abs=1e-6)
    with pytest.raises(ValueError, match="unknown uniformity"):
        uniformity_loss(half, "kl")


def test_sharpness_loss_separates_soft_from_decisive_queries() -> None:
    # Soft queries (each uniform) have a perfectly uniform mean too: uniformity alone is 0 for
    # both sets; only the sharpness term tells them apart.
    soft = torch.full((4, 4), 0.25)
    sharp = torch.eye(4)
    assert float(uniformity_loss(soft.mean(0))) == pytest.approx(0.0, abs=1e-6)
    assert float(uniformity_loss(sharp.mean(0))) == pytest.approx(0.0, abs=1e-6)
    assert float(sharpness_loss(soft)) == pytest.approx(1.0, abs=1e-6)
    assert float(sharpness_loss(sharp)) == pytest.approx(0.0, abs=1e-6)
    w = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert float(sharpness_loss(torch.cat([sharp[:1], soft[:3]]), w)) == pytest.approx(
        0.0, abs=1e-6
    )


def test_boosting_weight_formula() -> None:
    # (1 + e) / (1 + n)
    np.testing.assert_allclose(boosting_weights(np.array([0, 1, 2]), 2), [1 / 3, 2 / 3, 1.0])
    np.testing.assert_allclose(boosting_weights(np.array([0, 0]), 0), [1.0, 1.0])
    np.testing.assert_allclose(boosting_weights(np.array([3]), 9), [0.4])
    with pytest.raises(ValueError):
        boosting_weights(np.array([3]), 2)


def test_not_retrievable_targets_hand_fixture() -> None:
    # 1 model, 4 passages, C = 2 (+ NR column). Passage classes (argmax real): 0, 1, 0, 1.
    pp = torch.tensor([[[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.8, 0.1, 0.1], [0.1, 0.8, 0.1]]])
    neg_p = torch.tensor([0, 1, 2, 3])
    neg_class = torch.tensor([[0, 0, 0, 1]])  # query classes of the negatives' queries
    neg_w = torch.tensor([[1.0, 1.0, 0.0, 1.0]])  # negative of passage 2 not in the bag
    wanted = torch.tensor([[False, False, False, True]])  # passage 3 is someone's positive
    pmask = torch.ones(1, 4)
    got = not_retrievable_targets(pp, neg_p, neg_class, neg_w, wanted, pmask)
    # 0: met in its class 0 -> target; 1: met by a class-0 query but sits in 1 -> no;
    # 2: negative out of the bag -> no; 3: met in its class but wanted -> no
    assert got.tolist() == [[True, False, False, False]]
