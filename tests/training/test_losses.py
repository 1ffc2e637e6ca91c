import math

import pytest
import torch
import torch.nn.functional as F

from treerank.training.losses import info_nce, info_nce_symmetric

# DPR lesson's worked example: 3 queries x 3 passages, labels on the diagonal, no temperature.
S = torch.tensor([[6.0, 4.5, 1.2], [2.1, 5.4, 3.0], [0.9, 2.4, 4.8]])
EYE = torch.eye(3, dtype=torch.bool)


def test_dpr_worked_example_is_0_1445():
    loss = info_nce(S, EYE)
    # by hand: row i loss = log(sum_j exp(s_ij)) - s_ii
    by_hand = (
        sum(math.log(sum(math.exp(v) for v in row)) - row[i] for i, row in enumerate(S.tolist()))
        / 3
    )
    assert round(float(loss), 4) == 0.1445
    assert float(loss) == pytest.approx(by_hand, abs=1e-6)
    assert float(loss) == pytest.approx(float(F.cross_entropy(S, torch.arange(3))), abs=1e-6)


def test_temperature_divides_scores():
    assert float(info_nce(S, EYE, None, 0.05)) == pytest.approx(float(info_nce(S / 0.05, EYE)))
    t = torch.tensor(2.0)
    assert float(info_nce(S, EYE, None, t)) == pytest.approx(float(info_nce(S / 2, EYE)))


def test_mask_removes_planted_false_negative_exactly():
    # column 1 is secretly relevant to query 0: mask it out of row 0's denominator
    scores = S.clone().requires_grad_(True)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[0, 1] = True
    loss = info_nce(scores, EYE, mask, reduction="none")
    loss.sum().backward()
    assert scores.grad[0, 1].item() == 0.0  # exactly no gradient on the planted false negative
    # row 0 now equals the loss over the two remaining columns
    row0 = math.log(math.exp(6.0) + math.exp(1.2)) - 6.0
    assert float(loss[0].detach()) == pytest.approx(row0, abs=1e-6)
    # other rows untouched
    full = info_nce(S, EYE, reduction="none")
    assert torch.allclose(loss[1:], full[1:])


def test_gradients_reach_every_negative_with_softmax_weights():
    scores = S.clone().requires_grad_(True)
    info_nce(scores, EYE).backward()
    p = torch.softmax(S, dim=1)
    expected = (p - EYE.float()) / 3  # d mean-CE / d s_ij
    assert torch.allclose(scores.grad, expected, atol=1e-7)
    assert bool((scores.grad[~EYE] > 0).all())  # every negative is pushed down


def test_multiple_positives_use_their_total_mass():
    pos = torch.tensor([[True, True, False], [False, True, False], [False, False, True]])
    loss = info_nce(S, pos, reduction="none")
    p0 = torch.softmax(S[0], 0)
    assert float(loss[0]) == pytest.approx(-math.log(float(p0[0] + p0[1])), abs=1e-6)


def test_positive_wins_over_mask():
    mask = EYE.clone()  # masking the positives themselves must not remove them
    assert float(info_nce(S, EYE, mask)) == pytest.approx(float(info_nce(S, EYE)))


def test_symmetric_direction_is_cross_entropy_of_transpose():
    got = info_nce_symmetric(S, EYE)
    assert float(got) == pytest.approx(float(F.cross_entropy(S.T, torch.arange(3))), abs=1e-6)


def test_symmetric_only_over_positive_columns():
    # 2 queries, 3 columns; column 2 is a hard negative (nobody's positive)
    s = S[:2]
    pos = torch.tensor([[True, False, False], [False, True, False]])
    got = info_nce_symmetric(s, pos)
    want = F.cross_entropy(s[:, :2].T, torch.arange(2))
    assert float(got) == pytest.approx(float(want), abs=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="at least one positive"):
        info_nce(S, torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        info_nce(S, torch.eye(3))
    with pytest.raises(ValueError, match="reduction"):
        info_nce(S, EYE, reduction="max")
