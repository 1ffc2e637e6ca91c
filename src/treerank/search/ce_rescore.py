"""Reranking a first stage's top ``depth`` with a cross-encoder (``rescore:<A>:scorer=ce:<dir>``).

The cross-encoder (:class:`~treerank.models.cross_encoder.CrossEncoderScorer`) reads each
query's text together with each candidate passage's text, so it only reorders the first
stage's candidates: the reranked run holds exactly the first stage's top ``depth`` passages
per query (padding kept last), in cross-encoder score order, ties by ascending passage id. The
first stage's Recall@depth bounds what the reranker can reach; :meth:`CrossEncoderRescoreSystem.
first_stage_recall` reports it beside the reranked metrics.

Spec: ``rescore:<first stage>:depth=N,scorer=ce:<cross-encoder dir>``, e.g.
``rescore:bm25:depth=20,scorer=ce:runs/ce/model``. Cost: ``n_queries * depth`` forward passes
(pairs); the scorer's ``batch_size`` pairs at a time.

**Pinning** (``fingerprint=sha256:<hex>``, the whole weights fingerprint or a prefix of at least
:data:`MIN_PIN_HEX` hex digits): the scorer's loaded weights
(:attr:`~treerank.models.cross_encoder.CrossEncoderScorer.fingerprint`) must start with it, or
:class:`CrossEncoderMismatchError` (naming the folder and both fingerprints) is raised when the
scorer loads, before any pair is scored. :func:`cross_encoders` finds every reranker of a
system tree (inside a fusion too), :func:`check_cross_encoders` loads and checks them before any
work, and :meth:`CrossEncoderRescoreSystem.identity` is what ``search``, ``serve`` and
``evaluate`` record (folder, fingerprint, pin).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import RUN_DEPTH, sort_rows
from treerank.kernels.vectors import F32, I64, Scores
from treerank.models.cross_encoder import DEFAULT_SCORE_BATCH, CEPrecision, CrossEncoderScorer
from treerank.search.fusion_tuning import TunedFusionSystem
from treerank.search.query import EncoderMismatchError
from treerank.search.run import Run
from treerank.search.systems import FusionSystem, System
from treerank.search.two_stage import TwoStage
from treerank.storelike import StoreLike

__all__ = [
    "CE_PREFIX",
    "MIN_PIN_HEX",
    "CrossEncoderIdentity",
    "CrossEncoderMismatchError",
    "CrossEncoderRescoreSystem",
    "ce_rerank",
    "check_cross_encoders",
    "cross_encoders",
    "pin_problem",
    "recall_at_depth",
]

CE_PREFIX = "ce:"
MIN_PIN_HEX = 8
"""Fewest hex digits a ``fingerprint=`` pin may give (a shorter prefix pins almost nothing)."""
_PIN = re.compile(rf"sha256:[0-9a-f]{{{MIN_PIN_HEX},64}}")


class CrossEncoderMismatchError(EncoderMismatchError):
    """A pinned cross-encoder (``fingerprint=`` of the spec) whose loaded weights have another
    fingerprint; the message names the folder and both fingerprints."""


def pin_problem(pin: str) -> str | None:
    """Why ``pin`` is not a weights-fingerprint pin (``None``: it is one): ``sha256:`` and 8 to
    64 lowercase hex digits (the fingerprint or a prefix of it)."""
    if _PIN.fullmatch(pin):
        return None
    return (
        f"fingerprint={pin!r} is not sha256:<{MIN_PIN_HEX} to 64 lowercase hex digits> (the "
        "cross-encoder's weights fingerprint, or a prefix of it)"
    )


@dataclass(frozen=True)
class CrossEncoderIdentity:
    """Which cross-encoder a reranker scored with (recorded by ``search``, ``serve``, ``evaluate``).

    Attributes:
        system: the reranking system's name (its spec).
        path: the cross-encoder folder, resolved.
        fingerprint: ``sha256:<hex>`` of its loaded weights.
        pinned: the spec's ``fingerprint=`` pin (``None``: not pinned).
    """

    system: str
    path: str
    fingerprint: str
    pinned: str | None

    def to_dict(self) -> dict[str, str | None]:
        """The record as JSON (``search``'s and ``serve``'s output, ``results.json``)."""
        return asdict(self)


class PairScorer(Protocol):
    """What :func:`ce_rerank` scores with: ``score_pairs(queries, passages) -> float32 (n,)``
    (a :class:`~treerank.models.cross_encoder.CrossEncoderScorer`)."""

    def score_pairs(self, queries: Sequence[str], passages: Sequence[str]) -> Scores: ...


def ce_rerank(
    scorer: PairScorer, query_texts: list[str], passage_texts: list[str], candidates: I64
) -> tuple[I64, F32]:
    """Cross-encoder scores of each query's candidates, rows re-sorted.

    Args:
        scorer: anything with ``score_pairs(queries, passages) -> float32 (n,)``.
        query_texts: texts by query row; passage_texts: texts by passage id.
        candidates: ``int64 (nq, depth)`` first-stage ids, ``-1`` padding.

    Returns:
        ``(ids int64 (nq, depth), scores float32 (nq, depth))``: the same ids per row, sorted by
        score descending, ties by ascending id, padding (``-1``, ``-inf``) last.

    Raises:
        ValueError: candidates not ``(n_queries, depth)`` or ids out of range.
    """
    cand = np.asarray(candidates, dtype=np.int64)
    if cand.ndim != 2 or cand.shape[0] != len(query_texts):
        raise ValueError(f"candidates {cand.shape}: expected ({len(query_texts)}, depth)")
    if cand.size and (int(cand.max()) >= len(passage_texts) or int(cand.min()) < -1):
        raise ValueError(
            f"candidate ids must lie in [-1, {len(passage_texts)}); got {cand.min()}..{cand.max()}"
        )
    qi, ji = np.nonzero(cand >= 0)
    pairs_q = [query_texts[int(i)] for i in qi]
    pairs_p = [passage_texts[int(cand[i, j])] for i, j in zip(qi, ji, strict=True)]
    scores = np.full(cand.shape, -np.inf, dtype=np.float32)
    scores[qi, ji] = np.asarray(scorer.score_pairs(pairs_q, pairs_p), dtype=np.float32)
    if not np.isfinite(scores[qi, ji]).all():
        raise ValueError("the cross-encoder returned a non-finite score (the model diverged)")
    return sort_rows(np.where(cand >= 0, cand, -1), scores)


def recall_at_depth(store: StoreLike, candidates: I64) -> float:
    """Mean over queries with a relevant passage of the share of them among ``candidates``.

    Returns:
        Recall@depth in [0, 1] (``depth = candidates.shape[1]``); NaN when no query has one.
    """
    cand = np.asarray(candidates, dtype=np.int64)
    rel = np.where(
        (np.asarray(store.candidates) >= 0)
        & (np.asarray(store.labels) >= int(store.relevance_threshold)),
        np.asarray(store.candidates),
        -1,
    ).astype(np.int64)
    n_rel = (rel >= 0).sum(axis=1)
    hit = ((rel[:, :, None] == cand[:, None, :]) & (rel[:, :, None] >= 0)).any(axis=2).sum(axis=1)
    keep = n_rel > 0
    return float((hit[keep] / n_rel[keep]).mean()) if keep.any() else float("nan")


class CrossEncoderRescoreSystem(TwoStage[CrossEncoderScorer | str]):
    """A first stage's top ``depth`` reranked by a cross-encoder.

    Args:
        first: any system with ``retrieve(store, k) -> Run``.
        scorer: a :class:`CrossEncoderScorer`, or a spec ``ce:<dir>`` loaded on first use.
        depth: candidates reranked per query; the run returned has ``min(k, depth)`` columns
            (passages below the depth are never scored).
        name: run name.
        batch_size, precision, device: the scorer's options when loading from a spec.
        fingerprint: a pin (``sha256:<hex>``, whole or a prefix of >= 8 hex digits) the loaded
            weights' fingerprint must start with; ``None``: any weights.

    Raises:
        ValueError: ``depth < 1``, a ``ce:`` spec without a folder or a malformed pin (at
            build time).
        CrossEncoderMismatchError: (when the scorer loads, before any pair is scored) the
            weights do not match the pin.

    Attributes:
        first_run: the last first-stage run (its top ``depth``), for
            :meth:`first_stage_recall`.
    """

    def __init__(
        self,
        first: System,
        scorer: CrossEncoderScorer | str,
        depth: int = 100,
        name: str | None = None,
        *,
        batch_size: int = DEFAULT_SCORE_BATCH,
        precision: CEPrecision = "fp32",
        device: Device = DEFAULT_DEVICE,
        fingerprint: str | None = None,
    ) -> None:
        if isinstance(scorer, str) and not scorer.strip()[len(CE_PREFIX) :]:
            raise ValueError(f"cross-encoder scorer {scorer!r}: expected ce:<dir>")
        problem = None if fingerprint is None else pin_problem(fingerprint)
        if problem:
            raise ValueError(problem)
        super().__init__(first, scorer, depth, name)
        self.batch_size, self.precision, self.device = batch_size, precision, device
        self.pin = fingerprint
        self._pin_checked = False
        self.first_run: Run | None = None

    def scorer_for(self) -> CrossEncoderScorer:
        """The scorer, loaded from its folder on first use and checked against the pin.

        Raises:
            CrossEncoderMismatchError: the loaded weights do not match ``fingerprint=``.
            FileNotFoundError: no cross-encoder folder there.
        """
        if isinstance(self.scorer, str):
            path = self.scorer.strip()[len(CE_PREFIX) :]
            self.scorer = CrossEncoderScorer(
                path, device=self.device, batch_size=self.batch_size, precision=self.precision
            )
        if self.pin is not None and not self._pin_checked:
            have = str(self.scorer.fingerprint)
            if not have.startswith(self.pin):
                where = getattr(self.scorer, "path", "<in memory>")
                raise CrossEncoderMismatchError(
                    f"cross-encoder {where} has weights fingerprint {have}, but {self.name} "
                    f"pins fingerprint={self.pin}: another checkpoint is in that folder (pin "
                    "its fingerprint, or point scorer=ce: at the pinned one)"
                )
            self._pin_checked = True
        return self.scorer

    def identity(self) -> CrossEncoderIdentity:
        """The folder, weights fingerprint and pin this reranker scores with (loads the scorer
        and checks the pin, see :meth:`scorer_for`).

        Raises:
            TypeError: the scorer is not a :class:`CrossEncoderScorer` (one passed in code).
        """
        scorer = self.scorer_for()
        if not isinstance(scorer, CrossEncoderScorer):
            raise TypeError(f"{self.name}: its scorer {type(scorer).__name__} has no folder")
        return CrossEncoderIdentity(
            self.name, str(Path(scorer.path).resolve()), scorer.fingerprint, self.pin
        )

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        scorer = self.scorer_for()
        depth = min(self.depth, int(store.n_passages))
        first = self.first.retrieve(store, depth)
        self.first_run = first
        ids, scores = ce_rerank(scorer, store.query_texts(), store.passage_texts(), first.ids)
        k = min(int(k), ids.shape[1])
        return Run(self.name, ids[:, :k], scores[:, :k])

    def first_stage_recall(self, store: StoreLike) -> dict[str, float]:
        """``{"recall@<depth>": value}`` of the last first-stage run (the reranker's ceiling).

        Raises:
            RuntimeError: :meth:`retrieve` has not run yet.
        """
        if self.first_run is None:
            raise RuntimeError(
                f"{self.name}: retrieve first, then ask for the first stage's recall"
            )
        return {f"recall@{self.first_run.ids.shape[1]}": recall_at_depth(store, self.first_run.ids)}


def cross_encoders(system: System) -> list[CrossEncoderRescoreSystem]:
    """Every cross-encoder reranker of a system tree, depth first, each once: the system
    itself, a rescoring's first stage, a fusion's two sides (tuned fusion too)."""
    out: list[CrossEncoderRescoreSystem] = []
    todo = [system]
    while todo:
        node = todo.pop(0)
        if isinstance(node, CrossEncoderRescoreSystem) and all(node is not x for x in out):
            out.append(node)
        if isinstance(node, TwoStage):
            todo.insert(0, node.first)
        elif isinstance(node, FusionSystem | TunedFusionSystem):
            todo[:0] = [node.a, node.b]
    return out


def check_cross_encoders(systems: Iterable[System]) -> None:
    """Load every cross-encoder reranker of ``systems`` (:func:`cross_encoders`) and check its
    pin, before any query is scored. A folder that cannot be loaded is left to fail alone when
    its system runs (the other systems are still scored).

    Raises:
        CrossEncoderMismatchError: a pinned cross-encoder's weights differ.
    """
    for system in systems:
        for ce in cross_encoders(system):
            try:
                ce.scorer_for()
            except CrossEncoderMismatchError:
                raise
            except (OSError, ValueError):
                continue
