"""What an experiment run produced for one dataset: the record the stages fill and the report reads.

It sits below both :mod:`treerank.pipeline.experiment` (which fills it from the finished stages)
and :mod:`treerank.pipeline.report` (which renders it), so the two import it one way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treerank.pipeline.identity import RunId

__all__ = ["DatasetOutcome"]


@dataclass
class DatasetOutcome:
    """Everything the run produced for one dataset.

    ``checkpoints`` / ``training`` / ``seeds`` are keyed by the run's name
    (:attr:`RunId.name`); ``runs`` holds the typed identities of the runs trained here.
    """

    name: str
    eval_split: str
    store: Path
    train_store: Path | None = None
    dim: int | None = None
    checkpoints: dict[str, Path] = field(default_factory=dict)
    training: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparison: dict[str, Any] = field(default_factory=dict)
    comparison_markdown: str = ""
    eval_dir: Path | None = None
    overlap: dict[str, Any] | None = None
    family_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    overlap_markdown: str = ""
    lexical_gap: dict[str, Any] | None = None
    lexical_gap_markdown: str = ""
    diagnostics: dict[str, Any] | None = None
    diagnose_dir: Path | None = None
    store_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: list[RunId] = field(default_factory=list)
    seeds: dict[str, int | None] = field(default_factory=dict)
