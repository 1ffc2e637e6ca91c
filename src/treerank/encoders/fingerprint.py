"""Fingerprint of an encoder's weights: the identity that stores and checkpoints are bound to."""

from __future__ import annotations

import hashlib

import torch


def weights_fingerprint(module: torch.nn.Module) -> str:
    """SHA-256 over every tensor of ``module.state_dict()`` (name, dtype, shape, raw bytes).

    Hashing the loaded tensors rather than the files on disk makes the fingerprint independent
    of the file format (safetensors / pytorch_model.bin) and of where the model was loaded
    from, and covers every module (transformer, pooling, dense, normalise). Prompts are not
    part of it (stores record them separately).

    Returns:
        ``"sha256:<64 hex digits>"``.
    """
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()
