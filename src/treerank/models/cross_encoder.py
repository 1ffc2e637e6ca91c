"""`CrossEncoderScorer`: a trained cross-encoder (query and passage read together) as a pair scorer.

A cross-encoder is a sentence-transformers ``CrossEncoder`` folder with a 1-label head (written
by :func:`treerank.training.cross_encoder.train_cross_encoder`). Unlike a
:class:`~treerank.models.base.DenseScorer` it has no towers: it scores ``(query text, passage
text)`` pairs, so it can only rerank a first stage's candidates (``rescore:...,scorer=ce:<dir>``,
:mod:`treerank.search.ce_rescore`), never rank a whole split.

Scores are the head's raw logits (``float32``, unbounded; higher = more relevant; no sigmoid),
the same numbers ``CrossEncoder.predict(..., activation_fn=Identity)`` returns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device

__all__ = [
    "CE_PRECISIONS",
    "CEPrecision",
    "CrossEncoderScorer",
    "DEFAULT_SCORE_BATCH",
    "load_cross_encoder",
]

DEFAULT_SCORE_BATCH = 32
CEPrecision = Literal["fp32", "bf16", "auto"]
CE_PRECISIONS: tuple[str, ...] = get_args(CEPrecision)


def load_cross_encoder(
    path: str | Path, *, device: Device = DEFAULT_DEVICE, max_length: int | None = None
) -> Any:
    """A sentence-transformers ``CrossEncoder`` loaded offline from a local folder.

    Args:
        path: a ``CrossEncoder`` folder (``config.json`` + weights) or a plain transformer folder
            (a fresh 1-label head is then initialised, as when training starts from an encoder).
        device: where it runs (resolved by :func:`~treerank.kernels.device.resolve_device`).
        max_length: tokens per (query, passage) pair; None: the folder's own setting.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no cross-encoder folder there")
    from sentence_transformers import CrossEncoder
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = CrossEncoder(
            str(p), num_labels=1, max_length=max_length, device=str(resolve_device(device))
        )
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
    return model


class CrossEncoderScorer:
    """Scores ``(query, passage)`` text pairs with a cross-encoder folder.

    Args:
        path: the cross-encoder folder (see :func:`load_cross_encoder`).
        device: where it trains (a parsed :class:`~treerank.kernels.device.Device`).
        batch_size: pairs per forward pass.
        precision: ``fp32``, ``bf16`` (CPU/GPU autocast around the forward pass; scores are
            returned as ``float32`` either way) or ``auto``: on a CUDA GPU bf16 where it is
            supported; on a CPU the measured probe of issue 34
            (:func:`treerank.encoders.precision.resolve_path` over this model's
            :meth:`probe_forward`, cached per CPU, thread count, weights and library versions)
            picks bf16 only where it scored the probe pairs faster than fp32 with a Pearson
            correlation of the scores >= 0.999 (the bf16 fidelity bound), else fp32.
            ``self.precision`` is the resolved one; ``self.choice`` the probe's record.
        max_length: tokens per pair (None: the folder's setting).

    Raises:
        ValueError: an unknown precision or a batch size < 1.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        device: Device = DEFAULT_DEVICE,
        batch_size: int = DEFAULT_SCORE_BATCH,
        precision: CEPrecision = "fp32",
        max_length: int | None = None,
    ) -> None:
        if precision not in CE_PRECISIONS:
            raise ValueError(
                f"cross-encoder precision {precision!r}: expected one of {', '.join(CE_PRECISIONS)}"
            )
        if batch_size < 1:
            raise ValueError(f"cross-encoder batch size must be >= 1, got {batch_size}")
        self.path = Path(path)
        self.device = device
        self.batch_size = int(batch_size)
        self.model = load_cross_encoder(self.path, device=device, max_length=max_length)
        self._fingerprint: str | None = None
        self.choice: dict[str, Any] | None = None
        self.precision: Literal["fp32", "bf16"] = "fp32" if precision == "auto" else precision
        if precision == "auto":
            self.precision, self.choice = self._resolve_auto()

    def _resolve_auto(self) -> tuple[Literal["fp32", "bf16"], dict[str, Any]]:
        import torch

        if resolve_device(self.device).type == "cuda":
            ok = bool(torch.cuda.is_bf16_supported())
            return ("bf16" if ok else "fp32"), {"path": "cuda", "bf16_supported": ok}
        from treerank.encoders.precision import resolve_path

        choice = resolve_path(self, "torch", "auto")
        print(f"cross-{choice.message()}", file=sys.stderr)  # "cross-encoder auto: ..."
        return ("bf16" if choice.path.precision == "bf16" else "fp32"), choice.to_dict()

    def probe_forward(self, path: Any) -> Callable[[], np.ndarray]:
        """A callable scoring the probe pairs (each of
        :data:`treerank.encoders.precision.PROBE_TEXTS` with the next one as its passage) as
        one batch through ``path`` (a torch :class:`~treerank.encoders.precision.EncodePath`):
        what ``auto`` times. It returns the centred scores as one ``float32 (1, n)`` row, so
        the probe's cosine to fp32 is the Pearson correlation of the two score vectors."""
        from treerank.encoders.precision import PROBE_TEXTS

        texts = list(PROBE_TEXTS)
        passages = texts[1:] + texts[:1]
        precision = path.precision

        def forward() -> np.ndarray:
            scores = self._predict(texts, passages, precision, batch_size=len(texts))
            return (scores - scores.mean()).reshape(1, -1)

        return forward

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the loaded weights (pins the checkpoint a run was scored with)."""
        if self._fingerprint is None:
            from treerank.encoders.fingerprint import weights_fingerprint

            self._fingerprint = weights_fingerprint(self.model.model)
        return self._fingerprint

    def score_pairs(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """Raw head scores of ``(queries[i], passages[i])``.

        Args:
            queries, passages: texts of equal length ``n``.

        Returns:
            ``float32 (n,)`` logits (no activation).

        Raises:
            ValueError: the two lists differ in length.
        """
        if len(queries) != len(passages):
            raise ValueError(
                f"{len(queries)} queries and {len(passages)} passages: pairs need equal counts"
            )
        if not len(queries):
            return np.zeros(0, np.float32)
        return self._predict(queries, passages, self.precision, batch_size=self.batch_size)

    def _predict(
        self, queries: Sequence[str], passages: Sequence[str], precision: str, *, batch_size: int
    ) -> np.ndarray:
        import torch

        pairs = list(zip(queries, passages, strict=True))
        kind = resolve_device(self.device).type
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = self.model.predict(
                pairs,
                batch_size=batch_size,
                activation_fn=torch.nn.Identity(),
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32).reshape(-1)
