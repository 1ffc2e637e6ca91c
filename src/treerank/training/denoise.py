"""Denoised hard negatives for training (RocketQA, Qu et al. 2021, section 4.2.2).

A head's or an encoder fine-tune's ``data.denoise`` section names a cross-encoder
(``ce:<dir>``) that scores each training query's first ``depth`` BM25-mined negatives and its
labelled positives. A negative the cross-encoder scores as a positive (``>= threshold``, or
within ``relative_margin`` of the query's best positive: sentence-transformers'
``mine_hard_negatives`` rule) is dropped from the pool;
:func:`treerank.training.cross_encoder.denoise_negatives` makes the decision and never drops a
labelled passage. The denoised pool is a sidecar array beside the mined one
(:func:`denoised_array`, named by a :class:`DenoiseJob`), written once by
``treerank.tasks.train.ensure_denoised_negatives`` (or the ``denoise:`` stage of
``treerank run``) and read by the sampler or the fine-tune's batch plan in place of the mined
array.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DENOISE_MARGIN",
    "DenoiseJob",
    "DenoiseSettings",
    "denoised_array",
    "parse_denoise",
]

DEFAULT_DENOISE_MARGIN = 0.05
"""sentence-transformers' ``mine_hard_negatives`` relative margin (the audit's default too)."""


@dataclass(frozen=True)
class DenoiseSettings:
    """A ``data.denoise`` section (a head's or an encoder fine-tune's).

    Attributes:
        scorer: ``ce:<dir>``, a cross-encoder folder (``treerank finetune`` with the
            ``cross-encoder`` family).
        depth: mined negatives scored per training query (the first ``depth`` of the BM25
            list); the denoised pool holds only those that were kept. Cost: training queries x
            (depth + positives) pairs (about 17 pairs per CPU-s in fp32 on one core).
        threshold: flag a negative whose raw score is ``>=`` this (None: off).
        relative_margin: flag a negative scored ``>= p - relative_margin * |p|``, ``p`` the
            query's best labelled positive's score (None: off). One of the two rules is needed.
        precision: the scorer's ``fp32`` | ``bf16`` | ``auto`` (the measured probe).
    """

    scorer: str
    depth: int = 10
    threshold: float | None = None
    relative_margin: float | None = DEFAULT_DENOISE_MARGIN
    precision: str = "auto"

    def __post_init__(self) -> None:
        if not self.scorer.startswith("ce:") or not self.scorer[3:].strip():
            raise ValueError(f"scorer {self.scorer!r}: expected ce:<cross-encoder dir>")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.threshold is None and self.relative_margin is None:
            raise ValueError("give a threshold, a relative_margin, or both")
        if self.relative_margin is not None and self.relative_margin < 0:
            raise ValueError(f"relative_margin must be >= 0, got {self.relative_margin}")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"precision {self.precision!r}: expected fp32, bf16 or auto")

    @property
    def path(self) -> Path:
        """The cross-encoder folder."""
        return Path(self.scorer[3:].strip())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_denoise(raw: Any, where: str = "data.denoise") -> DenoiseSettings | None:
    """Parse a ``data.denoise`` mapping (None: no denoising).

    Raises:
        ConfigError: not a mapping, an unknown key, or a bad value (the message names
            ``where``).
    """
    from treerank.config import ConfigError, build

    if raw is None:
        return None
    if isinstance(raw, DenoiseSettings):
        return raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return build(DenoiseSettings, raw, where)


def denoised_array(
    mined_array: str, settings: DenoiseSettings, max_queries: int | None, sample_seed: int
) -> str:
    """The sidecar array name of a denoised pool: ``<mined_array>-denoised-<digest>``, the
    digest over the settings and the query sample (the scorer's weights are checked against
    the array's metadata when it is reused)."""
    key = {**settings.to_dict(), "max_queries": max_queries, "sample_seed": sample_seed}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return f"{mined_array}-denoised-{digest}"


@dataclass(frozen=True)
class DenoiseJob:
    """What one denoised pool is made from: the settings, the mined array they denoise and the
    query sample scored (a head's ``data.max_queries`` / ``sample_seed``; an encoder fine-tune
    scores every labelled query). Made by a data section's ``denoise_job()``; read by
    ``treerank.tasks.train.ensure_denoised_negatives`` and the ``denoise:`` stage.

    Attributes:
        settings: the parsed ``data.denoise`` section.
        mined_array: the sidecar array of BM25-mined negatives it denoises.
        max_queries: score only a seeded sample of this many queries (None: all).
        sample_seed: the sample's seed.
    """

    settings: DenoiseSettings
    mined_array: str
    max_queries: int | None = None
    sample_seed: int = 0

    @property
    def array(self) -> str:
        """The denoised pool's sidecar name (:func:`denoised_array`)."""
        return denoised_array(self.mined_array, self.settings, self.max_queries, self.sample_seed)

    def key(self) -> dict[str, Any]:
        """Plain JSON of everything the pool depends on but the scorer's weights."""
        return {
            **self.settings.to_dict(),
            "mined_array": self.mined_array,
            "max_queries": self.max_queries,
            "sample_seed": self.sample_seed,
        }
