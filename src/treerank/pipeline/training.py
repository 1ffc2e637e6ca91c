"""``train_model``: train any registered model type on a store and write its checkpoint.

This is where the training layer meets search and evaluation: the held-out validation callback
(early stopping on full-split MRR@10 / nDCG@10 of held-out training queries) is built here from
``treerank.search.exact.exact_search`` and ``treerank.evaluation.metrics.evaluate_run``, and
handed to the model's trainer, which never imports those layers.

Trainers are looked up by name in :data:`TRAINERS` (``"module:function"``, imported lazily); each
follows ``treerank.training.trainer.TrainFunction`` and receives only the keyword arguments its
signature accepts (``train_rows``, ``validate``, ``log_path``, ``progress``).

Output directory (a checkpoint, see ``treerank.models.checkpoint``) plus
``training_log.jsonl`` and ``training_curves.png`` when the trainer wrote a log.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treerank.distributed.context import is_main_process, main_first
from treerank.models.checkpoint import save_checkpoint
from treerank.training.history import plot_curves, read_log
from treerank.training.holdout import ValidationConfig, holdout_split, passage_groups
from treerank.training.trainer import TrainOutput

__all__ = [
    "TRAINERS",
    "TrainResult",
    "ensure_mined_negatives",
    "ValidationConfig",
    "make_validator",
    "open_train_store",
    "resolve_trainer",
    "train_model",
]

TRAINERS: dict[str, str] = {
    "linear": "treerank.training.heads:train_linear",
    "mlp": "treerank.training.heads:train_mlp",
    "drt": "treerank.training.drt:train_drt",
    "forest": "treerank.training.forest:train_forest",
}

MINING_MODELS = ("linear", "mlp", "drt")
"""Model types whose trainers draw hard negatives through ``treerank.training.sampler``."""

LOG_FILE = "training_log.jsonl"
CURVES_FILE = "training_curves.png"


@dataclass
class TrainResult:
    """What :func:`train_model` produced.

    Attributes:
        model_type: the trained model type.
        checkpoint: the checkpoint directory.
        model: the trained model object.
        summary: the trainer's JSON summary (also in the checkpoint's ``extra["training"]``).
        heldout_rows: ``int64`` query ids held out for validation (never trained on).
        log_path / curves_path: training log and PNG inside the checkpoint (None if absent).
    """

    model_type: str
    checkpoint: Path
    model: Any
    summary: dict[str, Any]
    heldout_rows: np.ndarray
    log_path: Path | None = None
    curves_path: Path | None = None


def resolve_trainer(model_type: str) -> Callable[..., Any]:
    """The trainer function registered for ``model_type``.

    Raises:
        KeyError: unknown model type (the message lists the known ones).
        ImportError: the trainer's module is missing.
    """
    try:
        target = TRAINERS[model_type]
    except KeyError:
        raise KeyError(f"unknown model type {model_type!r}; known: {', '.join(TRAINERS)}") from None
    module, _, fn = target.partition(":")
    return getattr(importlib.import_module(module), fn)  # type: ignore[no-any-return]


def open_train_store(path: str | Path, split: str = "train") -> Any:
    """Open a store from a split directory, or from a store root holding ``<root>/<split>/``.

    Raises:
        FileNotFoundError: neither ``path/meta.json`` nor ``path/<split>/`` exists.
    """
    from treerank.store import EmbeddingStore

    path = Path(path)
    if (path / split).is_dir() and not (path / "queries.bin").exists():
        path = path / split
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: no such store directory (expected a split dir or a root holding {split}/)"
        )
    return EmbeddingStore.open(path)


def _subsample_passages(
    store: Any, rows: np.ndarray, max_passages: int | None, seed: int
) -> np.ndarray | None:
    """Passage ids to score for validation: None (all), or every judged passage of the
    held-out queries plus a seeded random remainder, ascending (the DPR lesson's recipe)."""
    n = int(store.n_passages)
    if max_passages is None or n <= max_passages:
        return None
    cand = np.asarray(store.candidates[rows])
    gold = np.unique(cand[cand >= 0])
    rest = np.setdiff1d(np.arange(n), gold)
    n_more = max(0, int(max_passages) - gold.size)
    rng = np.random.default_rng([seed, 7919])
    more = rng.choice(rest, size=min(n_more, rest.size), replace=False)
    return np.sort(np.concatenate([gold, more])).astype(np.int64)


def make_validator(
    store: Any, rows: np.ndarray, cfg: ValidationConfig, seed: int = 0
) -> Callable[[Any], dict[str, float]]:
    """The held-out callback: rank the split's passages for queries ``rows`` with the model.

    Each call runs ``exact_search(model.encode_queries(Q[rows]), P, k,
    passage_transform=model.encode_passages)`` over the full split (or the fixed subsample of
    :func:`_subsample_passages` when the split has more than ``cfg.max_passages`` passages) and
    returns the mean of ``cfg.metrics`` from ``evaluate_run`` against the store's labels.

    Args:
        store: the training store. rows: held-out query ids. cfg: the validation section.
        seed: seed of the passage subsample.
    """
    from treerank.evaluation.metrics import evaluate_run
    from treerank.evaluation.qrels import Qrels
    from treerank.search.exact import exact_search

    rows = np.asarray(rows, dtype=np.int64)
    queries = np.asarray(store.queries[rows], dtype=np.float32)
    qrels = Qrels(
        np.asarray(store.candidates[rows]),
        np.asarray(store.labels[rows]),
        int(store.relevance_threshold),
    )
    subset = _subsample_passages(store, rows, cfg.max_passages, seed)
    passages = store.passages if subset is None else np.asarray(store.passages[subset])
    metrics = list(cfg.metrics)

    def validate(model: Any) -> dict[str, float]:
        ids, _ = exact_search(
            model.encode_queries(queries),
            passages,
            k=cfg.k,
            passage_transform=model.encode_passages,
        )
        if subset is not None:
            ids = np.where(ids >= 0, subset[np.clip(ids, 0, None)], -1)
        return dict(evaluate_run(ids, qrels, metrics).mean)

    return validate


def ensure_mined_negatives(store: Any, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Mine BM25 hard negatives into the store when the config's sampler will want them.

    The sampler (``treerank.training.heads.SamplerConfig``) uses mined negatives when
    ``hard_negatives`` is ``"mined"``, or ``"auto"`` and no candidate of the split has grade 0
    (BEIR-style sources). Mining is skipped when the sidecar already exists with the same
    settings.

    Returns:
        The sidecar's metadata, or None when no mining was needed.
    """
    from treerank.search.negatives import mine_bm25_negatives

    sec = dict(config.get("sampler") or {})
    source = sec.get("hard_negatives", "auto")
    if int(sec.get("n_hard", 1)) <= 0 or source in ("none", "candidates"):
        return None
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    if source == "auto" and bool(np.any((cand >= 0) & (lab == 0))):
        return None
    name = str(sec.get("mined_array", "bm25_negatives"))
    mine_bm25_negatives(store, int(sec.get("mine_depth", 100)), name=name)
    meta = store.load_array_meta(name) if hasattr(store, "load_array_meta") else None
    return dict(meta or {"array": name})


def _call_trainer(fn: Callable[..., Any], store: Any, config: dict[str, Any], **kw: Any) -> Any:
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return fn(store, config, **{k: v for k, v in kw.items() if takes_any or k in params})


def train_model(
    model_type: str,
    train_store: Any,
    config: Mapping[str, Any] | None,
    out_dir: str | Path,
    *,
    progress: bool = True,
) -> TrainResult:
    """Train a ``model_type`` model on ``train_store`` and save its checkpoint to ``out_dir``.

    Steps: hold out ``validation.fraction`` of the queries (seeded by ``config["seed"]``), build
    the validation callback on them, call the registered trainer on the others, save the
    returned model's checkpoint (bound to the store's encoder fingerprint), then move the
    training log into the checkpoint and draw its curves.

    Args:
        model_type: a key of :data:`TRAINERS`.
        train_store: an ``EmbeddingStore`` or a path (split directory or store root with
            ``train/``).
        config: the model's config mapping (sections as in ``configs/heads/*.yaml``; the
            ``validation`` section is read here).
        out_dir: checkpoint directory (replaced atomically).
        progress: progress bars.

    Raises:
        KeyError: unknown model type. ValueError: bad config. FileNotFoundError: no store.
    """
    config = dict(config or {})
    fn = resolve_trainer(model_type)
    store = train_store if hasattr(train_store, "queries") else open_train_store(train_store)
    vcfg = ValidationConfig.from_config(config)
    seed = int(config.get("seed", 0))
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    has_rel = np.asarray(((cand >= 0) & (lab >= int(store.relevance_threshold))).any(axis=1))
    groups = (
        passage_groups(cand, lab, int(store.relevance_threshold)) if vcfg.group_by_passage else None
    )
    train_rows, held = holdout_split(has_rel, vcfg.fraction, seed, vcfg.max_queries, groups)
    validate = make_validator(store, held, vcfg, seed) if held.size else None
    with main_first():  # under torchrun rank 0 mines, the others then read its sidecar
        mined = ensure_mined_negatives(store, config) if model_type in MINING_MODELS else None
    main = is_main_process()

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_log = out_dir.parent / f".{out_dir.name}.{os.getpid()}.{LOG_FILE}"
    try:
        out = _call_trainer(
            fn,
            store,
            config,
            train_rows=train_rows,
            validate=validate,
            log_path=tmp_log,
            progress=progress and main,
        )
        if isinstance(out, TrainOutput):
            model, summary = out.model, dict(out.summary)
        elif isinstance(out, tuple):
            model, summary = out[0], dict(out[1])
        else:
            model, summary = out, {}
        if mined is not None:
            summary["mined_negatives"] = mined
        summary["validation"] = {**asdict(vcfg), "heldout_queries": int(held.size)}
        if not main:  # data-parallel training: rank 0 writes the checkpoint
            return TrainResult(model_type, out_dir, model, summary, held)
        ckpt = model.to_checkpoint(store.encoder_name or "", store.encoder_fingerprint or "")
        ckpt.extra.setdefault("training", summary)
        ckpt.extra["train_store"] = str(getattr(store, "path", ""))
        ckpt.extra["heldout_query_rows"] = held.tolist()
        save_checkpoint(out_dir, ckpt)
        log_path = curves = None
        if tmp_log.exists():
            log_path = out_dir / LOG_FILE
            os.replace(tmp_log, log_path)
            try:
                if model_type == "forest" and summary.get("curve"):
                    from treerank.training.forest import plot_metric_vs_models

                    curves = plot_metric_vs_models(
                        summary["curve"],
                        out_dir / "forest_metric_vs_m.png",
                        title=f"forest on {store.path}: held-out metrics vs M",
                    )
                else:
                    curves = plot_curves(
                        read_log(log_path),
                        out_dir / CURVES_FILE,
                        title=f"{model_type} on {store.path}",
                    )
            except Exception:  # a broken plot must never lose a trained checkpoint
                curves = None
    finally:
        tmp_log.unlink(missing_ok=True)
    return TrainResult(model_type, out_dir, model, summary, held, log_path, curves)
