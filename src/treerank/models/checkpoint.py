"""Checkpoints: a directory with ``config.json`` and ``weights.safetensors``.

``config.json`` holds ``{"model_type", "config", "encoder": {"name", "fingerprint"}, "dim",
"extra"}``; the weights are a flat ``name -> tensor`` map. A checkpoint is bound to the encoder
whose vectors it was trained on: loading it for a store embedded with another encoder is refused.
Writes are atomic (temporary directory, then rename), so a failed save never leaves a half
checkpoint where a good one was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"


class EncoderMismatchError(ValueError):
    """A checkpoint was asked to score vectors from a different encoder than it was trained on."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: model type, its hyperparameters, weights and provenance."""

    model_type: str
    config: dict[str, Any]
    state: dict[str, torch.Tensor]
    encoder_name: str
    encoder_fingerprint: str
    dim: int
    extra: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: str | Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to directory ``path`` atomically (replacing an existing checkpoint).

    Returns:
        The checkpoint directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        doc = {
            "model_type": ckpt.model_type,
            "config": ckpt.config,
            "encoder": {"name": ckpt.encoder_name, "fingerprint": ckpt.encoder_fingerprint},
            "dim": ckpt.dim,
            "extra": ckpt.extra,
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True))
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in ckpt.state.items()}, tmp / WEIGHTS_FILE
        )
        if path.exists():
            old = path.with_name(path.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_checkpoint(path: str | Path, expected_fingerprint: str | None = None) -> Checkpoint:
    """Read a checkpoint directory.

    Args:
        path: directory written by :func:`save_checkpoint`.
        expected_fingerprint: the encoder fingerprint of the store it will score; ``None`` skips
            the check.

    Raises:
        FileNotFoundError: ``path`` or one of its two files is missing.
        ValueError: ``config.json`` is not a treerank checkpoint config.
        EncoderMismatchError: the checkpoint's encoder fingerprint differs from ``expected``.
    """
    path = Path(path)
    cfg_path, w_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: missing (not a treerank checkpoint directory)")
    try:
        doc = json.loads(cfg_path.read_text())
        model_type = str(doc["model_type"])
        enc = doc["encoder"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{cfg_path}: not a treerank checkpoint config ({exc})") from exc
    fp = str(enc.get("fingerprint", ""))
    if expected_fingerprint is not None and fp != expected_fingerprint:
        raise EncoderMismatchError(
            f"{path}: trained on vectors from encoder {enc.get('name')!r} (fingerprint {fp[:12]}), "
            f"but the store was embedded with fingerprint {expected_fingerprint[:12]}; "
            "re-train the head on this store or re-embed with the same encoder"
        )
    return Checkpoint(
        model_type=model_type,
        config=dict(doc.get("config", {})),
        state=load_file(w_path),
        encoder_name=str(enc.get("name", "")),
        encoder_fingerprint=fp,
        dim=int(doc.get("dim", 0)),
        extra=dict(doc.get("extra", {})),
    )
