"""Training the thin heads (``linear``, ``mlp``) on a store, and the config every one reads.

A head config is a mapping with five sections (``configs/heads/*.yaml`` lists every key with
its default)::

    seed: 0
    model:      constructor arguments of the head (LinearHead / MLPHead)
    sampler:    batch size, hard negatives, false-negative guard  (SamplerConfig)
    trainer:    optimiser, schedule, logging, early stopping      (TrainerConfig)
    validation: held-out queries and how they are scored          (ValidationConfig)

Unknown sections or keys are errors naming the key. :func:`train_contrastive` is the generic
"store + config + model -> trained model" step; the DRT trainer reuses it with its own module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treerank.training.history import TrainingLog
from treerank.training.holdout import ValidationConfig
from treerank.training.sampler import (
    ContrastiveSampler,
    guard_mined_negatives,
    hard_negative_pool,
    relevant_lists,
)
from treerank.training.trainer import FitResult, TrainerConfig, TrainOutput, Validate, fit

__all__ = [
    "HEAD_TYPES",
    "HeadConfig",
    "SamplerConfig",
    "ValidationConfig",
    "build_sampler",
    "make_head",
    "train_contrastive",
    "train_head",
    "train_linear",
    "train_mlp",
]

HEAD_TYPES: dict[str, str] = {
    "linear": "treerank.models.linear:LinearHead",
    "mlp": "treerank.models.mlp:MLPHead",
}


@dataclass
class SamplerConfig:
    """Batches and negatives.

    Attributes:
        batch_size: queries per batch ``B``.
        n_hard: hard negatives per query ``H`` (0: in-batch negatives only).
        hard_negatives: ``auto`` | ``candidates`` | ``mined`` | ``none`` (see
            :func:`~treerank.training.sampler.hard_negative_pool`).
        hard_pool_depth: draw from the first this-many valid negatives of each query's pool.
        mined_array: store sidecar array holding mined negatives (``treerank.search.negatives``).
        mine_depth: BM25 ranks mined per query when the pipeline has to mine that array.
        guard_skip_top: false-negative guard: drop the first ranks of each mined list.
        guard_margin: false-negative guard: drop a mined negative whose frozen score is within
            this margin of the query's best positive (None: off).
        drop_last: drop a final short batch.
    """

    batch_size: int = 64
    n_hard: int = 1
    hard_negatives: str = "auto"
    hard_pool_depth: int | None = 30
    mined_array: str = "bm25_negatives"
    mine_depth: int = 100
    guard_skip_top: int = 3
    guard_margin: float | None = None
    drop_last: bool = True


@dataclass
class HeadConfig:
    """The whole config of one head training run (see the module docstring)."""

    seed: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None, where: str = "config") -> HeadConfig:
        """Parse and validate a config mapping.

        Raises:
            ValueError: unknown section or key, or a bad value (the message names the key).
        """
        cfg = dict(cfg or {})
        known = {"seed", "model", "sampler", "trainer", "validation"}
        for k in cfg:
            if k not in known:
                raise ValueError(
                    f"{where}: unknown section {k!r}; known: {', '.join(sorted(known))}"
                )
        for k in ("model", "sampler", "trainer", "validation"):
            if cfg.get(k) is not None and not isinstance(cfg[k], Mapping):
                raise ValueError(f"{where}: {k} must be a mapping")
        seed = int(cfg.get("seed", 0))
        sampler = _section(SamplerConfig, cfg.get("sampler"), f"{where}: sampler")
        tr = dict(cfg.get("trainer") or {})
        _check_keys(TrainerConfig, tr, f"{where}: trainer")
        tr.setdefault("seed", seed)
        trainer = TrainerConfig.from_dict(tr, where=f"{where}: trainer")
        validation = ValidationConfig.from_config(cfg, where)
        if validation.fraction > 0 and trainer.early_stopping_metric not in validation.metrics:
            raise ValueError(
                f"{where}: trainer.early_stopping_metric {trainer.early_stopping_metric!r} "
                f"is not in validation.metrics {validation.metrics}"
            )
        if sampler.hard_negatives not in ("auto", "candidates", "mined", "none"):
            raise ValueError(f"{where}: sampler.hard_negatives {sampler.hard_negatives!r} unknown")
        return cls(seed, dict(cfg.get("model") or {}), sampler, trainer, validation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "model": dict(self.model),
            "sampler": asdict(self.sampler),
            "trainer": self.trainer.to_dict(),
            "validation": asdict(self.validation),
        }


def _check_keys(cls: type, d: Mapping[str, Any], where: str) -> None:
    names = {f.name for f in fields(cls)}
    for k in d:
        if k not in names:
            raise ValueError(f"{where}: unknown key {k!r}; known: {', '.join(sorted(names))}")


def _section(cls: type, d: Mapping[str, Any] | None, where: str) -> Any:
    d = dict(d or {})
    _check_keys(cls, d, where)
    try:
        return cls(**d)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def make_head(model_type: str, dim: int, model_cfg: Mapping[str, Any]) -> Any:
    """Instantiate a head by name (``HEAD_TYPES``).

    Raises:
        KeyError: unknown head type. ValueError: bad constructor arguments.
    """
    import importlib

    try:
        module, _, cls_name = HEAD_TYPES[model_type].partition(":")
    except KeyError:
        raise KeyError(f"unknown head {model_type!r}; known: {', '.join(HEAD_TYPES)}") from None
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        return cls(dim, **dict(model_cfg))
    except TypeError as exc:
        raise ValueError(f"{model_type}: bad model config {dict(model_cfg)}: {exc}") from exc


def build_sampler(
    store: Any,
    cfg: SamplerConfig,
    *,
    train_rows: np.ndarray | None = None,
    seed: int = 0,
) -> tuple[ContrastiveSampler, dict[str, Any]]:
    """The sampler of a store: positives from its labels, hard negatives per ``cfg``.

    Mined negatives are read from the store sidecar ``cfg.mined_array`` (``int32 (nq, N)`` in
    BM25 rank order, written by ``treerank.search.negatives.mine_bm25_negatives``) and passed
    through the false-negative guard.

    Returns:
        ``(sampler, info)``: ``info`` records the hard-negative source and pool statistics.

    Raises:
        ValueError: ``hard_negatives: mined`` but the store has no such array.
    """
    candidates = np.asarray(store.candidates)
    labels = np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    source = cfg.hard_negatives
    has_cand_neg = bool(np.any((candidates >= 0) & (labels == 0)))
    mined = None
    if source == "mined" or (source == "auto" and not has_cand_neg):
        mined = store.load_array(cfg.mined_array) if store.has_array(cfg.mined_array) else None
        if mined is None and source == "mined":
            raise ValueError(
                f"{store.path}: no sidecar array {cfg.mined_array!r}; mine it first "
                "(treerank.search.negatives.mine_bm25_negatives)"
            )
    info: dict[str, Any] = {"hard_negatives": source}
    if mined is not None:
        relevant, _ = relevant_lists(candidates, labels, thr)
        before = int((mined >= 0).sum())
        mined = guard_mined_negatives(
            mined,
            skip_top=cfg.guard_skip_top,
            margin=cfg.guard_margin,
            query_vectors=store.queries,
            passage_vectors=store.passages,
            relevant=relevant,
        )
        info["guard_dropped_fraction"] = 1.0 - int((mined >= 0).sum()) / max(1, before)
    pool = hard_negative_pool(candidates, labels, mined, source, cfg.hard_pool_depth)
    info["resolved_source"] = (
        "candidates"
        if source == "auto" and has_cand_neg
        else ("mined" if mined is not None else ("none" if source == "auto" else source))
    )
    info["mean_pool_size"] = float((pool >= 0).sum(axis=1).mean()) if pool.size else 0.0
    sampler = ContrastiveSampler(
        candidates,
        labels,
        relevance_threshold=thr,
        query_rows=train_rows,
        batch_size=cfg.batch_size,
        n_hard=cfg.n_hard,
        hard_pool=pool,
        seed=seed,
        drop_last=cfg.drop_last,
    )
    info["train_queries"] = int(sampler.query_rows.size)
    info["batches_per_epoch"] = len(sampler)
    return sampler, info


def train_contrastive(
    model: torch.nn.Module,
    store: Any,
    config: HeadConfig,
    *,
    train_rows: np.ndarray | None = None,
    validate: Validate | None = None,
    log_path: str | Path | None = None,
    progress: bool = True,
) -> tuple[FitResult, dict[str, Any]]:
    """Train any :class:`~treerank.training.trainer.ContrastiveModule` on a store.

    Args:
        model: the module (built by the caller after seeding, see :func:`train_head`).
        store: an ``EmbeddingStore`` (``queries``, ``passages``, ``candidates``, ``labels``,
            ``relevance_threshold``, ``has_array`` / ``load_array``).
        config: parsed config (its ``sampler`` and ``trainer`` sections are used here).
        train_rows: query ids to train on (None: all; the pipeline passes the non-held-out ones).
        validate: held-out callback for early stopping (None: train the full budget).
        log_path: JSONL training log (None: in memory).
        progress: tqdm bar.

    Returns:
        ``(fit_result, summary)`` with the sampler info, fit outcome and config.
    """
    sampler, info = build_sampler(store, config.sampler, train_rows=train_rows, seed=config.seed)
    log = TrainingLog(log_path)
    try:
        log.write("config", **config.to_dict(), sampler_info=info)
        result = fit(
            model,
            sampler,
            store.queries,
            store.passages,
            config.trainer,
            validate=validate,
            log=log,
            progress=progress,
        )
    finally:
        log.close()
    summary = {
        "sampler": info,
        "steps": result.steps,
        "epochs": result.epochs,
        "best_step": result.best_step,
        "best_metrics": result.best_metrics,
        "stopped_early": result.stopped_early,
        "seconds": round(result.seconds, 3),
        "config": config.to_dict(),
    }
    return result, summary


def train_head(
    model_type: str,
    store: Any,
    config: Mapping[str, Any] | HeadConfig | None = None,
    *,
    train_rows: np.ndarray | None = None,
    validate: Validate | None = None,
    log_path: str | Path | None = None,
    progress: bool = True,
) -> TrainOutput:
    """Build a ``linear`` / ``mlp`` head for ``store``'s dimension and train it.

    The head is constructed right after ``torch.manual_seed(config.seed)``, so its
    initialisation (orthogonal projections, MLP first layers) is reproducible.

    Returns:
        :class:`~treerank.training.trainer.TrainOutput` whose ``model.extra["training"]`` holds
        the summary (it travels in the checkpoint).

    Raises:
        KeyError: unknown head; ValueError: bad config.
    """
    cfg = config if isinstance(config, HeadConfig) else HeadConfig.from_dict(config)
    torch.manual_seed(cfg.seed)
    head = make_head(model_type, int(store.dim), cfg.model)
    _, summary = train_contrastive(
        head,
        store,
        cfg,
        train_rows=train_rows,
        validate=validate,
        log_path=log_path,
        progress=progress,
    )
    head.extra["training"] = summary
    return TrainOutput(head, summary)


def train_linear(store: Any, config: Mapping[str, Any] | None = None, **kwargs: Any) -> TrainOutput:
    """:func:`train_head` for ``linear`` (the ``treerank train --model linear`` entry)."""
    return train_head("linear", store, config, **kwargs)


def train_mlp(store: Any, config: Mapping[str, Any] | None = None, **kwargs: Any) -> TrainOutput:
    """:func:`train_head` for ``mlp`` (the ``treerank train --model mlp`` entry)."""
    return train_head("mlp", store, config, **kwargs)
