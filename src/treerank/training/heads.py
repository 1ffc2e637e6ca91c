"""Training the thin heads (``linear``, ``mlp``) on a store, and the contrastive data section.

A head config has the shape of every training config (``treerank.training.config``;
``configs/heads/*.yaml`` lists every key with its default)::

    seed: 0
    model:      constructor arguments of the head (LinearHead / MLPHead), ``dim`` excluded
    data:       batch size, hard negatives, false-negative guard  (SamplerConfig)
    trainer:    optimiser, schedule, logging, early stopping      (TrainerConfig)
    validation: held-out queries and how they are scored          (ValidationConfig)

Unknown sections or keys are errors naming the key path. :func:`train_contrastive` is the generic
"store + config + model -> trained model" step; the DRT trainer reuses it with its own module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from treerank.config import ConfigError
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.models.linear import LinearHead
from treerank.models.mlp import MLPHead
from treerank.store.format import MINED_NEGATIVES_ARRAY
from treerank.storelike import StoreLike
from treerank.training.config import TrainConfig, parse_train_config
from treerank.training.data import build_training_table, parse_sources, sample_rows
from treerank.training.denoise import DenoiseJob, parse_denoise
from treerank.training.history import TrainingLog
from treerank.training.refresh import NegativeRefresher
from treerank.training.sampler import (
    ContrastiveSampler,
    guard_mined_negatives,
    hard_negative_pool,
    relevant_lists,
    text_keys,
)
from treerank.training.sources import PairSampler
from treerank.training.trainer import (
    FitResult,
    TrainerConfig,
    TrainFunction,
    TrainOutput,
    Validate,
    fit,
)

__all__ = [
    "HeadTrainerConfig",
    "SamplerConfig",
    "build_sampler",
    "parse_head_config",
    "parse_linear_config",
    "parse_mlp_config",
    "train_contrastive",
    "train_head",
    "train_linear",
    "train_mlp",
]

HARD_NEGATIVE_SOURCES = ("auto", "candidates", "mined", "none")


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
        sources: training-data sources (``treerank.training.data.SourceSpec`` entries: labels,
            teacher pairs, pseudo-queries, with weights); None: the split's labels with the
            hard negatives above. With sources, batches hold in-batch negatives only (or every
            passage with ``trainer.negatives: all``).
        collisions: with sources, a batch never holds two queries sharing a target passage or a
            query text.
        refresh_depth: model ranks mined per query when ``trainer.refresh_every`` is set.
        refresh_max_rate: false-negative tolerance of the audit that sets the refreshed pool's
            guard depth (``treerank.training.audit``).
        refresh_on_rate_change: re-mine the pool only when the audit's false-negative rate at
            rank 1 moved by more than this since the last mining, or its guard depth changed
            (checked every ``trainer.refresh_every`` steps on the audit queries only); None:
            re-mine at every ``refresh_every``.
        max_queries: train on a seeded sample of this many of the split's queries
            (``treerank.training.data.sample_rows``, the rule of a ``data.sources`` entry's
            ``max_queries``; held-out queries stay out); None: all of them.
        sample_seed: seed of that sample.
        denoise: RocketQA's denoised hard negatives
            (:class:`~treerank.training.denoise.DenoiseSettings`: ``scorer: ce:<dir>``,
            ``depth``, ``threshold``, ``relative_margin``, ``precision``): the sampler reads the
            mined negatives a cross-encoder did not flag as positives
            (:func:`~treerank.training.denoise.denoised_array`); needs ``hard_negatives:
            mined`` and ``n_hard > 0``. None: the raw mined negatives.
    """

    batch_size: int = 64
    n_hard: int = 1
    hard_negatives: str = "auto"
    hard_pool_depth: int | None = 30
    mined_array: str = MINED_NEGATIVES_ARRAY
    mine_depth: int = 100
    guard_skip_top: int = 3
    guard_margin: float | None = None
    drop_last: bool = True
    sources: list[dict[str, Any]] | None = None
    collisions: bool = True
    refresh_depth: int = 100
    refresh_max_rate: float = 0.02
    refresh_on_rate_change: float | None = None
    max_queries: int | None = None
    sample_seed: int = 0
    denoise: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.sources is not None:
            parse_sources(self.sources)  # raises on a bad entry (the message names it)
            if self.max_queries is not None or self.denoise is not None:
                raise ValueError(
                    "max_queries and denoise apply to the labels sampler; with sources give "
                    "each entry its own max_queries"
                )
        if self.max_queries is not None and self.max_queries < 1:
            raise ValueError(f"max_queries must be >= 1, got {self.max_queries}")
        if self.denoise is not None:
            parse_denoise(self.denoise, "denoise")  # raises on a bad key or value
            if self.hard_negatives != "mined" or self.n_hard < 1:
                raise ValueError("denoise needs hard_negatives: mined and n_hard >= 1")
        if self.hard_negatives not in HARD_NEGATIVE_SOURCES:
            raise ValueError(
                f"hard_negatives {self.hard_negatives!r} unknown; "
                f"known: {', '.join(HARD_NEGATIVE_SOURCES)}"
            )
        if self.batch_size < 1 or self.n_hard < 0:
            raise ValueError("batch_size >= 1 and n_hard >= 0 are required")

    def denoise_job(self) -> DenoiseJob | None:
        """The denoised pool this section trains on (None: no ``denoise``): the mined array,
        denoised on the sampled queries."""
        spec = parse_denoise(self.denoise)
        if spec is None:
            return None
        return DenoiseJob(spec, self.mined_array, self.max_queries, int(self.sample_seed))


