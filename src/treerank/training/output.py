"""The one writer of a trained model's directory, for every family.

Layout of ``<dir>/`` (written by :func:`save_trained_model`; the directory is a checkpoint that
``treerank.models.registry.load_model`` and ``ckpt:<dir>`` systems read)::

    config.json            family (model_type), model config, encoder name + fingerprint, extra
    weights.safetensors    the model's tensors
    training_log.jsonl     the trainer's log records, one JSON object per line (LOG_FILE)
    training_curves.png    the family's curves (CURVES_FILE; absent when there is nothing to draw)
    events.out.tfevents.*  the log's scalars for TensorBoard (`treerank.training.tensorboard`;
                           absent without the optional ``tensorboard`` package)

The checkpoint is written atomically (temporary directory, then rename), then the log (atomic)
and the plot; a plot that fails never loses the checkpoint.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treerank.atomic import atomic_write_text
from treerank.models.checkpoint import save_checkpoint
from treerank.training.history import plot_curves
from treerank.training.tensorboard import write_event_files

__all__ = ["CURVES_FILE", "LOG_FILE", "save_trained_model"]

LOG_FILE = "training_log.jsonl"
CURVES_FILE = "training_curves.png"


def save_trained_model(
    out_dir: str | Path,
    model: Any,
    *,
    encoder_name: str,
    encoder_fingerprint: str,
    encoder_precision: str | None = None,
    summary: dict[str, Any] | None = None,
    records: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
    title: str = "",
    curves_hook: Callable[[list[dict[str, Any]], dict[str, Any], Path, str], Path | None]
    | None = None,
) -> tuple[Path, Path | None, Path | None]:
    """Write a trained model's directory (see the module docstring).

    Args:
        out_dir: the directory (replaced atomically if it exists).
        model: a trained ``CheckpointMixin`` model; its ``model_type`` names its family.
        encoder_name / encoder_fingerprint: the store's encoder (the checkpoint is bound to it).
        encoder_precision: the store's vector precision (``fp32`` | ``bf16`` | ``int8``),
            checked against every store the model later scores.
        summary: the trainer's summary (``extra["training"]``).
        records: the trainer's log records (None or empty: no log, no curves).
        extra: more provenance for ``config.json`` (train store, held-out rows, ...).
        title: plot title.
        curves_hook: the family's own curves, ``plot(records, summary, path, title) -> Path |
            None`` (the ``curves`` of its ``treerank.families`` entry); None: the generic
            :func:`~treerank.training.history.plot_curves` of the log.

    Returns:
        ``(checkpoint_dir, log_path or None, curves_path or None)``.
    """
    out = Path(out_dir)
    ckpt = model.to_checkpoint(
        encoder_name, encoder_fingerprint, encoder_precision=encoder_precision
    )
    if summary is not None:
        ckpt.extra["training"] = summary
    ckpt.extra.update(extra or {})
    save_checkpoint(out, ckpt)
    log_path = curves = None
    if records:
        log_path = out / LOG_FILE
        atomic_write_text(
            log_path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
        )
        try:
            write_event_files(records, out)
        except Exception as exc:  # a broken event file must never lose a trained checkpoint
            warnings.warn(f"{out}: TensorBoard event file not written ({exc})", stacklevel=2)
        try:
            if curves_hook is not None:
                curves = curves_hook(records, summary or {}, out / CURVES_FILE, title)
            else:
                metric = None
                trainer = (summary or {}).get("config", {}).get("trainer") or {}
                if any(r.get("kind") == "eval" for r in records):
                    metric = trainer.get("early_stopping_metric")
                curves = plot_curves(records, out / CURVES_FILE, metric=metric, title=title)
        except Exception:  # a broken plot must never lose a trained checkpoint
            curves = None
    return out, log_path, curves
