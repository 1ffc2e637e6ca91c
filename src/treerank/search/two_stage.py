"""What every second stage over a first stage's top ``depth`` holds (dense rescoring in
:mod:`treerank.search.rescore`, cross-encoder reranking in :mod:`treerank.search.ce_rescore`)."""

from __future__ import annotations

from typing import Generic, TypeVar

from treerank.search.systems import System

ScorerT = TypeVar("ScorerT")
"""The second stage's scorer: a loaded model, or the spec text it is loaded from on first use."""

__all__ = ["TwoStage"]


class TwoStage(Generic[ScorerT]):
    """What every second stage over a first stage's top ``depth`` holds: ``first``, ``scorer``,
    ``depth`` and ``name`` (default ``rescore:<first>:depth=<depth>``).

    Raises:
        ValueError: ``depth < 1``.
    """

    def __init__(self, first: System, scorer: ScorerT, depth: int, name: str | None) -> None:
        if depth < 1:
            raise ValueError(f"rescore depth must be >= 1, got {depth}")
        self.first = first
        self.scorer = scorer
        self.depth = int(depth)
        self.name: str = name or f"rescore:{first.name}:depth={depth}"