@dataclass
class HeadTrainerConfig(TrainerConfig):
    """The ``trainer`` section of the linear and MLP heads: :class:`TrainerConfig` with the
    heads' own defaults (``configs/heads/*.yaml`` list the same values; a test compares them).

    Attributes:
        epochs: 30 (the heads' recipe; the generic trainer's default is 20).
        threads: 1 (torch threads; the machine is shared).
    """

    epochs: int = 30
    threads: int | None = 1


def parse_head_config(
    cfg: Mapping[str, Any] | TrainConfig | None, head_class: type, where: str = "config"
) -> TrainConfig:
    """Parse a contrastive head's config (``model`` keys: ``head_class``'s constructor).

    Raises:
        ConfigError: unknown section or key, or a bad value (the message names the key path).
    """
    if isinstance(cfg, TrainConfig):
        return cfg
    return parse_train_config(
        cfg, model=head_class, data=SamplerConfig, trainer=HeadTrainerConfig, where=where
    )


def parse_linear_config(
    cfg: Mapping[str, Any] | TrainConfig | None, where: str = "config"
) -> TrainConfig:
    """The ``linear`` family's config parser."""
    return parse_head_config(cfg, LinearHead, where)


def parse_mlp_config(
    cfg: Mapping[str, Any] | TrainConfig | None, where: str = "config"
) -> TrainConfig:
    """The ``mlp`` family's config parser."""
    return parse_head_config(cfg, MLPHead, where)


def build_sampler(
    store: StoreLike,
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
    sample = sample_rows(int(store.n_queries), cfg.max_queries, cfg.sample_seed)
    if sample is not None:
        train_rows = sample if train_rows is None else np.intersect1d(train_rows, sample)
    job = cfg.denoise_job()
    array = cfg.mined_array if job is None else job.array
    mined = None
    if source == "mined" or (source == "auto" and not has_cand_neg):
        mined = store.load_array(array) if store.has_array(array) else None
        if mined is None and source == "mined":
            how = (
                "treerank.tasks.train.ensure_denoised_negatives"
                if job is not None
                else "treerank.search.negatives.mine_bm25_negatives"
            )
            raise ValueError(f"{store.path}: no sidecar array {array!r}; make it first ({how})")
    info: dict[str, Any] = {"hard_negatives": source}
    if job is not None:
        info["denoised_array"] = array
    if sample is not None:
        info["sampled_queries"] = int(sample.size)
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
        query_keys=text_keys(store.query_texts()) if store.has_texts else None,
    )
    info["train_queries"] = int(sampler.query_rows.size)
    info["batches_per_epoch"] = len(sampler)
    return sampler, info


def train_contrastive(
    model: torch.nn.Module,
    store: StoreLike,
    config: TrainConfig,
    *,
    train_rows: np.ndarray | None = None,
    validate: Validate | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
    device: Device = DEFAULT_DEVICE,
) -> tuple[FitResult, dict[str, Any]]:
    """Train any :class:`~treerank.training.trainer.ContrastiveModule` on a store.

    Args:
        model: the module (built by the caller after seeding, see :func:`train_head`).
        store: an ``EmbeddingStore`` (``queries``, ``passages``, ``candidates``, ``labels``,
            ``relevance_threshold``, ``has_array`` / ``load_array``).
        config: parsed config (its ``data`` (SamplerConfig) and ``trainer`` sections are used).
        train_rows: query ids to train on (None: all; the pipeline passes the non-held-out ones).
        validate: held-out callback for early stopping (None: train the full budget).
        log: where the records go (None: a fresh in-memory log; the records are also in the
            returned ``FitResult.records``).
        progress: tqdm bar.
        device: ``auto`` | ``cpu`` | ``cuda[:n]`` | None (CPU): where the model trains
            (:func:`~treerank.training.trainer.fit`); the model comes back on the CPU.

    Returns:
        ``(fit_result, summary)`` with the sampler info, fit outcome and config.
    """
    data: SamplerConfig = config.data
    log = log if log is not None else TrainingLog()
    refresh = None
    if data.sources is not None:
        table = build_training_table(store, parse_sources(data.sources), train_rows)
        sampler: Any = PairSampler(
            table.sources,
            weights=table.weights,
            batch_size=data.batch_size,
            seed=config.seed,
            collisions=data.collisions,
        )
        queries, passages = table.queries, table.passages
        info: dict[str, Any] = {"sources": table.info, "batches_per_epoch": len(sampler)}
    else:
        sampler, info = build_sampler(store, data, train_rows=train_rows, seed=config.seed)
        queries, passages = store.queries, store.passages
        if config.trainer.refresh_every:
            refresh = _refresher(store, sampler, data, train_rows, device)
    log.write("config", **config.to_dict(), sampler_info=info)
    result = fit(
        model,
        sampler,
        queries,
        passages,
        config.trainer,
        validate=validate,
        log=log,
        progress=progress,
        refresh=refresh,
        device=device,
    )
    summary = {
        "sampler": info,
        "steps": result.steps,
        "epochs": result.epochs,
        "best_step": result.best_step,
        # the kept weights are the initialisation: no step beat step 0 on the held-out queries
        "kept_initialisation": bool(result.best_step == 0 and result.best_metrics),
        "best_metrics": result.best_metrics,
        "stopped_early": result.stopped_early,
        "seconds": round(result.seconds, 3),
        "config": config.to_dict(),
    }
    return result, summary


