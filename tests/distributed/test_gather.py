"""The pieces of the gather that need no process group: gradient scaling, byte counts, launch."""

from __future__ import annotations

import torch

from treerank.distributed.context import broadcast_from_main, is_main_process, launch, main_first
from treerank.distributed.gather import ScaleGrad, gather_bytes


def test_scale_grad_is_identity_forward_and_scales_backward():
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    y = ScaleGrad.apply(x, 3.0)
    assert torch.equal(y, x.detach())
    (y * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[3.0, 6.0], [9.0, 12.0]]))


def test_gather_bytes_counts_the_padded_rows_of_the_other_ranks():
    # 2 ranks holding 3 and 2 rows of 4 float32: each receives one padded block of 3 rows
    assert gather_bytes([3, 2], 4) == 1 * 3 * 4 * 4
    # 4 ranks, 64 query rows of 384 floats each: 3 x 64 x 384 x 4 bytes
    assert gather_bytes([64] * 4, 384) == 294_912
    assert gather_bytes([5], 8) == 0  # one rank gathers nothing


def test_one_process_needs_no_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with launch() as ctx:
        assert ctx is None and is_main_process()
        with main_first():
            pass
        assert broadcast_from_main(lambda: 41 + 1) == 42
    monkeypatch.setenv("WORLD_SIZE", "1")
    with launch() as ctx:
        assert ctx is None
