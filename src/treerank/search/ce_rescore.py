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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import RUN_DEPTH, sort_rows
from treerank.kernels.vectors import F32, I64, Scores
from treerank.models.cross_encoder import DEFAULT_SCORE_BATCH, CEPrecision, CrossEncoderScorer
from treerank.search.run import Run
from treerank.search.systems import System
from treerank.search.two_stage import TwoStage
from treerank.storelike import StoreLike

__all__ = ["CE_PREFIX", "CrossEncoderRescoreSystem", "ce_rerank", "recall_at_depth"]

CE_PREFIX = "ce:"


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

    Raises:
        ValueError: ``depth < 1`` or a ``ce:`` spec without a folder (at build time).

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
    ) -> None:
        if isinstance(scorer, str) and not scorer.strip()[len(CE_PREFIX) :]:
            raise ValueError(f"cross-encoder scorer {scorer!r}: expected ce:<dir>")
        super().__init__(first, scorer, depth, name)
        self.batch_size, self.precision, self.device = batch_size, precision, device
        self.first_run: Run | None = None

    def scorer_for(self) -> CrossEncoderScorer:
        if isinstance(self.scorer, str):
            path = self.scorer.strip()[len(CE_PREFIX) :]
            self.scorer = CrossEncoderScorer(
                path, device=self.device, batch_size=self.batch_size, precision=self.precision
            )
        return self.scorer

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
