"""Training a DRT head: InfoNCE over DRT scores + slot decorrelation + slot dropout (DRT seed).

Loss of one batch (queries ``B``, de-duplicated passage columns ``M``)::

    L = InfoNCE(S / tau, positive, mask_out) + lambda_dec * (dec(Q) + dec(P)) / 2

* ``S (B, M) = sum_i alpha_i(q) q_i . p_i`` with the query slots passed through slot dropout
  (``p = 0.15``, survivors rescaled by ``1 / (1 - p)``; see ``treerank.models.drt``),
  ``tau = 0.05``,
  and the *same* sampler, hard negatives and multi-positive masks as the thin heads
  (``treerank.training.sampler``, ``treerank.training.losses.info_nce``).
* ``dec`` is :func:`decorrelation_loss` on the un-dropped unit slots of the batch's queries
  (``Q (B, k, d_s)``) and passages (``P (M, k, d_s)``): the seed computes the decorrelation term
  before slot dropout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from treerank.config import ConfigError
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.models.drt import DRTConfig, DRTHead
from treerank.storelike import StoreLike
from treerank.training.config import TrainConfig, parse_train_config
from treerank.training.heads import SamplerConfig, train_contrastive
from treerank.training.history import TrainingLog
from treerank.training.trainer import TrainerConfig, TrainOutput, Validate

__all__ = [
    "DRTObjective",
    "DRTSamplerConfig",
    "DRTTrainerConfig",
    "decorrelation_loss",
    "parse_drt_config",
    "train_drt",
]


def decorrelation_loss(sub: Tensor) -> Tensor:
    """Slot decorrelation penalty of the DRT seed.

    For every slot pair ``i < j``::

        C_ij = sub[:, i]^T sub[:, j] / B            (d_s x d_s cross-correlation, uncentred)
        loss = sum_{i<j} ||C_ij||_F^2

    Computed at once from the full ``(k d_s) x (k d_s)`` second-moment matrix
    ``G = X^T X / B`` (``X = sub`` flattened to ``(B, k d_s)``): the loss is half the squared
    Frobenius norm of ``G`` outside its ``k`` diagonal ``d_s x d_s`` blocks.

    Args:
        sub: ``float (B, k, d_s)`` slot vectors of ``B`` items (the seed feeds the L2-normalised
            slots, before slot dropout).

    Returns:
        0-d tensor ``>= 0``; 0 when ``k == 1`` or when every pair of slots is orthogonal over
        the batch.

    Raises:
        ValueError: ``sub`` is not 3-D or has no rows.
    """
    if sub.ndim != 3:
        raise ValueError(f"decorrelation_loss: expected (B, k, d_s), got {tuple(sub.shape)}")
    b, k, d_s = sub.shape
    if b == 0:
        raise ValueError("decorrelation_loss: empty batch")
    x = sub.reshape(b, k * d_s)
    g = (x.T @ x) / b  # (k d_s, k d_s)
    total = (g * g).sum()
    blocks = g.view(k, d_s, k, d_s).diagonal(dim1=0, dim2=2)  # (d_s, d_s, k): C_ii
    return (total - (blocks * blocks).sum()) / 2


# --------------------------------------------------------------------------- config


@dataclass
class DRTTrainerConfig(TrainerConfig):
    """The ``trainer`` section of a DRT config: the thin heads' trainer plus the loss weight,
    with DRT's own defaults (``configs/drt/default.yaml`` lists the same values; a test
    compares them).

    Attributes:
        lambda_dec: weight of the slot decorrelation term (0 disables it; the seed: 0.1).
        epochs: 60; lr: 3e-4 (picked on held-out SciFact train queries); patience: 8;
        threads: 1.
    """

    lambda_dec: float = 0.1
    epochs: int = 60
    lr: float = 3e-4
    patience: int | None = 8
    threads: int | None = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lambda_dec < 0:
            raise ValueError(f"lambda_dec must be >= 0, got {self.lambda_dec}")


@dataclass
class DRTSamplerConfig(SamplerConfig):
    """The ``data`` section of a DRT config: the heads' sampler with DRT's guard defaults
    (no rank skipped, margin 0: ``configs/drt/default.yaml``)."""

    guard_skip_top: int = 0
    guard_margin: float | None = 0.0


def parse_drt_config(
    cfg: Mapping[str, Any] | TrainConfig | None, where: str = "config"
) -> TrainConfig:
    """The ``drt`` family's config (``configs/drt/*.yaml`` lists every key)::

        seed: 0
        model:      DRTConfig arguments except ``dim`` (taken from the store)
        data:       as the thin heads (SamplerConfig)
        trainer:    DRTTrainerConfig (the heads' TrainerConfig + lambda_dec)
        validation: as the thin heads (ValidationConfig)

    DRT trains on the same batches, negatives, masks, schedule and early stopping as the heads.

    Raises:
        ConfigError: unknown key (names the key path) or a bad value.
    """
    if isinstance(cfg, TrainConfig):
        return cfg
    out = parse_train_config(
        cfg, model=DRTConfig, data=DRTSamplerConfig, trainer=DRTTrainerConfig, where=where
    )
    try:
        DRTConfig.from_dict({"dim": 1, **out.model})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}.model: {exc}") from exc
    return out


# --------------------------------------------------------------------------- objective


class DRTObjective(nn.Module):
    """What :func:`~treerank.training.trainer.fit` trains: a DRT head plus its extra loss.

    Implements :class:`~treerank.training.trainer.ContrastiveModule`; ``extra_loss`` is
    ``lambda_dec * (dec(Q) + dec(P)) / 2`` on the un-dropped unit slots of the last tower calls
    (queries ``Q (B, k, d_s)``, passages ``P (M, k, d_s)``). The search interface
    (``encode_queries`` / ``encode_passages`` / ``name``) is delegated to the head, so a
    ``validate`` callback can score this object as it would the head.
    """

    def __init__(self, head: DRTHead, lambda_dec: float = 0.1) -> None:
        super().__init__()
        self.head = head
        self.lambda_dec = float(lambda_dec)
        self.name = head.name
        self._last_dec = float("nan")

    def encode_queries_t(self, x: Tensor) -> Tensor:
        return self.head.encode_queries_t(x)

    def encode_passages_t(self, x: Tensor) -> Tensor:
        return self.head.encode_passages_t(x)

    def score_matrix(self, q_repr: Tensor, p_repr: Tensor) -> Tensor:
        return self.head.score_matrix(q_repr, p_repr)

    def extra_loss(self, q_repr: Tensor, p_repr: Tensor) -> Tensor:
        """``lambda_dec * (dec(Q) + dec(P)) / 2`` (0-d), on the slots of the last tower calls."""
        qs, ps = self.head.last_query_slots, self.head.last_passage_slots
        if qs is None or ps is None:
            raise RuntimeError("extra_loss called before the query and passage towers")
        dec = (decorrelation_loss(qs) + decorrelation_loss(ps)) / 2
        self._last_dec = float(dec.detach())
        return self.lambda_dec * dec

    def gather_batch_state(self, gather: Callable[[Tensor, str], Tensor]) -> None:
        """Data-parallel training (``treerank.distributed.training``): replace this rank's
        un-dropped slots by the whole batch's, so :meth:`extra_loss` sees every rank's rows."""
        if self.head.last_query_slots is not None:
            self.head.last_query_slots = gather(self.head.last_query_slots, "query")
        if self.head.last_passage_slots is not None:
            self.head.last_passage_slots = gather(self.head.last_passage_slots, "passage")

    def log_values(self) -> dict[str, float]:
        return {"decorrelation": self._last_dec, **self.head.log_values()}

    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        return self.head.encode_queries(x)

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        return self.head.encode_passages(x)


# --------------------------------------------------------------------------- entry point


def train_drt(
    store: StoreLike,
    config: Mapping[str, Any] | TrainConfig | None = None,
    *,
    train_rows: np.ndarray | None = None,
    validate: Validate | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
    device: Device = DEFAULT_DEVICE,
) -> TrainOutput:
    """Train a DRT head on a store (the ``drt`` family's trainer).

    The head is built right after ``torch.manual_seed(config.seed)`` (reproducible init), then
    trained by :func:`~treerank.training.heads.train_contrastive` (same sampler, negatives,
    masks, optimiser, schedule and early stopping as the thin heads) with the DRT objective.

    Args:
        store: the training ``EmbeddingStore``.
        config: a mapping or a parsed config (None: the defaults), see :func:`parse_drt_config`.
        train_rows: query ids to train on (None: all with a relevant passage).
        validate: held-out callback for early stopping, ``validate(model) -> {metric: value}``
            (None: train the full budget and keep the last state).
        log: where the records go (None: in memory).
        progress: tqdm bar.
        device: ``auto`` | ``cpu`` | ``cuda[:n]`` | None (CPU): where it trains (slot dropout
            masks are drawn on the CPU, so both devices draw the same ones).

    Returns:
        :class:`~treerank.training.trainer.TrainOutput`: the trained :class:`DRTHead` (eval
        mode, ``extra["training"]`` = the summary), the summary and the log records.

    Raises:
        ConfigError: bad config (the message names the key path).
    """
    cfg = parse_drt_config(config)
    torch.manual_seed(cfg.seed)
    head = DRTHead(DRTConfig.from_dict({"dim": int(store.dim), **cfg.model}))
    objective = DRTObjective(head, cfg.trainer.lambda_dec)
    result, summary = train_contrastive(
        objective,
        store,
        cfg,
        train_rows=train_rows,
        validate=validate,
        log=log,
        progress=progress,
        device=device,
    )
    head.eval()
    head.extra["training"] = summary
    return TrainOutput(head, summary, result.records)
