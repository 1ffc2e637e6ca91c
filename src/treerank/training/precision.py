"""The training precision of a ``trainer.precision`` setting, shared by the encoder fine-tune
(:mod:`treerank.training.finetune`) and the cross-encoder trainer
(:mod:`treerank.training.cross_encoder`): ``auto`` takes the measured probe of issue 34."""

from __future__ import annotations

from typing import Any

import torch

from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device

__all__ = ["resolve_precision"]


def resolve_precision(
    precision: str,
    encoder: Any,
    device: Device = DEFAULT_DEVICE,
    *,
    timer: Any = None,
    refresh: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The training precision of a ``trainer.precision`` setting.

    ``fp32`` / ``bf16`` are kept. ``auto``: on CUDA, ``bf16`` where the GPU supports it, else
    ``fp32``; on a CPU, ``bf16`` only where the encoding probe
    (:func:`treerank.encoders.precision.resolve_path` over the torch paths: the encoder's
    forward pass on a fixed batch, fp32 against bf16 autocast, cached per CPU, thread count and
    weights) measured bf16 faster than fp32 and within its fidelity bound; ``fp32`` otherwise.

    Args:
        precision: ``fp32`` | ``bf16`` | ``auto``.
        encoder: the base :class:`~treerank.encoders.SentenceEncoder` (probed for ``auto``).
        device: the training device; ``auto`` is resolved first (:func:`resolve_device`), so
            ``auto`` on a machine with CUDA takes the CUDA rule, not the CPU probe.
        timer, refresh: passed to ``resolve_path`` (an injected clock for tests; measure
            again instead of reading the cache).

    Returns:
        ``(precision, record)``: ``fp32`` or ``bf16``, and what decided it (for
        ``finetune.json``: the setting, the device, the probe's seconds and ratio).

    Raises:
        DeviceError: ``device`` names CUDA and this machine has none (:func:`resolve_device`).
    """
    if precision != "auto":
        return precision, {"setting": precision}
    # the resolved device, not the setting: ``auto`` on a GPU machine trains on CUDA
    if resolve_device(device).type == "cuda":
        ok = bool(torch.cuda.is_bf16_supported())
        return ("bf16" if ok else "fp32"), {
            "setting": "auto",
            "device": str(device),
            "reason": "CUDA with bf16 support" if ok else "CUDA without bf16 support",
        }
    from treerank.encoders.precision import resolve_path

    choice = resolve_path(encoder, "torch", "auto", timer=timer, refresh=refresh)
    chosen = choice.path.precision if choice.path.precision in ("fp32", "bf16") else "fp32"
    return chosen, {"setting": "auto", "device": str(device), "probe": choice.to_dict()}
