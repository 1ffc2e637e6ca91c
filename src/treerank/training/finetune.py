"""Fine-tuning the encoder itself on sentence-transformers' trainer (``treerank finetune``).

There is no training loop here: :func:`finetune` builds a Hugging Face ``Dataset`` from
treerank's own batch plan and runs ``SentenceTransformerTrainer`` with

* ``biencoder``: ``MultipleNegativesRankingLoss`` or ``CachedMultipleNegativesRankingLoss``
  (GradCache, Gao et al., 2021) on ``(anchor, positive[, negative])`` texts, shared towers;
* ``query-tower``: :class:`~treerank.training.finetune_losses.StoredPassageLoss`, queries only,
  against the store's passage vectors;
* ``drt-query-tower``: :class:`~treerank.training.finetune_losses.StoredPassageDRTLoss`, the
  query tower with the DRT heads (the query-side variant of the seed's Scale 2);
* ``drt-e2e``: :class:`~treerank.training.finetune_losses.DRTEndToEndLoss`, the DRT heads on the
  unfrozen encoder, on the ``biencoder`` family's very dataset and batches. The heads are built
  right after ``torch.manual_seed(seed)``; they are a module of the loss (``loss.head``), which
  sentence-transformers' trainer optimises with the encoder (parameters named ``head.*`` at
  ``trainer.head_lr`` through its ``learning_rate_mapping``; no weight decay on norms and
  biases). The run writes the encoder alone as ``model/`` (a plain sentence-transformers folder
  whose vectors are the raw vectors the heads read) and the heads as a treerank DRT checkpoint
  ``drt_head/`` bound to the tuned encoder's fingerprint: a re-embedded store of ``model/``
  plus ``drt_head/`` is everything the DRT scorer needs (``ckpt:RUN/drt_head`` on that store).

**The batch plan.** Batches come from :class:`~treerank.training.sources.PairSampler` over the
split's labels (:func:`~treerank.training.sources.label_pairs`), so the batch-collision rule of
every treerank sampler holds: no two queries of a batch share a relevant passage or a text.
Every epoch's batches are laid out up front, row after row, and fed in order (a sequential
batch sampler), so the plan is a pure function of the store, the config and the seed; the
trainer's own resume (which skips the batches already trained) then lands exactly where the
interrupted run stood. Hard negatives are the BM25 ranks mined into the store's sidecar by the
pipeline (``data.hard_negatives: mined``), after the false-negative guard's ``skip_top``.

**Checkpoints** are the trainer's (weights, optimiser, scheduler, RNG states, trainer state
with the step, hence the sampler position; for the DRT families also the heads' weights,
``drt_head.safetensors``), every ``trainer.save_steps`` steps, each written
into a temporary folder and renamed into place (:class:`_Trainer`), so a killed run never leaves
a half-written ``checkpoint-N``. ``resume=True`` continues from the newest one, bit-identically
on the same machine (``tests/training/test_finetune.py``).

**Under torchrun** (a process group from :func:`treerank.distributed.context.launch`) the run is
data-parallel on the one-process plan: each planned batch is split into ``W`` contiguous shards
(accelerate's ``split_batches``; ``data.batch_size`` must be a multiple of ``W``:
:func:`check_data_parallel`), the trainer wraps the encoder in DDP, and
:class:`~treerank.training.finetune_losses.CrossRankLoss` gathers every rank's rows, so each
query meets the whole batch's passages and the gradient is the one-process gradient
(``tests/distributed/test_finetune.py``). Every rank writes its RNG state into one staging
folder per checkpoint, which rank 0 renames into place; rank 0 alone writes ``model/``,
``drt_head/`` and ``finetune.json`` (``summary.world_size``). GradCache is not built across
processes (refused).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from treerank.atomic import atomic_write_json
from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device
from treerank.storelike import StoreLike
from treerank.training.data import build_training_table
from treerank.training.finetune_config import CE_FAMILY, FinetuneConfig, drt_head_config
from treerank.training.finetune_losses import (
    CrossRankLoss,
    DistilledMNRLLoss,
    DRTEndToEndLoss,
    StoredPassageDRTLoss,
    StoredPassageLoss,
    cached_drt_loss,
)
from treerank.training.model_folder import (
    latest_checkpoint,
    loss_log,
    save_model_folder,
    staged_checkpoints,
)
from treerank.training.precision import resolve_precision
from treerank.training.sampler import guard_mined_negatives, relevant_lists
from treerank.training.sources import PairSampler, label_pairs

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainingArguments

    from treerank.distributed.context import DistContext

__all__ = [
    "CHECKPOINTS_DIR",
    "DRT_HEAD_DIR",
    "MODEL_DIR",
    "BatchPlan",
    "EncoderStoreMismatchError",
    "FinetuneOutput",
    "check_data_parallel",
    "export_onnx",
    "finetune",
    "freeze",
    "latest_checkpoint",
    "load_base",
    "plan_batches",
    "resolve_precision",
]

CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"
DRT_HEAD_DIR = "drt_head"
HEAD_WEIGHTS = "drt_head.safetensors"
FINETUNE_JSON = "finetune.json"


class EncoderStoreMismatchError(ValueError):
    """An encoder and a store that do not belong together (different weights fingerprint or
    data); the message names both."""


@dataclass
class BatchPlan:
    """Every training row of the run, in the order the trainer sees them.

    Attributes:
        query_rows: ``int64 (n,)`` store query id of each row.
        positive: ``int64 (n,)`` its designated positive passage id.
        masked: ``int64 (n, m)`` passages kept out of its softmax (``-1`` padding).
        hard: ``int64 (n, h)`` hard negatives (``-1`` padding; ``h = 0`` without).
        batch_size: rows per batch (the last batch of an epoch may be shorter: never).
        epochs: epochs laid out.
        targets: ``int64 (n, L)`` with ``data.sources``: each row's passages carrying target
            mass (a ``soft`` teacher's top ``k``; the designated positive for the other rows),
            ``-1`` padding; None: the designated positive alone (the labels' plan).
        weights: ``float32 (n, L)`` their mass, rows summing to 1 (with ``targets``).
        teacher: ``float32 (n, L)`` a ``margin-mse`` teacher's scores of ``targets`` divided by
            its temperature (NaN on other rows and padding); None without such a source.
        sources: per source: pairs, weight and mode (the summary's ``sources``).
        pair_teacher: ``float32 (n, 1 + h)`` ``biencoder`` with a graded teacher: the teacher's
            logits of each row's ``[positive, hard...]`` columns (NaN: not graded), or None.
        pair_mode: ``int8 (n,)`` 0 (no teacher), 1 (soft: listwise KL over the row's columns),
            2 (margin-mse), with ``pair_teacher``.
    """

    query_rows: np.ndarray
    positive: np.ndarray
    masked: np.ndarray
    hard: np.ndarray
    batch_size: int
    epochs: int
    targets: np.ndarray | None = None
    weights: np.ndarray | None = None
    teacher: np.ndarray | None = None
    sources: dict[str, Any] | None = None
    pair_teacher: np.ndarray | None = None
    pair_mode: np.ndarray | None = None

    @property
    def n_batches(self) -> int:
        return int(self.query_rows.shape[0] // self.batch_size)


def plan_batches(
    store: StoreLike,
    cfg: FinetuneConfig,
    *,
    train_rows: np.ndarray | None = None,
    mined: np.ndarray | None = None,
) -> BatchPlan:
    """Lay out every batch of every epoch (see the module doc).

    Args:
        store: the training split.
        cfg: the parsed config (``data`` and ``seed`` are read).
        train_rows: query ids to train on (None: all with a relevant passage).
        mined: ``int (n_queries, N)`` BM25-mined negatives of the split (``-1`` empty), or None.

    Returns:
        The :class:`BatchPlan`; rows are batch-major (batch ``b`` is rows
        ``[b * batch_size, (b + 1) * batch_size)``).

    Raises:
        ValueError: no training query has a relevant passage; ``hard_negatives: mined``
            without ``mined``.
    """
    data = cfg.data
    specs = data.source_specs()
    table = None
    if specs is None:
        sets = [
            label_pairs(
                store.candidates,
                store.labels,
                store.query_texts(),
                relevance_threshold=int(store.relevance_threshold),
                query_rows=train_rows,
            )
        ]
    else:  # the heads' sources: labels and teacher runs of the training queries
        table = build_training_table(store, specs, train_rows)
        sets = table.sources
    sampler = PairSampler(
        sets,
        weights=None if table is None else table.weights,
        batch_size=data.batch_size,
        seed=cfg.train.seed,
        collisions=data.collisions,
    )
    want_hard = data.hard_negatives == "mined" and data.n_hard > 0
    if want_hard and mined is None:
        raise ValueError("data.hard_negatives is 'mined' but no mined negatives were given")
    pool = (
        guard_mined_negatives(np.asarray(mined), skip_top=data.guard_skip_top)
        if want_hard and mined is not None
        else None
    )
    rng = np.random.default_rng([cfg.train.seed, 7919])
    q_rows: list[np.ndarray] = []
    pos: list[np.ndarray] = []
    masked: list[np.ndarray] = []
    hard: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    graded: list[np.ndarray] = []
    for epoch in range(data.epochs):
        for batch in sampler.epoch(epoch):
            assert batch.target_ids is not None and batch.exclude_ids is not None
            assert batch.target_weights is not None
            q_rows.append(batch.query_rows)
            pos.append(batch.passage_rows[batch.positive.argmax(axis=1)])
            masked.append(np.concatenate([batch.target_ids, batch.exclude_ids], axis=1))
            targets.append(batch.target_ids)
            weights.append(batch.target_weights)
            if batch.teacher_scores is not None:  # the teacher's values of the row's targets
                at = np.searchsorted(batch.passage_rows, np.clip(batch.target_ids, 0, None))
                at = np.clip(at, 0, batch.passage_rows.size - 1)
                g = np.take_along_axis(batch.teacher_scores, at, axis=1)
                graded.append(np.where(batch.target_ids >= 0, g, np.nan).astype(np.float32))
            h = np.full((len(batch.query_rows), data.n_hard if want_hard else 0), -1, np.int64)
            if pool is not None:
                for i, q in enumerate(batch.query_rows):
                    cand = pool[q][pool[q] >= 0]
                    if cand.size:
                        h[i] = rng.choice(cand, size=h.shape[1], replace=cand.size < h.shape[1])
            hard.append(h)
    plan = BatchPlan(
        np.concatenate(q_rows).astype(np.int64),
        np.concatenate(pos).astype(np.int64),
        _stack(masked, -1).astype(np.int64),
        np.concatenate(hard).astype(np.int64),
        data.batch_size,
        data.epochs,
    )
    if table is not None:
        plan.targets = _stack(targets, -1).astype(np.int64)
        plan.weights = _stack(weights, 0).astype(np.float32)
        plan.teacher = _stack(graded, np.nan).astype(np.float32) if graded else None
        plan.sources = table.info
        graded_rows = (plan.targets >= 0).sum(axis=1) > 1  # a soft or margin-mse teacher's
        if cfg.family == "biencoder" and data.n_hard > 0 and bool(graded_rows.any()):
            rel, _ = relevant_lists(
                np.asarray(store.candidates), np.asarray(store.labels), store.relevance_threshold
            )
            _pair_teacher(plan, rel, data.n_hard, cfg.train.seed)
    return plan


def _pair_teacher(plan: BatchPlan, relevant: np.ndarray, n_hard: int, seed: int) -> None:
    """The bi-encoder's distillation columns, in place: each row with a graded teacher (more
    than one target) gets as its ``n_hard`` negatives a seeded draw from its teacher's other
    targets (never a labelled relevant passage), and ``plan.pair_teacher`` the teacher's
    logits of ``[anchor, negative_0, ...]`` (``margin-mse``: its scores / temperature;
    ``soft``: the log of its weights, so a softmax over the drawn columns is the teacher's
    distribution renormalised to them); ``plan.pair_mode`` 1 (soft) or 2 (margin-mse), 0 for
    rows without a teacher (their negatives are left as they were)."""
    n = len(plan.query_rows)
    assert plan.targets is not None and plan.weights is not None
    hard = np.full((n, n_hard), -1, np.int64)
    hard[:, : plan.hard.shape[1]] = plan.hard[:, :n_hard]
    table = np.full((n, 1 + n_hard), np.nan, np.float32)
    mode = np.zeros(n, np.int8)
    rng = np.random.default_rng([seed, 104729])
    for i in range(n):
        tid = plan.targets[i]
        ok = np.flatnonzero(tid >= 0)
        if ok.size < 2:
            continue
        margin = plan.teacher is not None and bool(np.isfinite(plan.teacher[i]).any())
        if margin:
            assert plan.teacher is not None
            logit = plan.teacher[i]
        else:
            logit = np.log(np.maximum(plan.weights[i], np.float32(1e-30)))
        rel = set(relevant[plan.query_rows[i]].tolist())
        anchor = int(np.flatnonzero(tid == plan.positive[i])[0])
        cand = [j for j in ok if j != anchor and int(tid[j]) not in rel and np.isfinite(logit[j])]
        if not cand:
            continue
        pick = rng.choice(np.asarray(cand), size=min(n_hard, len(cand)), replace=False)
        hard[i] = -1
        hard[i, : pick.size] = tid[pick]
        table[i, 0] = logit[anchor]
        table[i, 1 : 1 + pick.size] = logit[pick]
        mode[i] = 2 if margin else 1
    plan.hard, plan.pair_teacher, plan.pair_mode = hard, table, mode


def _stack(parts: list[np.ndarray], pad: float) -> np.ndarray:
    """Row blocks of different widths, right-padded with ``pad`` to the widest."""
    width = max(p.shape[1] for p in parts)
    return np.concatenate(
        [np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=pad) for p in parts]
    )


def load_base(base: str | None, store: StoreLike, *, device: Device = DEFAULT_DEVICE) -> Any:
    """The encoder to fine-tune, refused unless it is the one ``store`` was embedded with.

    Returns:
        ``(SentenceTransformer, fingerprint)``.

    Raises:
        EncoderStoreMismatchError: the weights fingerprint differs from the store's (both named).
    """
    enc = _base_encoder(base, store, device)
    return enc.model, enc.fingerprint


def _base_encoder(base: str | None, store: StoreLike, device: Device) -> Any:
    """:func:`load_base`'s ``SentenceEncoder`` (the ``precision: auto`` probe encodes with it)."""
    from treerank.encoders import SentenceEncoder

    enc = SentenceEncoder(base, device=device, progress=False)
    want = store.encoder_fingerprint
    if want is not None and enc.fingerprint != want:
        raise EncoderStoreMismatchError(
            f"model {base or enc.name!r} has weights {enc.fingerprint[:19]}..., but store "
            f"{store.path} was embedded with {want[:19]}...: fine-tune the store's own encoder"
        )
    return enc


def freeze(model: Any, *, embeddings: bool, layers: int) -> int:
    """Freeze the token embeddings and / or the bottom ``layers`` transformer layers.

    Returns:
        The number of parameters left trainable.

    Raises:
        ValueError: more layers than the model has, or a model without a BERT-style encoder.
    """
    for hf in _transformers(model):  # one per tower
        if embeddings:
            for p in hf.embeddings.parameters():
                p.requires_grad_(False)
        if layers:
            blocks = getattr(getattr(hf, "encoder", None), "layer", None)
            if blocks is None or layers > len(blocks):
                n = "no" if blocks is None else len(blocks)
                raise ValueError(f"freeze_layers={layers}, but the encoder has {n} layers")
            for block in blocks[:layers]:
                for p in block.parameters():
                    p.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _transformers(model: Any) -> list[Any]:
    """The Hugging Face encoder of each tower of ``model`` (two for an untied model)."""
    from sentence_transformers.sentence_transformer.modules import Router

    from treerank.encoders.sentence import ROUTES

    first: Any = model[0]
    if not isinstance(first, Router):
        return [first.auto_model]
    towers: Any = first.sub_modules
    return [towers[route][0].auto_model for route in dict.fromkeys(ROUTES.values())]


def untie(model: Any) -> Any:
    """DPR's separate towers (Karpukhin et al. 2020): a ``SentenceTransformer`` whose first
    module is a sentence-transformers ``Router`` with a query tower (a copy of ``model``'s
    modules) and a document tower (``model``'s own), both starting from the same weights.

    Returns:
        The two-tower model (on ``model``'s device); queries are routed with ``task="query"``,
        passages with ``task="document"`` (:func:`treerank.encoders.sentence.is_routed`).
    """
    import copy

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Router

    mods = list(model)
    router = Router.for_query_document(
        query_modules=[copy.deepcopy(m) for m in mods], document_modules=mods
    )
    return SentenceTransformer(modules=[router], device=str(model.device))


def _trainer_class() -> Any:
    from sentence_transformers import SentenceTransformerTrainer

    class _Trainer(staged_checkpoints(SentenceTransformerTrainer)):  # type: ignore[misc]
        """The trainer with each checkpoint written into a temporary folder, then renamed
        (:func:`~treerank.training.model_folder.staged_checkpoints`); a loss with ``head`` (the
        DRT families) has the heads' weights saved into every checkpoint and loaded back on
        resume."""

        def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
            super()._save(output_dir, state_dict)
            head = getattr(self.loss, "head", None)
            if head is not None:
                from safetensors.torch import save_file

                where = Path(str(output_dir if output_dir is not None else self.args.output_dir))
                # the head's own checkpoint state (a shared tower's tensors once)
                state = {k: v.detach().contiguous() for k, v in head.checkpoint_state().items()}
                save_file(state, str(where / HEAD_WEIGHTS))

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            checkpoint_path = resume_from_checkpoint
            super()._load_from_checkpoint(checkpoint_path)
            head = getattr(self.loss, "head", None)
            if head is not None:
                from safetensors.torch import load_file

                path = Path(checkpoint_path) / HEAD_WEIGHTS
                if not path.is_file():
                    raise FileNotFoundError(
                        f"{path}: missing; {checkpoint_path} is not a drt-e2e checkpoint"
                    )
                saved = type(head).from_checkpoint_parts(
                    head.checkpoint_config(), load_file(str(path))
                )
                head.load_state_dict(saved.state_dict(), strict=True)

    return _Trainer


def check_data_parallel(cfg: FinetuneConfig, world_size: int) -> None:
    """Refuse a fine-tune that ``torchrun`` with ``world_size`` ranks cannot split exactly.

    Each planned batch is split into ``world_size`` equal contiguous shards (so the run trains
    on the one-process batches, with cross-process negatives: :class:`CrossRankLoss`).

    Raises:
        ValueError: the ``cross-encoder`` family (it trains in one process),
            ``data.batch_size`` not a multiple of ``world_size``, or a GradCache loss
            (``cached-mnrl``: its cached backward is not built across processes).
    """
    if cfg.family == CE_FAMILY:
        raise ValueError(
            "the cross-encoder family trains in one process (torchrun is built for "
            "biencoder, drt-e2e, query-tower and drt-query-tower): run it without torchrun"
        )
    bsz = cfg.data.batch_size
    if bsz % world_size:
        raise ValueError(
            f"data.batch_size {bsz} does not split over {world_size} torchrun processes: use a "
            f"multiple of {world_size} (each process encodes batch_size / {world_size} rows and "
            "every process's rows are the negatives of all)"
        )
    if cfg.trainer.loss == "cached-mnrl":
        raise ValueError(
            "trainer.loss cached-mnrl (GradCache) is not built under torchrun: use mnrl, whose "
            "batch is split over the processes (more processes hold a larger batch), or one "
            "process"
        )


def _step_of(loss: CrossRankLoss) -> Any:
    """A trainer callback that tells ``loss`` the global step before each step."""
    from transformers import TrainerCallback

    class _Step(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            loss.step = int(state.global_step)

    return _Step()


def _sequential(dataset: Any, batch_size: int, drop_last: bool, **_: Any) -> Any:
    from sentence_transformers.base.sampler import DefaultBatchSampler
    from torch.utils.data import SequentialSampler

    return DefaultBatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=False)


@dataclass
class FinetuneOutput:
    """What :func:`finetune` produced.

    Attributes:
        model_dir: the tuned encoder as a sentence-transformers folder.
        fingerprint: its weights fingerprint.
        base_fingerprint: the starting encoder's.
        checkpoint: the checkpoint the final weights were saved at (``checkpoint-N``).
        summary: steps, losses, cost (CPU seconds, wall seconds, peak RSS in MiB, tokens).
    """

    model_dir: Path
    fingerprint: str
    base_fingerprint: str
    checkpoint: str
    summary: dict[str, Any] = field(default_factory=dict)


def _token_counts(model: Any, store: StoreLike, plan: BatchPlan, query_only: bool) -> np.ndarray:
    """Real tokens of each plan row (query, plus positive and negatives unless the family
    trains the query side only)."""
    tok = model.tokenizer
    lim = int(model.max_seq_length)

    def lengths(texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, np.int64)
        enc = tok(texts, truncation=True, max_length=lim, add_special_tokens=True)
        return np.array([len(x) for x in enc["input_ids"]], dtype=np.int64)

    q_len = lengths(store.query_texts())
    out = q_len[plan.query_rows]
    if not query_only:
        p_len = lengths(store.passage_texts())
        out = out + p_len[plan.positive]
        hard = plan.hard
        out = out + np.where(hard >= 0, p_len[np.clip(hard, 0, None)], 0).sum(axis=1)
    return out


def _dataset(store: StoreLike, plan: BatchPlan, query_only: bool) -> Any:
    from datasets import Dataset

    q_texts = store.query_texts()
    cols: dict[str, list[Any]] = {"anchor": [q_texts[int(r)] for r in plan.query_rows]}
    if query_only:
        cols["label"] = list(range(len(plan.query_rows)))
        return Dataset.from_dict(cols)
    p_texts = store.passage_texts()
    cols["positive"] = [p_texts[int(p)] for p in plan.positive]
    bsz = plan.batch_size
    for j in range(plan.hard.shape[1]):
        # a row without a mined negative of its own gets the positive of the next row of its
        # batch (never one of its own relevant passages: the batch is collision-free)
        fill = [(i // bsz) * bsz + (i % bsz + 1) % bsz for i in range(len(plan.positive))]
        cols[f"negative_{j}"] = [
            p_texts[int(h if h >= 0 else plan.positive[fill[i]])]
            for i, h in enumerate(plan.hard[:, j])
        ]
    if plan.pair_teacher is not None:  # the distilled loss looks its row up
        cols["label"] = list(range(len(plan.query_rows)))
    return Dataset.from_dict(cols)


def _loss(model: Any, store: StoreLike, plan: BatchPlan, cfg: FinetuneConfig) -> Any:
    t = cfg.trainer
    scale = 1.0 / t.temperature
    if cfg.family == "drt-query-tower":
        from treerank.models.drt import DRTHead

        torch.manual_seed(cfg.train.seed)  # the heads' initial weights follow the seed
        dim = int(model.get_embedding_dimension() or store.dim)
        head = DRTHead(drt_head_config(cfg, dim), name=cfg.family)
        return StoredPassageDRTLoss(
            model,
            head,
            np.asarray(store.passages),
            plan.positive,
            plan.masked,
            plan.hard if plan.hard.shape[1] else None,
            negatives=cfg.data.negatives,
            scale=scale,
            targets=plan.targets,
            weights=plan.weights,
            lambda_dec=t.lambda_dec,
        )
    if cfg.family == "query-tower":
        return StoredPassageLoss(
            model,
            np.asarray(store.passages),
            plan.positive,
            plan.masked,
            plan.hard if plan.hard.shape[1] else None,
            negatives=cfg.data.negatives,
            scale=scale,
            targets=plan.targets,
            weights=plan.weights,
            teacher=plan.teacher,
        )
    if cfg.family == "drt-e2e":
        from treerank.models.drt import DRTHead

        torch.manual_seed(cfg.train.seed)  # the heads' initial weights follow the seed
        dim = int(model.get_embedding_dimension() or store.dim)
        head = DRTHead(drt_head_config(cfg, dim), name="drt-e2e")
        if t.loss == "cached-mnrl":  # GradCache over the DRT loss
            return cached_drt_loss(
                model, head, scale=scale, lambda_dec=t.lambda_dec, mini_batch_size=t.mini_batch_size
            )
        return DRTEndToEndLoss(model, head, scale=scale, lambda_dec=t.lambda_dec)
    from sentence_transformers.sentence_transformer import losses

    if plan.pair_teacher is not None:
        assert plan.pair_mode is not None
        return DistilledMNRLLoss(model, plan.pair_teacher, plan.pair_mode, scale=scale)
    if t.loss == "cached-mnrl":
        return losses.CachedMultipleNegativesRankingLoss(
            model, scale=scale, mini_batch_size=t.mini_batch_size
        )
    return losses.MultipleNegativesRankingLoss(model, scale=scale)


def _cost_now() -> tuple[float, float]:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0  # CPU s, peak RSS MiB (Linux KiB)


def _training_arguments(
    cfg: FinetuneConfig,
    plan: BatchPlan,
    dataset: Dataset,
    steps: int,
    ckpt_dir: Path,
    precision: str,
    ctx: DistContext | None,
    device: Device,
    progress: bool,
) -> SentenceTransformerTrainingArguments:
    """The sentence-transformers ``SentenceTransformerTrainingArguments`` of a fine-tune:
    ``steps`` planned batches of ``plan.batch_size`` in the plan's order (one epoch, no
    shuffling: ``_sequential``), the trainer section's schedule and checkpointing, the heads'
    own lr (``learning_rate_mapping``), the untied towers' router, and under torchrun each
    batch split across the ranks."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    t = cfg.trainer
    return SentenceTransformerTrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=plan.batch_size,
        num_train_epochs=1,
        max_steps=steps,
        learning_rate=t.lr,
        warmup_steps=t.warmup_ratio,
        lr_scheduler_type=t.scheduler,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        bf16=precision == "bf16",
        activation_checkpointing=t.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False},
        save_strategy="steps",
        save_steps=t.save_steps if t.save_steps > 0 else steps,
        save_total_limit=t.save_total_limit,
        logging_steps=t.logging_steps,
        seed=t.seed,
        data_seed=t.seed,
        report_to="none",
        dataloader_num_workers=0,
        use_cpu=resolve_device(device).type == "cpu",
        disable_tqdm=not progress,
        batch_sampler=_sequential,
        # torchrun: each planned batch is split across the ranks (the one-process batch)
        accelerator_config={"split_batches": True} if ctx is not None else None,
        learning_rate_mapping=(
            {r"^head\.": t.head_lr} if cfg.drt_heads and t.head_lr is not None else {}
        ),
        router_mapping=(
            {c: "query" if c == "anchor" else "document" for c in dataset.column_names}
            if cfg.model.untied
            else {}
        ),
    )


def finetune(
    store: StoreLike,
    cfg: FinetuneConfig,
    out_dir: str | Path,
    *,
    train_rows: np.ndarray | None = None,
    mined: np.ndarray | None = None,
    denoised: Mapping[str, object] | None = None,
    resume: bool = False,
    device: Device = DEFAULT_DEVICE,
    progress: bool = False,
    stop_after_steps: int | None = None,
    log: Callable[[str], None] | None = None,
) -> FinetuneOutput:
    """Fine-tune the store's encoder on the store's training labels.

    Writes ``out_dir/checkpoints/checkpoint-N/`` (the trainer's resumable checkpoints),
    ``out_dir/model/`` (the tuned encoder, a sentence-transformers folder, renamed into place
    when complete), for ``drt-e2e`` ``out_dir/drt_head/`` (the heads, a treerank DRT
    checkpoint bound to the tuned encoder) and ``out_dir/finetune.json`` (config,
    fingerprints, summary).

    Args:
        store: the training split (texts, labels, passage vectors for ``query-tower``).
        cfg: :func:`~treerank.training.finetune_config.parse_finetune_config` output.
        out_dir: the run's folder.
        train_rows: query ids to train on (None: all; the pipeline passes the non-held-out).
        mined: BM25-mined negatives of the split (with ``data.hard_negatives: mined``), or
            the denoised pool of them (``data.denoise``; ``-1`` where a negative was dropped).
        denoised: the denoised pool's metadata
            (``treerank.tasks.train.ensure_denoised_negatives``), copied into the summary as
            ``denoised_negatives`` (None: raw mined negatives).
        resume: continue from the newest checkpoint in ``out_dir/checkpoints`` (none: start).
        device: where it trains (a parsed :class:`~treerank.kernels.device.Device`).
        progress: the trainer's progress bar.
        stop_after_steps: test hook simulating Ctrl-C: raise ``KeyboardInterrupt`` once the
            checkpoint of this step is written.
        log: called with one line per logged step.

    Returns:
        :class:`FinetuneOutput`.

    Raises:
        EncoderStoreMismatchError: the configured base encoder is not the store's.
        FileExistsError: ``out_dir`` holds checkpoints or a model and ``resume`` is False.
        ValueError: no trainable query.
    """
    from treerank.distributed.context import current

    ctx = current()
    if ctx is not None:  # refused before any work
        check_data_parallel(cfg, ctx.world_size)
    out = Path(out_dir)
    ckpt_dir = out / CHECKPOINTS_DIR
    if not resume and (latest_checkpoint(ckpt_dir) is not None or (out / MODEL_DIR).exists()):
        raise FileExistsError(
            f"{out}: holds an earlier fine-tune (checkpoints or model); pass resume (--resume) "
            "to continue it, or choose another output folder"
        )
    t = cfg.trainer
    torch.set_num_threads(t.threads)
    cpu0, _ = _cost_now()
    wall0 = time.perf_counter()
    base_enc = _base_encoder(cfg.model.base, store, device)
    model, base_fp = base_enc.model, base_enc.fingerprint
    if cfg.model.untied:  # both towers start from the store's encoder
        model = untie(model)
    precision, precision_record = resolve_precision(t.precision, base_enc, device)
    if log is not None and t.precision == "auto":
        log(f"precision auto: {precision} ({precision_record})")
    # the training truncation below is not the tuned model's: its saved folder keeps the base
    # model's limits, so re-embedding at the store's max_seq_length stays in range
    base_max_seq_length = model.max_seq_length
    base_model_max_length = getattr(model.tokenizer, "model_max_length", None)
    m = cfg.model
    model.max_seq_length = m.max_query_length if cfg.query_only else m.max_passage_length
    n_trainable = freeze(model, embeddings=m.freeze_embeddings, layers=m.freeze_layers)
    plan = plan_batches(store, cfg, train_rows=train_rows, mined=mined)
    dataset = _dataset(store, plan, cfg.query_only)
    tokens = _token_counts(model, store, plan, cfg.query_only)
    loss = _loss(model, store, plan, cfg)
    if ctx is not None:
        loss = CrossRankLoss(loss, ctx, seed=t.seed)
    steps = plan.n_batches if t.max_steps < 0 else min(t.max_steps, plan.n_batches)
    args = _training_arguments(
        cfg, plan, dataset, steps, ckpt_dir, precision, ctx, device, progress
    )
    records: list[dict[str, Any]] = []

    callbacks = [loss_log(records, log, stop_after_steps)]
    if isinstance(loss, CrossRankLoss):
        callbacks.append(_step_of(loss))
    trainer = _trainer_class()(
        model=model, args=args, train_dataset=dataset, loss=loss, callbacks=callbacks
    )
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    trainer.remove_callback(PrinterCallback)  # our own log line instead of dict prints
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    start = latest_checkpoint(ckpt_dir) if resume else None
    main = ctx is None or ctx.is_main  # rank 0 writes the model and the summary
    try:
        result = trainer.train(resume_from_checkpoint=None if start is None else str(start))
        step = int(trainer.state.global_step)
        last = latest_checkpoint(ckpt_dir)
        if last is None or last.name != f"checkpoint-{step}":
            trainer._save_checkpoint(trainer.model, None)
        model.max_seq_length = base_max_seq_length
        if base_model_max_length is not None:
            model.tokenizer.model_max_length = base_model_max_length
        if main:
            save_model_folder(out / MODEL_DIR, lambda p: model.save(str(p)))
    finally:
        if bars and not progress:
            hf_logging.enable_progress_bar()
    checkpoint = f"checkpoint-{step}"
    from treerank.encoders.fingerprint import weights_fingerprint

    fp = weights_fingerprint(model)
    head = getattr(loss, "head", None)
    if head is not None and main:
        _save_head(head, out / DRT_HEAD_DIR, out / MODEL_DIR, fp, store, checkpoint)
    cpu1, rss = _cost_now()
    summary = {
        "family": cfg.family,
        "steps": step,
        "planned_steps": steps,
        "training_queries": int(np.unique(plan.query_rows).size),  # in the batch plan
        "rows_trained": step * plan.batch_size,
        "resumed_from": None if start is None else start.name,
        "train_loss": float(result.training_loss),
        "log": records,
        "trainable_parameters": int(n_trainable),
        "precision": {"chosen": precision, **precision_record},
        "world_size": 1 if ctx is None else ctx.world_size,  # ranks sharing each batch
        "cost": {
            "cpu_seconds": round(cpu1 - cpu0, 3),
            "wall_seconds": round(time.perf_counter() - wall0, 3),
            "peak_rss_mib": round(rss, 1),
            "tokens": int(tokens[: step * plan.batch_size].sum()),
            "threads": int(t.threads),
            "note": "this process only; a resumed run counts its own part",
        },
    }
    if denoised is not None:
        summary["denoised_negatives"] = dict(denoised)
    if plan.sources is not None:
        summary["sources"] = plan.sources
    if not main:
        return FinetuneOutput(out / MODEL_DIR, fp, base_fp, checkpoint, summary)
    atomic_write_json(
        out / FINETUNE_JSON,
        {
            "config": cfg.to_dict(),
            "trained_on": {
                "store": str(store.path),
                "fingerprint": store.encoder_fingerprint,
                "data_sha256": store.meta.get("data_sha256"),
            },
            "base_fingerprint": base_fp,
            "fingerprint": fp,
            "checkpoint": checkpoint,
            "summary": summary,
        },
    )
    return FinetuneOutput(out / MODEL_DIR, fp, base_fp, checkpoint, summary)


def _save_head(
    head: Any, dest: Path, model_dir: Path, fingerprint: str, store: StoreLike, checkpoint: str
) -> None:
    """Write the trained DRT heads as a treerank checkpoint bound to the tuned encoder (the
    vectors of a store re-embedded with ``model_dir`` are the ones it scores)."""
    from treerank.encoders.precision import vector_precision
    from treerank.models.checkpoint import save_checkpoint

    head.eval()
    ckpt = head.to_checkpoint(
        str(model_dir.resolve()),
        fingerprint,
        extra={"finetune": {"checkpoint": checkpoint, "trained_on": str(store.path)}},
        encoder_precision=vector_precision(store),
    )
    save_checkpoint(dest, ckpt)


def export_onnx(model_dir: str | Path, dest: str | Path) -> Path:
    """Export a tuned encoder folder (``RUN/model``) through treerank's ONNX backend
    (:mod:`treerank.encoders.onnx_runtime`: transformer + pooling + L2 normalisation, the same
    unit vectors as the torch modules) into ``dest/`` (``model.onnx`` and its ``key.json``:
    weights fingerprint, tokenizer, pooling, versions), written atomically.

    Returns:
        ``dest/model.onnx``.

    Raises:
        UnsupportedModelError: a module stack the ONNX backend cannot reproduce (named).
        MissingDependencyError: onnx / onnxruntime not installed.
    """
    from treerank.encoders import SentenceEncoder

    enc = SentenceEncoder(model_dir, backend="onnx", progress=False)
    assert enc.onnx_path is not None  # the onnx backend always has its export
    src = Path(enc.onnx_path)

    def write(tmp: Path) -> None:
        shutil.copy2(src, tmp / "model.onnx")
        shutil.copy2(src.parent / "key.json", tmp / "key.json")

    return save_model_folder(dest, write) / "model.onnx"