def _refresher(
    store: StoreLike,
    sampler: ContrastiveSampler,
    data: SamplerConfig,
    train_rows: np.ndarray | None,
    device: Device = DEFAULT_DEVICE,
) -> NegativeRefresher:
    """ANCE-style refresh: the current model's exact top-``refresh_depth`` for every query,
    audited on the labelled queries held out of training (all labelled ones if none)."""
    from treerank.kernels.topk import exact_search

    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    labelled = np.flatnonzero(((cand >= 0) & (lab >= thr)).any(axis=1))
    held = labelled if train_rows is None else np.setdiff1d(labelled, train_rows)
    queries = np.asarray(store.queries, dtype=np.float32)

    def search(model: Any, q: np.ndarray) -> np.ndarray:
        ids, _ = exact_search(
            model.encode_queries(q),
            store.passages,
            k=data.refresh_depth,
            passage_transform=model.encode_passages,
            device=device,
        )
        return ids

    audit_rows = held if held.size else labelled
    return NegativeRefresher(
        sampler,
        cand,
        lab,
        lambda model: search(model, queries),
        relevance_threshold=thr,
        max_rate=data.refresh_max_rate,
        pool_depth=data.hard_pool_depth,
        audit_rows=audit_rows,
        rate_change=data.refresh_on_rate_change,
        audit_mine=lambda model: search(model, queries[audit_rows]),
    )


def train_head(
    head_class: type,
    store: StoreLike,
    config: Mapping[str, Any] | TrainConfig | None = None,
    *,
    train_rows: np.ndarray | None = None,
    validate: Validate | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
    device: Device = DEFAULT_DEVICE,
) -> TrainOutput:
    """Build a head of ``head_class`` for ``store``'s dimension and train it.

    ``device`` (``auto`` | ``cpu`` | ``cuda[:n]`` | None = CPU) is where it trains; the
    initialisation is drawn on the CPU first, so a CPU and a GPU run start from the same
    weights (they end within float32 rounding of each other, ``scripts/gpu_check.sh``).

    The head is constructed right after ``torch.manual_seed(config.seed)``, so its
    initialisation (orthogonal projections, MLP first layers) is reproducible.

    Returns:
        :class:`~treerank.training.trainer.TrainOutput` whose ``model.extra["training"]`` holds
        the summary (it travels in the checkpoint) and whose ``records`` are the training log.

    Raises:
        ConfigError: bad config (names the key path); ValueError: bad constructor values.
    """
    cfg = parse_head_config(config, head_class)
    torch.manual_seed(cfg.seed)
    try:
        head = head_class(int(store.dim), **cfg.model)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config.model: {exc}") from exc
    log = log if log is not None else TrainingLog()
    result, summary = train_contrastive(
        head,
        store,
        cfg,
        train_rows=train_rows,
        validate=validate,
        log=log,
        progress=progress,
        device=device,
    )
    head.extra["training"] = summary
    return TrainOutput(head, summary, result.records)


def _head_trainer(head_class: type, parse: Callable[..., TrainConfig], name: str) -> TrainFunction:
    """The :class:`~treerank.training.trainer.TrainFunction` of one head family: its config
    parser, then :func:`train_head`."""

    def train(
        store: StoreLike,
        config: Mapping[str, Any] | TrainConfig | None = None,
        *,
        train_rows: np.ndarray | None = None,
        validate: Validate | None = None,
        log: TrainingLog | None = None,
        progress: bool = True,
        device: Device = DEFAULT_DEVICE,
    ) -> TrainOutput:
        return train_head(
            head_class,
            store,
            parse(config),
            train_rows=train_rows,
            validate=validate,
            log=log,
            progress=progress,
            device=device,
        )

    train.__name__ = train.__qualname__ = f"train_{name}"
    train.__doc__ = f":func:`train_head` for ``{name}`` (the ``{name}`` family's trainer)."
    return train


train_linear = _head_trainer(LinearHead, parse_linear_config, "linear")
train_mlp = _head_trainer(MLPHead, parse_mlp_config, "mlp")
