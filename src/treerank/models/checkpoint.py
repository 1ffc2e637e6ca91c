"""Checkpoints: a directory with ``config.json`` and ``weights.safetensors``.

``config.json`` holds ``{"model_type", "config", "encoder": {"name", "fingerprint",
"precision"}, "dim", "extra"}``; the weights are a flat ``name -> tensor`` map. ``precision`` is
the vector precision of the store it was trained on (``fp32`` | ``bf16`` | ``int8``; absent in
checkpoints written before precisions existed).

Every model class shares one round trip, :class:`CheckpointMixin`: a model says what its config
is (a JSON mapping that rebuilds it), what its tensors are, and how to rebuild itself from the
two; ``to_checkpoint`` / ``from_checkpoint`` (type check, encoder binding, ``extra``) are written
once here. A checkpoint is bound to the encoder
whose vectors it was trained on: loading it for a store embedded with another encoder is refused.
Writes are atomic (temporary directory, then rename), so a failed save never leaves a half
checkpoint where a good one was.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors.torch import load_file, save_file

from treerank.atomic import chmod_as_umask, make_temp_dir

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"


M = TypeVar("M", bound="CheckpointMixin")


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
    encoder_precision: str | None = None


def save_checkpoint(path: str | Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to directory ``path`` atomically (replacing an existing checkpoint).

    Returns:
        The checkpoint directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(path.parent, f".{path.name}.")
    try:
        doc = {
            "model_type": ckpt.model_type,
            "config": ckpt.config,
            "encoder": {
                "name": ckpt.encoder_name,
                "fingerprint": ckpt.encoder_fingerprint,
                **({"precision": ckpt.encoder_precision} if ckpt.encoder_precision else {}),
            },
            "dim": ckpt.dim,
            "extra": ckpt.extra,
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True))
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in ckpt.state.items()}, tmp / WEIGHTS_FILE
        )
        chmod_as_umask(tmp / WEIGHTS_FILE)  # safetensors writes 0600 whatever the umask
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


def load_checkpoint(
    path: str | Path,
    expected_fingerprint: str | None = None,
    expected_precision: str | None = None,
) -> Checkpoint:
    """Read a checkpoint directory.

    Args:
        path: directory written by :func:`save_checkpoint`, or a `treerank run` model stage
            directory holding it as ``checkpoint/``.
        expected_fingerprint: the encoder fingerprint of the store it will score; ``None`` skips
            the check.
        expected_precision: the vector precision of that store (``fp32`` | ``bf16`` |
            ``int8``, `treerank.encoders.precision.vector_precision`); ``None`` skips the check.
            The checkpoint's recorded precision must mix with it
            (`treerank.encoders.precision.check_mix`: a head trained on fp32 or bf16 vectors
            never scores an int8 store, nor the reverse); a checkpoint recording none (written
            before precisions existed) is not refused, but flagged with a warning on an int8
            store.

    Raises:
        FileNotFoundError: ``path`` or one of its two files is missing.
        ValueError: ``config.json`` is not a treerank checkpoint config.
        EncoderMismatchError: the checkpoint's encoder fingerprint differs from ``expected``.
        PrecisionMixError: the checkpoint's training precision cannot mix with the store's.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() and (path / "checkpoint" / CONFIG_FILE).is_file():
        path = path / "checkpoint"  # a pipeline model stage: the checkpoint is its subfolder
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
    check_binding(path, enc, expected_fingerprint, expected_precision)
    fp = str(enc.get("fingerprint", ""))
    trained = enc.get("precision")
    return Checkpoint(
        model_type=model_type,
        config=dict(doc.get("config", {})),
        state=load_file(w_path),
        encoder_name=str(enc.get("name", "")),
        encoder_fingerprint=fp,
        dim=int(doc.get("dim", 0)),
        extra=dict(doc.get("extra", {})),
        encoder_precision=None if trained is None else str(trained),
    )


def check_binding(
    path: str | Path,
    encoder: dict[str, Any],
    expected_fingerprint: str | None = None,
    expected_precision: str | None = None,
) -> None:
    """Check a checkpoint's ``config.json`` ``encoder`` block against the store it will score:
    the weights fingerprint must equal, the training precision must mix with the store's
    (`treerank.encoders.precision.check_mix`); see :func:`load_checkpoint` (``None`` skips a
    check; a checkpoint recording no precision is flagged on an int8 store, not refused).

    Raises:
        EncoderMismatchError: another encoder's fingerprint.
        PrecisionMixError: a training precision the mixing rule keeps apart from the store's.
    """
    fp = str(encoder.get("fingerprint", ""))
    if expected_fingerprint is not None and fp != expected_fingerprint:
        raise EncoderMismatchError(
            f"{path}: trained on vectors from encoder {encoder.get('name')!r} (fingerprint "
            f"{fp[:12]}), but the store was embedded with fingerprint "
            f"{expected_fingerprint[:12]}; re-train the head on this store or re-embed with the "
            "same encoder"
        )
    trained = encoder.get("precision")
    if expected_precision is None:
        return
    if trained is None:
        if expected_precision == "int8":
            import warnings

            warnings.warn(
                f"{path}: the checkpoint records no training precision (written before "
                "precisions existed), and the store it scores holds int8 vectors: if it "
                "was trained on fp32 vectors its scores are not comparable",
                stacklevel=3,
            )
        return
    from treerank.encoders.precision import check_mix

    check_mix(
        path,
        expected_precision,
        str(trained),
        base_what="the store's vectors",
        other_what="the vectors this checkpoint was trained on",
        fix="Train the model on a store of the same precision",
    )


