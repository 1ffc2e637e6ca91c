"""DRT: decomposed relevance tensors over frozen embeddings (the DRT seed's "Scale 1").

A stored vector ``x`` (``float32 (d,)``) is decomposed into ``k`` L2-normalised sub-vectors
("slots") of ``d_s`` dims, and a query-side attention head weights the slots per query::

    decomposition   Linear(d, 512) -> LayerNorm -> GELU -> Linear(512, k*d_s) -> LayerNorm -> GELU
                    -> reshape (k, d_s) -> L2-normalise each slot
    attention       Linear(d, 64) -> GELU -> Linear(64, k) -> softmax over slots  = alpha(q)
    score(q, p)     = sum_i alpha_i(q) * (q_i . p_i)   (a convex mix of slot cosines, in [-1, 1])

Because the score is linear in each side, it is an inner product of two flat vectors::

    encode_queries(q)  = concat_i(alpha_i(q) * q_i)       float32 (n, k*d_s)
    encode_passages(p) = concat_i(p_i)                     float32 (n, k*d_s)

so exact search, FAISS indexes and evaluation treat DRT as any other
:class:`~treerank.models.base.DenseScorer`. The slot-level outputs (:meth:`DRTHead.query_slots`,
:meth:`DRTHead.passage_slots`, :meth:`DRTHead.query_alpha`, and the pre-normalisation slots) are
exposed for the diagnostics (``treerank.diagnostics``).

Training-time slot dropout (the seed's ``p = 0.15``) drops whole query slots per query and rescales
the survivors by ``1 / (1 - p)``; applied to one side only, it keeps every score's expectation
unchanged (``E[mask_i / (1 - p)] = 1``). The decomposition is shared by queries and passages by
default (``shared_towers=True``) so that slot ``i`` of a query and slot ``i`` of a passage live in
the same space; ``False`` unties the passage decomposition (DPR-style separate towers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from treerank.models.checkpoint import CheckpointMixin

MODEL_TYPE = "drt"
Side = Literal["query", "passage"]
"""Which tower: the query decomposer or the passage decomposer."""
SIDES: tuple[Side, ...] = get_args(Side)


@dataclass(frozen=True)
class DRTConfig:
    """Architecture hyperparameters of a DRT head (the seed's defaults).

    Attributes:
        dim: input embedding dimension ``d`` (384 for all-MiniLM-L6-v2).
        k: number of slots.
        slot_dim: dims per slot ``d_s``; search vectors have ``k * slot_dim`` dims.
        hidden: width of the decomposition head's hidden layer.
        attn_hidden: width of the query attention head's hidden layer.
        shared_towers: one decomposition for queries and passages (``True``) or two.
        slot_dropout: probability of dropping a query slot during training (0 disables).
        temperature: InfoNCE temperature tau used in training (recorded; search ignores it).
    """

    dim: int
    k: int = 6
    slot_dim: int = 64
    hidden: int = 512
    attn_hidden: int = 64
    shared_towers: bool = True
    slot_dropout: float = 0.15
    temperature: float = 0.05

    def __post_init__(self) -> None:
        for name in ("dim", "k", "slot_dim", "hidden", "attn_hidden"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DRTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.slot_dropout < 1.0:
            raise ValueError(f"DRTConfig.slot_dropout must be in [0, 1), got {self.slot_dropout}")
        if self.temperature <= 0:
            raise ValueError(f"DRTConfig.temperature must be > 0, got {self.temperature}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DRTConfig:
        """Build from a mapping; unknown keys raise ``ValueError`` naming them."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown DRT model option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def _decomposer(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, hidden),
        nn.LayerNorm(hidden),
        nn.GELU(),
        nn.Linear(hidden, out),
        nn.LayerNorm(out),
        nn.GELU(),
    )


