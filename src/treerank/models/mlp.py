"""``MLPHead``: a two-layer residual MLP per tower, ``y = x + W2 drop(gelu(W1 x + b1)) + b2``.

``W2`` and ``b2`` start at 0, so the untrained head is the identity (scores exactly like cosine),
and weight decay on ``W2`` pulls the head back toward it. Dropout regularises the hidden layer.

Reference: the TreeRank seed's "true baseline"; the residual-at-identity init follows ReZero
(Bachlechner et al., 2020) in spirit: start from the frozen encoder's geometry.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from treerank.models.head import TwoTowerHead

__all__ = ["MLPHead", "MLPTower"]


class MLPTower(nn.Module):
    """``(n, d) -> (n, d)``: ``x + fc2(dropout(gelu(fc1(x))))``, ``fc2`` zero-initialised.

    Args:
        dim: input and output size. hidden: hidden width. dropout: dropout probability.
    """

    def __init__(self, dim: int, hidden: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, dim)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(self.drop(self.act(self.fc1(x))))


class MLPHead(TwoTowerHead):
    """Residual two-layer MLP heads (separate query and passage towers unless ``shared``).

    Args:
        dim: input dimension ``d`` (also the output dimension).
        hidden: hidden width (None: ``d``).
        dropout: dropout probability on the hidden layer (training only).
        **kwargs: ``shared``, ``scoring``, ``temperature``, ``learn_temperature``, ``trainable``.

    Raises:
        ValueError: ``dropout`` outside [0, 1), ``hidden < 1``.
    """

    model_type: ClassVar[str] = "mlp"

    def __init__(
        self, dim: int, hidden: int | None = None, dropout: float = 0.1, **kwargs: Any
    ) -> None:
        self.hidden = int(hidden or dim)
        self.dropout = float(dropout)
        if not 0.0 <= self.dropout < 1.0 or self.hidden < 1:
            raise ValueError(
                f"mlp: need 0 <= dropout < 1 and hidden >= 1 (got {dropout}, {hidden})"
            )
        super().__init__(dim, **kwargs)

    def _make_tower(self, dim: int) -> nn.Module:
        return MLPTower(dim, self.hidden, self.dropout)

    def _tower_config(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "dropout": self.dropout}