def check_checkpoint_store(
    path: str | Path, expected_fingerprint: str | None, expected_precision: str | None
) -> None:
    """:func:`check_binding` of the checkpoint directory ``path`` (``config.json`` only, no
    weights read): what ``evaluate`` runs for every checkpoint system before any work.

    Raises:
        FileNotFoundError / ValueError: no readable checkpoint config; and see
            :func:`check_binding`.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() and (path / "checkpoint" / CONFIG_FILE).is_file():
        path = path / "checkpoint"
    cfg_path = path / CONFIG_FILE
    try:
        enc = json.loads(cfg_path.read_text())["encoder"]
    except OSError as exc:
        raise FileNotFoundError(
            f"{cfg_path}: missing (not a treerank checkpoint directory)"
        ) from exc
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{cfg_path}: not a treerank checkpoint config ({exc})") from exc
    check_binding(path, enc, expected_fingerprint, expected_precision)


class CheckpointMixin:
    """The one checkpoint round trip of every model (see the module docstring).

    A model class sets ``model_type`` (its family name) and implements
    :meth:`checkpoint_config`, :meth:`checkpoint_state` and :meth:`from_checkpoint_parts`;
    ``extra`` (a dict attribute, e.g. the training summary) travels with the checkpoint.
    """

    model_type: ClassVar[str] = ""
    trained: ClassVar[bool] = True
    """A model that training produced (False: ``cosine``, which nothing trains); reports print
    the memorisation caveat only for systems built on a trained model."""
    own_retrieval: ClassVar[bool] = False
    """The family searches with its own index (the forest's inverted lists: its family entry's
    ``system``, reached through ``treerank.search.systems.CheckpointLoader.own_system``), not by
    inner product of two towers."""

    def checkpoint_config(self) -> dict[str, Any]:
        """JSON-serialisable config that, with the tensors, rebuilds the model (holds ``dim``)."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """``name -> tensor`` map of the model's parameters and buffers."""
        raise NotImplementedError

    @classmethod
    def from_checkpoint_parts(
        cls: type[M], config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> M:
        """Rebuild the model from :meth:`checkpoint_config` and :meth:`checkpoint_state`.

        Raises:
            ValueError / KeyError / TypeError / RuntimeError: they do not fit together.
        """
        raise NotImplementedError

    def checkpoint_extra(self) -> dict[str, Any]:
        """Provenance stored beside the weights (default: the model's ``extra`` dict)."""
        return dict(getattr(self, "extra", None) or {})

    def to_checkpoint(
        self,
        encoder_name: str,
        encoder_fingerprint: str,
        extra: dict[str, Any] | None = None,
        encoder_precision: str | None = None,
    ) -> Checkpoint:
        """A :class:`Checkpoint` of this model bound to the encoder whose vectors it scores
        (and, when given, the vector precision of the store it was trained on)."""
        config = self.checkpoint_config()
        return Checkpoint(
            model_type=self.model_type,
            config=config,
            state={k: v.detach().clone().contiguous() for k, v in self.checkpoint_state().items()},
            encoder_name=encoder_name,
            encoder_fingerprint=encoder_fingerprint,
            dim=int(config.get("dim") or 0),
            extra={**self.checkpoint_extra(), **(extra or {})},
            encoder_precision=encoder_precision,
        )

    @classmethod
    def from_checkpoint(cls: type[M], ckpt: Checkpoint) -> M:
        """Rebuild the model of a loaded checkpoint (torch modules come back in eval mode).

        Raises:
            ValueError: the checkpoint holds another model type, or its config and tensors do
                not fit this class.
        """
        if ckpt.model_type != cls.model_type:
            raise ValueError(
                f"checkpoint holds a {ckpt.model_type!r} model, not {cls.model_type!r}"
            )
        try:
            model = cls.from_checkpoint_parts(dict(ckpt.config), dict(ckpt.state))
        except (KeyError, TypeError, RuntimeError) as exc:
            raise ValueError(
                f"{cls.model_type} checkpoint: config and weights do not fit ({exc})"
            ) from exc
        model.extra = dict(ckpt.extra)  # type: ignore[attr-defined]
        if isinstance(model, torch.nn.Module):
            model.eval()
        return model
