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

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor, nn

from treerank.models.checkpoint import save_checkpoint
from treerank.models.drt import DRTConfig, DRTHead
from treerank.training.heads import HeadConfig, train_contrastive
from treerank.training.history import plot_curves, read_log
from treerank.training.trainer import TrainOutput, Validate

__all__ = [
    "DRTLossConfig",
    "DRTObjective",
    "DRTTrainConfig",
    "decorrelation_loss",
    "train_drt",
]

LOG_FILE = "training_log.jsonl"
CURVES_FILE = "training_curves.png"


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
class DRTLossConfig:
    """Loss terms beside InfoNCE (the seed's defaults).

    Attributes:
        lambda_dec: weight of the slot decorrelation term (0 disables it).
    """

    lambda_dec: float = 0.1


@dataclass
class DRTTrainConfig:
    """The whole config of one DRT training run (``configs/drt/*.yaml`` lists every key)::

        seed: 0
        model:      DRTConfig arguments except ``dim`` (taken from the store)
        loss:       DRTLossConfig (lambda_dec)
        sampler:    as the thin heads (SamplerConfig)
        trainer:    as the thin heads (TrainerConfig)
        validation: as the thin heads (ValidationConfig)

    The sampler, trainer and validation sections are parsed by
    :class:`~treerank.training.heads.HeadConfig`, so DRT trains on the same batches, negatives,
    masks, schedule and early stopping as the heads.
    """

    head: HeadConfig = field(default_factory=HeadConfig)
    loss: DRTLossConfig = field(default_factory=DRTLossConfig)

    @property
    def seed(self) -> int:
        return self.head.seed

    @property
    def model(self) -> dict[str, Any]:
        return self.head.model

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None, where: str = "config") -> DRTTrainConfig:
        """Parse and validate a config mapping.

        Raises:
            ValueError: unknown section or key, or a bad value (the message names ``where``
                and the key).
        """
        cfg = dict(cfg or {})
        loss_d = cfg.pop("loss", None) or {}
        if not isinstance(loss_d, Mapping):
            raise ValueError(f"{where}: loss must be a mapping")
        unknown = sorted(set(loss_d) - {f.name for f in fields(DRTLossConfig)})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown} in loss; known: ['lambda_dec']")
        loss = DRTLossConfig(**loss_d)
        if loss.lambda_dec < 0:
            raise ValueError(f"{where}: loss.lambda_dec must be >= 0, got {loss.lambda_dec}")
        head = HeadConfig.from_dict(cfg, where=where)
        if "dim" in head.model:
            raise ValueError(f"{where}: model.dim is taken from the store; remove it")
        try:
            DRTConfig.from_dict({"dim": 1, **head.model})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: model: {exc}") from exc
        return cls(head=head, loss=loss)

    @classmethod
    def from_yaml(cls, path: str | Path) -> DRTTrainConfig:
        """Read a YAML config file.

        Raises:
            FileNotFoundError: no such file. ValueError: bad YAML or bad keys (names the file).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: DRT config not found")
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from exc
        return cls.from_dict(doc, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        return {**self.head.to_dict(), "loss": asdict(self.loss)}


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
    store: Any,
    config: Mapping[str, Any] | DRTTrainConfig | str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    train_rows: np.ndarray | None = None,
    validate: Validate | None = None,
    log_path: str | Path | None = None,
    progress: bool = True,
) -> TrainOutput:
    """Train a DRT head on a store (the ``treerank train --model drt`` entry).

    The head is built right after ``torch.manual_seed(config.seed)`` (reproducible init), then
    trained by :func:`~treerank.training.heads.train_contrastive` (same sampler, negatives,
    masks, optimiser, schedule and early stopping as the thin heads) with the DRT objective.

    Args:
        store: the training ``EmbeddingStore``.
        config: a mapping, a :class:`DRTTrainConfig`, or a YAML path (None: the defaults).
        out_dir: if given, the checkpoint is saved there (``config.json`` +
            ``weights.safetensors``, bound to the store's encoder fingerprint), with the JSONL
            training log (``training_log.jsonl``) and its curves (``training_curves.png``).
        train_rows: query ids to train on (None: all with a relevant passage).
        validate: held-out callback for early stopping, ``validate(model) -> {metric: value}``
            (None: train the full budget and keep the last state).
        log_path: JSONL log path (default: ``out_dir/training_log.jsonl`` or in memory).
        progress: tqdm bar.

    Returns:
        :class:`~treerank.training.trainer.TrainOutput`: the trained :class:`DRTHead` (eval
        mode, ``extra["training"]`` = the summary) and the summary.

    Raises:
        ValueError: bad config (the message names the key).
    """
    if isinstance(config, DRTTrainConfig):
        cfg = config
    elif isinstance(config, (str, Path)):
        cfg = DRTTrainConfig.from_yaml(config)
    else:
        cfg = DRTTrainConfig.from_dict(config)
    out = Path(out_dir) if out_dir is not None else None
    tmp_dir: Path | None = None
    if log_path is None and out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.log-", dir=out.parent))
        log_path = tmp_dir / LOG_FILE
    try:
        torch.manual_seed(cfg.seed)
        head = DRTHead(DRTConfig.from_dict({"dim": int(store.dim), **cfg.model}))
        objective = DRTObjective(head, cfg.loss.lambda_dec)
        _, summary = train_contrastive(
            objective,
            store,
            cfg.head,
            train_rows=train_rows,
            validate=validate,
            log_path=log_path,
            progress=progress,
        )
        summary["config"] = cfg.to_dict()
        head.eval()
        head.extra["training"] = summary
        if out is not None:
            save_checkpoint(out, head.to_checkpoint(store.encoder_name, store.encoder_fingerprint))
            if tmp_dir is not None and log_path is not None:
                os.replace(log_path, out / LOG_FILE)
                log_path = out / LOG_FILE
            if log_path is not None:
                plot_curves(
                    read_log(log_path),
                    out / CURVES_FILE,
                    metric=cfg.head.trainer.early_stopping_metric if validate else None,
                    title=f"DRT (k={head.k}, d_s={head.config.slot_dim})",
                )
    finally:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return TrainOutput(head, summary)
