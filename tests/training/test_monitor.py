import math

import pytest
import torch

from treerank.training.monitor import batch_stats


def test_batch_stats_by_hand():
    logits = torch.tensor([[2.0, 0.0, 0.0, 1.0], [0.0, 3.0, 0.0, 0.0]])
    pos = torch.tensor([[True, False, False, False], [False, False, True, False]])
    mask = torch.tensor([[False, False, False, True], [False, False, False, False]])
    st = batch_stats(logits, pos, mask, q_repr=torch.tensor([[3.0, 4.0], [0.0, 2.0]]))
    assert st["chance_loss"] == pytest.approx((math.log(3) + math.log(4)) / 2)
    assert st["accuracy"] == pytest.approx(0.5)  # row 0 right, row 1 picks column 1
    z1 = torch.softmax(torch.tensor([0.0, 3.0, 0.0, 0.0]), 0)
    z0 = torch.softmax(torch.tensor([2.0, 0.0, 0.0]), 0)
    assert st["max_neg_prob"] == pytest.approx(float(z0[1] + z1[1]) / 2, abs=1e-6)
    # row 0: two equal negatives -> PR 2; row 1: negatives (e^0, e^3, e^0) renormalised
    q = torch.tensor([1.0, math.exp(3), 1.0])
    q = q / q.sum()
    assert st["neg_participation"] == pytest.approx((2 + float(1 / (q * q).sum())) / 2, abs=1e-5)
    assert st["query_norm"] == pytest.approx(3.5)
    assert st["n_columns"] == 4