def slot_dropout(
    slots: torch.Tensor, p: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Drop whole slots at random and rescale the survivors by ``1 / (1 - p)`` (inverted dropout).

    Args:
        slots: ``(n, k, d_s)`` slot vectors.
        p: drop probability in ``[0, 1)``; ``0`` returns ``slots`` unchanged.
        generator: optional torch RNG for reproducibility.

    Returns:
        ``(n, k, d_s)``: ``slots * mask / (1 - p)`` with ``mask ~ Bernoulli(1 - p)`` drawn per
        (row, slot), so ``E[output] = slots``.
    """
    if p <= 0.0:
        return slots
    if not 0.0 <= p < 1.0:
        raise ValueError(f"slot dropout p must be in [0, 1), got {p}")
    # drawn on the CPU whatever the device: the same masks (and weights) on a CPU and a GPU
    keep = torch.rand(slots.shape[:2], generator=generator).to(slots.device) >= p
    return slots * (keep.to(slots.dtype) / (1.0 - p)).unsqueeze(-1)


class DRTHead(CheckpointMixin, nn.Module):
    """The DRT scorer: decomposition head + query attention head (see the module docstring).

    Torch side (training): :meth:`query_tower` / :meth:`passage_tower` map ``float32 (B, d)``
    tensors to flat ``(B, k*d_s)`` representations whose inner product is the DRT score, and
    :meth:`score` gives the ``(B, M)`` matrix. The un-dropped query slots and the passage slots of
    the last tower calls are kept in :attr:`last_query_slots` / :attr:`last_passage_slots` for the
    decorrelation loss.

    NumPy side (search, diagnostics): :meth:`encode_queries` / :meth:`encode_passages` (the
    :class:`~treerank.models.base.DenseScorer` protocol) and the slot-level accessors, all in eval
    mode without gradients, batched.
    """

    model_type = MODEL_TYPE

    def __init__(self, config: DRTConfig, name: str = "drt") -> None:
        super().__init__()
        self.config = config
        self.name = name
        c = config
        self.query_decomposer = _decomposer(c.dim, c.hidden, c.k * c.slot_dim)
        self.passage_decomposer = (
            self.query_decomposer
            if c.shared_towers
            else _decomposer(c.dim, c.hidden, c.k * c.slot_dim)
        )
        self.attention = nn.Sequential(
            nn.Linear(c.dim, c.attn_hidden), nn.GELU(), nn.Linear(c.attn_hidden, c.k)
        )
        self.last_query_slots: torch.Tensor | None = None
        self.last_passage_slots: torch.Tensor | None = None
        self.last_alpha: torch.Tensor | None = None
        self.extra: dict[str, Any] = {}  # training summary etc.; travels in the checkpoint

    # ------------------------------------------------------------------ torch side
    @property
    def k(self) -> int:
        return self.config.k

    @property
    def out_dim(self) -> int:
        """Dimension of the flat search vectors, ``k * d_s``."""
        return self.config.k * self.config.slot_dim

    def _check_input(self, x: torch.Tensor) -> None:
        if x.ndim != 2 or x.shape[1] != self.config.dim:
            raise ValueError(
                f"DRT expects (n, {self.config.dim}) input vectors, got {tuple(x.shape)}"
            )

    def raw_slots(self, x: torch.Tensor, side: Side = "query") -> torch.Tensor:
        """Slot activations before L2 normalisation, ``(n, k, d_s)``; ``side``: query/passage."""
        self._check_input(x)
        if side not in SIDES:
            known = " or ".join(repr(s) for s in SIDES)
            raise ValueError(f"side must be {known}, got {side!r}")
        net = self.query_decomposer if side == "query" else self.passage_decomposer
        return net(x).view(x.shape[0], self.config.k, self.config.slot_dim)

    def slots(self, x: torch.Tensor, side: Side = "query") -> torch.Tensor:
        """L2-normalised slots ``(n, k, d_s)``; every ``slots[r, i]`` has unit norm."""
        return F.normalize(self.raw_slots(x, side), dim=-1)

    def alpha(self, x: torch.Tensor) -> torch.Tensor:
        """Query attention ``(n, k)``: a softmax over slots, rows sum to 1."""
        self._check_input(x)
        return torch.softmax(self.attention(x), dim=-1)

    def query_tower(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, d)`` queries -> ``(B, k*d_s)`` = ``concat_i(alpha_i * q_i)``.

        In training mode, slot dropout (``config.slot_dropout``) is applied to the query slots
        after they are recorded in :attr:`last_query_slots` (the decorrelation term sees the
        un-dropped slots, as the seed specifies).
        """
        q = self.slots(x, "query")
        self.last_query_slots = q
        if self.training and self.config.slot_dropout > 0:
            q = slot_dropout(q, self.config.slot_dropout)
        alpha = self.alpha(x)
        self.last_alpha = alpha
        return (alpha.unsqueeze(-1) * q).reshape(x.shape[0], self.out_dim)

    def passage_tower(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, d)`` passages -> ``(B, k*d_s)`` = ``concat_i(p_i)``."""
        p = self.slots(x, "passage")
        self.last_passage_slots = p
        return p.reshape(x.shape[0], self.out_dim)

    def score(self, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """``(B, D) x (M, D) -> (B, M)`` DRT scores ``sum_i alpha_i (q_i . p_i)`` (no tau)."""
        return q @ p.T

    def forward(self, queries: torch.Tensor, passages: torch.Tensor) -> torch.Tensor:
        """``(B, d), (M, d) -> (B, M)`` DRT score matrix."""
        return self.score(self.query_tower(queries), self.passage_tower(passages))

    # training interface (treerank.training.trainer.ContrastiveModule); the decorrelation term
    # is added by treerank.training.drt, which owns the loss maths.
    def encode_queries_t(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`query_tower` (slot dropout in training mode)."""
        return self.query_tower(x)

    def encode_passages_t(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`passage_tower`."""
        return self.passage_tower(x)

    def score_matrix(self, q_repr: torch.Tensor, p_repr: torch.Tensor) -> torch.Tensor:
        """``(B, M)`` InfoNCE logits: the DRT score divided by ``config.temperature``."""
        return self.score(q_repr, p_repr) / self.config.temperature

    def log_values(self) -> dict[str, float]:
        """Training-log extras: mean attention entropy (max ``log k``), largest mean alpha."""
        if self.last_alpha is None:
            return {}
        a = self.last_alpha.detach()
        ent = -(a * a.clamp_min(1e-12).log()).sum(dim=1).mean()
        return {"alpha_entropy": float(ent), "alpha_max_mean": float(a.mean(dim=0).max())}

    # ------------------------------------------------------------------ numpy side
    def _np_apply(self, fn: Any, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.config.dim:
            raise ValueError(f"{self.name}: expected (n, {self.config.dim}) vectors, got {x.shape}")
        was_training = self.training
        self.eval()
        outs = []
        try:
            with torch.no_grad():
                for s in range(0, x.shape[0], batch_size):
                    xb = torch.from_numpy(np.array(x[s : s + batch_size], dtype=np.float32))
                    outs.append(fn(xb).numpy().astype(np.float32, copy=False))
        finally:
            self.train(was_training)
        if not outs:
            probe = fn(torch.zeros(1, self.config.dim))
            return np.zeros((0, *probe.shape[1:]), dtype=np.float32)
        return np.concatenate(outs, axis=0)

    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored queries -> ``float32 (n, k*d_s)`` ``concat_i(alpha_i q_i)``."""
        return self._np_apply(self.query_tower, x)

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, d)`` stored passage vectors -> ``float32 (n, k*d_s)`` ``concat_i(p_i)``."""
        return self._np_apply(self.passage_tower, x)

    def query_slots(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, k, d_s)`` L2-normalised query slots."""
        return self._np_apply(lambda t: self.slots(t, "query"), x)

    def passage_slots(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, k, d_s)`` L2-normalised passage slots."""
        return self._np_apply(lambda t: self.slots(t, "passage"), x)

    def query_raw_slots(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, k, d_s)`` query slots before L2 normalisation."""
        return self._np_apply(lambda t: self.raw_slots(t, "query"), x)

    def passage_raw_slots(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, k, d_s)`` passage slots before L2 normalisation."""
        return self._np_apply(lambda t: self.raw_slots(t, "passage"), x)

    def query_alpha(self, x: np.ndarray) -> np.ndarray:
        """``float32 (n, k)`` slot attention of each query (rows sum to 1)."""
        return self._np_apply(self.alpha, x)

    # ------------------------------------------------------------------ checkpoints
    def _state_for_save(self) -> dict[str, torch.Tensor]:
        state = self.state_dict()
        if self.config.shared_towers:  # the passage decomposer is the same module: store once
            state = {k: v for k, v in state.items() if not k.startswith("passage_decomposer.")}
        return state

    def checkpoint_config(self) -> dict[str, Any]:
        return {**asdict(self.config), "name": self.name}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return self._state_for_save()

    @classmethod
    def from_checkpoint_parts(
        cls, config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> DRTHead:
        cfg = dict(config)
        name = str(cfg.pop("name", MODEL_TYPE))
        model = cls(DRTConfig.from_dict(cfg), name=name)
        state = dict(state)
        if model.config.shared_towers:
            for k, v in list(state.items()):
                if k.startswith("query_decomposer."):
                    state["passage_decomposer." + k[len("query_decomposer.") :]] = v
        model.load_state_dict(state, strict=True)
        return model
