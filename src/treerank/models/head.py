"""Thin two-tower heads over frozen embeddings: the plumbing the linear and MLP heads share.

A head maps a stored query vector through a *query tower* and a stored passage vector through a
*passage tower* (separate by default, as DPR unties its encoders; one shared tower as an option)
and scores the pair by

* ``"cosine"``: ``cos(f_q(q), f_p(p)) / tau``, with the temperature ``tau`` fixed or learned
  (learned as ``log(1 / tau)``, CLIP's logit scale, capped at ``1 / tau = 100``); or
* ``"dot"``: the raw inner product ``f_q(q) . f_p(p)`` (no temperature).

For search (the :class:`~treerank.models.base.DenseScorer` protocol) ``encode_queries`` /
``encode_passages`` return the tower outputs, L2-normalised under cosine scoring, so the inner
product of the two is the ranking score up to the (monotone) temperature. Which scoring and
temperature a head used is part of its config, hence of its checkpoint.

Subclasses define ``model_type`` and ``_make_tower(dim) -> torch.nn.Module``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from treerank.kernels.vectors import ROW_CHUNK
from treerank.models.checkpoint import CheckpointMixin

__all__ = ["SCORINGS", "TwoTowerHead"]

SCORINGS = ("cosine", "dot")
TRAINABLE = ("both", "query", "passage")
MAX_LOGIT_SCALE = 100.0


class TwoTowerHead(CheckpointMixin, nn.Module):
    """Base class of the thin heads (see the module docstring).

    Args:
        dim: input dimension ``d`` (the store's vector size).
        shared: one tower for queries and passages (default: two towers).
        scoring: ``"cosine"`` or ``"dot"``.
        temperature: ``tau`` of cosine scoring (``0.05`` = logit scale 20); ignored for dot.
        learn_temperature: learn ``tau`` (initialised at ``temperature``).
        trainable: which tower the optimiser may change: ``"both"`` (default), ``"query"`` (a
            query-side adapter: passages keep their identity-initialised tower, so the index
            of a residual head is the stored vectors) or ``"passage"``. The frozen tower's
            parameters get ``requires_grad = False`` (the trainers optimise only parameters
            that require gradients). Needs two towers (``shared = False``).

    Raises:
        ValueError: unknown scoring or ``trainable``, ``dim < 1``, ``temperature <= 0``, or a
            frozen tower with ``shared = True``.
    """

    model_type: ClassVar[str] = ""
    name: str

    def __init__(
        self,
        dim: int,
        *,
        shared: bool = False,
        scoring: str = "cosine",
        temperature: float = 0.05,
        learn_temperature: bool = False,
        trainable: str = "both",
    ) -> None:
        super().__init__()
        if scoring not in SCORINGS:
            raise ValueError(f"unknown scoring {scoring!r}; known: {', '.join(SCORINGS)}")
        if trainable not in TRAINABLE:
            raise ValueError(f"unknown trainable {trainable!r}; known: {', '.join(TRAINABLE)}")
        if shared and trainable != "both":
            raise ValueError(f"trainable={trainable!r} freezes one tower: needs shared=False")
        if dim < 1 or temperature <= 0:
            raise ValueError(f"dim must be >= 1 and temperature > 0 (got {dim}, {temperature})")
        self.dim = int(dim)
        self.shared = bool(shared)
        self.scoring = scoring
        self.temperature_init = float(temperature)
        self.learn_temperature = bool(learn_temperature)
        self.name = self.model_type
        self.extra: dict[str, Any] = {}
        scale = torch.tensor(math.log(1.0 / temperature), dtype=torch.float32)
        if learn_temperature:
            self.log_scale = nn.Parameter(scale)
        else:
            self.register_buffer("log_scale", scale)
        self.query_tower = self._make_tower(self.dim)
        self.passage_tower = self.query_tower if shared else self._make_tower(self.dim)
        self.trainable = trainable
        if trainable == "query":
            self.passage_tower.requires_grad_(False)
        elif trainable == "passage":
            self.query_tower.requires_grad_(False)

    # -- subclass hooks ---------------------------------------------------------------------
    def _make_tower(self, dim: int) -> nn.Module:
        raise NotImplementedError

    def _tower_config(self) -> dict[str, Any]:
        return {}

    @property
    def out_dim(self) -> int:
        """``d'``, the size of the search vectors."""
        return self.dim

    # -- training interface (treerank.training.trainer.ContrastiveModule) --------------------
    def encode_queries_t(self, x: Tensor) -> Tensor:
        """``(B, d)`` stored query vectors -> ``(B, d')`` query-tower outputs (not normalised)."""
        return self.query_tower(x)

    def encode_passages_t(self, x: Tensor) -> Tensor:
        """``(M, d)`` stored passage vectors -> ``(M, d')`` passage-tower outputs."""
        return self.passage_tower(x)

    @property
    def temperature(self) -> float:
        """Current ``tau`` of cosine scoring (1.0 for dot scoring)."""
        if self.scoring == "dot":
            return 1.0
        return float(torch.exp(-self._log_scale().detach()))

    def _log_scale(self) -> Tensor:
        return self.log_scale.clamp(max=math.log(MAX_LOGIT_SCALE))

    def score_matrix(self, q_repr: Tensor, p_repr: Tensor) -> Tensor:
        """``(B, M)`` logits: ``cos / tau`` (cosine scoring) or the inner product (dot)."""
        if self.scoring == "dot":
            return q_repr @ p_repr.T
        q = nn.functional.normalize(q_repr, dim=-1)
        p = nn.functional.normalize(p_repr, dim=-1)
        return (q @ p.T) * self._log_scale().exp()

    def log_values(self) -> dict[str, float]:
        """Extra training-log fields: the current temperature."""
        return {"temperature": self.temperature}

    # -- search interface (treerank.models.base.DenseScorer) ---------------------------------
    def _encode(self, tower: nn.Module, x: np.ndarray, chunk: int = ROW_CHUNK) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(
                f"{self.name}: expected float32 (n, {self.dim}) vectors, got shape {x.shape}"
            )
        was_training = self.training
        self.eval()
        out = np.empty((x.shape[0], self.out_dim), dtype=np.float32)
        with torch.no_grad():
            for s in range(0, x.shape[0], chunk):
                y = tower(torch.from_numpy(np.require(x[s : s + chunk], np.float32, ["C", "W"])))
                if self.scoring == "cosine":
                    y = nn.functional.normalize(y, dim=-1)
                out[s : s + chunk] = y.numpy()
        self.train(was_training)
        return out

    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored query vectors -> ``float32 (n, d')`` search vectors
        (L2-normalised under cosine scoring).

        Raises:
            ValueError: ``x`` is not ``(n, d)``.
        """
        return self._encode(self.query_tower, x)

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored passage vectors -> ``float32 (n, d')`` search vectors.

        Raises:
            ValueError: ``x`` is not ``(n, d)``.
        """
        return self._encode(self.passage_tower, x)

    # -- checkpoints ---------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-serialisable); ``cls(**config())`` rebuilds the head."""
        return {
            "dim": self.dim,
            "shared": self.shared,
            "scoring": self.scoring,
            "temperature": self.temperature_init,
            "learn_temperature": self.learn_temperature,
            "trainable": self.trainable,
            **self._tower_config(),
        }

    def checkpoint_config(self) -> dict[str, Any]:
        return self.config()

    def checkpoint_state(self) -> dict[str, Tensor]:
        return dict(self.state_dict())

    def checkpoint_extra(self) -> dict[str, Any]:
        """``self.extra`` (training summary) and the final temperature."""
        return {**self.extra, "final_temperature": self.temperature}

    @classmethod
    def from_checkpoint_parts(
        cls, config: dict[str, Any], state: dict[str, Tensor]
    ) -> TwoTowerHead:
        head = cls(**config)
        head.load_state_dict(state, strict=True)
        return head
