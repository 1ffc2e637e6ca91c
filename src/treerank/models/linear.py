"""``LinearHead``: a d -> d' linear projection per tower, the thinnest trainable baseline.

With ``d' = d`` the weight is parametrised as ``W = I + Delta`` with ``Delta`` initialised at 0:
the untrained head scores exactly like cosine of the frozen embeddings, and weight decay pulls
``W`` back toward the identity (toward raw cosine), the sensible prior when training data is
scarce. With ``d' != d`` the weight is a seeded (semi-)orthogonal matrix and decays toward 0.

Reference: the TreeRank seed's "true baseline" (a thin trained layer over frozen embeddings);
separate query / passage towers as in DPR (Karpukhin et al., 2020).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from treerank.models.head import TwoTowerHead

__all__ = ["LinearHead", "LinearTower"]


class LinearTower(nn.Module):
    """``y = x W^T (+ b)``, ``W = I + Delta`` when ``d_out == d_in`` (``Delta`` starts at 0).

    Args:
        d_in: input size. d_out: output size. bias: learn a bias (starts at 0).
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = False) -> None:
        super().__init__()
        self.residual = d_in == d_out
        self.weight = nn.Parameter(torch.zeros(d_out, d_in))
        if not self.residual:
            nn.init.orthogonal_(self.weight)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """``(n, d_in) -> (n, d_out)``."""
        y = x @ self.weight.T
        if self.residual:
            y = y + x
        if self.bias is not None:
            y = y + self.bias
        return y


class LinearHead(TwoTowerHead):
    """Linear projection heads (separate query and passage towers unless ``shared``).

    Args:
        dim: input dimension ``d``.
        out_dim: ``d'`` (None: ``d``, identity init).
        bias: learn a bias in each tower.
        **kwargs: ``shared``, ``scoring``, ``temperature``, ``learn_temperature``,
            ``trainable`` (see :class:`~treerank.models.head.TwoTowerHead`).
    """

    model_type: ClassVar[str] = "linear"

    def __init__(self, dim: int, out_dim: int | None = None, bias: bool = False, **kwargs: Any):
        self._out_dim = int(out_dim or dim)
        self.bias = bool(bias)
        super().__init__(dim, **kwargs)

    @property
    def out_dim(self) -> int:
        return self._out_dim

    def _make_tower(self, dim: int) -> nn.Module:
        return LinearTower(dim, self._out_dim, self.bias)

    def _tower_config(self) -> dict[str, Any]:
        return {"out_dim": self._out_dim, "bias": self.bias}
