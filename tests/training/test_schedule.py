import math

import pytest
import torch

from treerank.training.schedule import warmup_cosine, warmup_cosine_scheduler


def test_warmup_then_cosine_values():
    # 10 steps, 2 warmup: 0.5, 1.0, then cosine over 8 steps
    assert warmup_cosine(0, 10, 2) == pytest.approx(0.5)
    assert warmup_cosine(1, 10, 2) == pytest.approx(1.0)
    assert warmup_cosine(2, 10, 2) == pytest.approx(1.0)
    assert warmup_cosine(6, 10, 2) == pytest.approx(0.5)  # half way: cos(pi/2) = 0
    assert warmup_cosine(10, 10, 2) == pytest.approx(0.0)
    assert warmup_cosine(10, 10, 2, min_ratio=0.1) == pytest.approx(0.1)
    assert warmup_cosine(4, 10, 2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))


def test_scheduler_drives_optimizer():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = warmup_cosine_scheduler(opt, 10, 2)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1.0) and lrs[1] == pytest.approx(2.0)
    assert lrs[6] == pytest.approx(1.0)


def test_bad_schedule():
    with pytest.raises(ValueError):
        warmup_cosine(0, 0, 0)
