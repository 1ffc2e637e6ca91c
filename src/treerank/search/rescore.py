"""Two-stage retrieval: any first-stage system's candidates, rescored exactly by a dense scorer.

The first stage (an approximate index, binary codes, BM25, a forest, a fusion: any
:class:`~treerank.search.systems.System`) returns its top ``depth`` passages per query; the
second stage computes the exact inner product ``encode_queries(q) . encode_passages(p)`` of a
:class:`~treerank.models.base.DenseScorer` (cosine, a trained head, DRT) for those candidates
only, and keeps the top ``k``. Passages outside the first stage's list are never scored, so the
second stage can only reorder what the first stage found (its Recall@depth bounds the result).

This is the "retrieve then rerank" scheme of the DPR lesson's practical chapter and of FAISS's
``IndexRefine`` (compressed first stage, exact refinement), generalised to any first stage and
any dense scorer. Candidate rows are read from the memory-mapped store by passage id in
ascending order, one query batch at a time: memory is ``O(batch * depth * d)``, not the corpus.

Spec: ``rescore:<first stage spec>[:depth=100,scorer=cosine|ckpt:<dir>|ce:<dir>]``, e.g.
``rescore:bm25:depth=200`` (BM25 candidates ranked by cosine) or
``rescore:faiss:binary:depth=1000,scorer=ckpt:ckpt/linear``. A cross-encoder scorer
(``scorer=ce:<dir>``) reads query and passage texts together and is built by
:mod:`treerank.search.ce_rescore` instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from treerank.encoders.precision import vector_precision
from treerank.kernels.topk import (
    RUN_DEPTH,
    check_finite,
    check_rows_finite,
    pair_scores,
    release_pages,
    sort_rows,
)
from treerank.kernels.vectors import F32, I64, Vecs
from treerank.models.base import DenseScorer
from treerank.search.run import Run
from treerank.search.systems import System
from treerank.search.two_stage import TwoStage
from treerank.storelike import StoreLike

DEFAULT_DEPTH = 100
DEFAULT_QUERY_BATCH = 64


def dense_scorer(
    spec: str, expected_fingerprint: str | None = None, expected_precision: str | None = None
) -> DenseScorer:
    """The dense scorer named by ``spec``: ``"cosine"`` or ``"ckpt:<dir>"``.

    Args:
        spec: ``cosine`` or ``ckpt:<checkpoint dir>`` holding a dense model (linear, mlp, drt).
        expected_fingerprint: the store's encoder fingerprint; a checkpoint trained on another
            encoder's vectors is refused.
        expected_precision: the store's vector precision; a checkpoint trained on vectors the
            mixing rule keeps apart is refused (`treerank.models.checkpoint.load_checkpoint`).

    Raises:
        ValueError: any other spec, or a checkpoint whose model has no dense towers.
        EncoderMismatchError: the checkpoint's encoder differs from ``expected_fingerprint``.
        PrecisionMixError: the checkpoint's training precision cannot mix with the store's.
    """
    from treerank.models.cosine import CosineScorer

    spec = spec.strip()
    if spec == "cosine":
        return CosineScorer()
    kind, _, path = spec.partition(":")
    if kind != "ckpt" or not path:
        raise ValueError(f"dense scorer {spec!r}: expected 'cosine' or 'ckpt:<checkpoint dir>'")
    from treerank.models.registry import load_model

    model = load_model(
        path, expected_fingerprint=expected_fingerprint, expected_precision=expected_precision
    )
    if not isinstance(model, DenseScorer):
        raise ValueError(
            f"{path}: a {type(model).__name__} has no dense query/passage towers to rescore with"
        )
    return model


def rescore(
    queries: Vecs,
    passages: Vecs,
    candidates: I64,
    k: int,
    passage_transform: Callable[[F32], Vecs] | None = None,
    query_batch: int = DEFAULT_QUERY_BATCH,
    release: bool = True,
    source: str = "passages",
) -> tuple[I64, F32]:
    """Exact inner-product scores of each query's candidates; the top ``k`` per query.

    Scores come from :func:`treerank.kernels.topk.pair_scores`, the kernel every score of
    :func:`~treerank.kernels.topk.exact_search` comes from: with every passage as candidates
    (and a row-wise passage tower such as cosine's normalisation) the result equals exact
    search, ids and scores, by construction.

    Args:
        queries: ``float32 (nq, d')`` query search vectors (already through the query tower).
        passages: ``(n_passages, d)`` stored passage vectors (ndarray or read-only memmap);
            only candidate rows are read.
        candidates: ``int64 (nq, depth)`` first-stage passage ids, ``-1`` = padding.
        k: results kept per query (clipped to ``depth``).
        passage_transform: the scorer's passage tower ``float32 (c, d) -> float32 (c, d')``;
            ``None`` scores the stored vectors as they are.
        query_batch: queries whose candidates are gathered at once.
        release: drop the gathered rows' file pages from the resident set after each batch
            (RSS stays one batch's rows); ``False`` keeps them mapped (RSS grows with the
            distinct rows touched, up to the store's size) so later searches skip the page
            faults.

    Returns:
        ``(ids int64 (nq, k'), scores float32 (nq, k'))``, ``k' = min(k, depth)``; rows sorted by
        exact score descending, ties by ascending passage id; padding (``-1``, ``-inf``) last.

        source: names the vectors in errors (the store path).

    Raises:
        ValueError: shapes that disagree, or candidate ids out of range.
        NonFiniteVectorError: a query, a candidate's stored vector or its tower output holds
            NaN or inf (a NaN score would otherwise drop the candidate silently).
    """
    q = np.ascontiguousarray(queries, dtype=np.float32)
    check_finite(q, "query", source)
    cand = np.asarray(candidates, dtype=np.int64)
    if q.ndim != 2 or cand.ndim != 2 or q.shape[0] != cand.shape[0]:
        raise ValueError(f"queries {q.shape} and candidates {cand.shape} must be (nq, .) arrays")
    n = int(passages.shape[0])
    if cand.size and (int(cand.max()) >= n or int(cand.min()) < -1):
        raise ValueError(f"candidate ids must lie in [-1, {n}); got {cand.min()}..{cand.max()}")
    k = min(int(k), cand.shape[1])
    scores = np.full(cand.shape, -np.inf, dtype=np.float32)
    store = np.asarray(passages)  # a memmap's ndarray view: np.take reads only the rows named
    for s in range(0, q.shape[0], query_batch):
        block = cand[s : s + query_batch]
        valid = block >= 0
        if not valid.any():
            continue
        # one gather per batch straight into (b * depth, d); padding reads row 0, scored -inf
        rows = np.take(store, np.where(valid, block, 0).ravel(), axis=0).astype(
            np.float32, copy=False
        )
        row_ids = np.where(valid, block, -1).ravel()
        check_rows_finite(rows, row_ids, "passage", source)
        if release:  # the gather maps file pages all over a memmap: drop them again
            release_pages(passages, int(block[valid].min()), int(block[valid].max()) + 1)
        if passage_transform is not None:
            rows = np.asarray(passage_transform(rows), dtype=np.float32)
            check_rows_finite(rows, row_ids, "transformed passage", source)
        if rows.shape[1] != q.shape[1]:
            raise ValueError(
                f"passage vectors {rows.shape} do not match the query dimension {q.shape[1]}"
            )
        b = block.shape[0]
        # the one score kernel of exact search: a pair's score never depends on its batch
        exact = pair_scores(q[s : s + b], rows.reshape(b, block.shape[1], -1))
        scores[s : s + b] = np.where(valid, exact, -np.inf)
    ids = np.where(np.isfinite(scores), cand, -1)
    ids, scores = sort_rows(ids, scores)
    return ids[:, :k], scores[:, :k]


class RescoreSystem(TwoStage[DenseScorer | str]):
    """A first-stage system's top ``depth`` rescored exactly by a dense scorer.

    Args:
        first: any system with ``retrieve(store, k) -> Run``.
        scorer: a :class:`DenseScorer`, or a spec for :func:`dense_scorer` (``"cosine"``,
            ``"ckpt:<dir>"``) loaded against the store's encoder fingerprint on first use.
        depth: first-stage candidates per query (the run is retrieved at ``max(k, depth)``).
        name: run name (default ``rescore:<first>:depth=<depth>``).
        release: passed to :func:`rescore` (``False``: keep the store's pages mapped).
    """

    def __init__(
        self,
        first: System,
        scorer: DenseScorer | str = "cosine",
        depth: int = DEFAULT_DEPTH,
        name: str | None = None,
        release: bool = True,
    ) -> None:
        super().__init__(first, scorer, depth, name)
        self.release = release

    def scorer_for(self, store: StoreLike) -> DenseScorer:
        if isinstance(self.scorer, str):
            self.scorer = dense_scorer(
                self.scorer, store.encoder_fingerprint, vector_precision(store)
            )
        return self.scorer

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        k = min(k, int(store.n_passages))
        scorer = self.scorer_for(store)
        first = self.first.retrieve(store, max(k, self.depth))
        q = np.asarray(scorer.encode_queries(np.asarray(store.queries, dtype=np.float32)))
        ids, scores = rescore(
            q,
            store.passages,
            first.ids,
            k,
            passage_transform=scorer.encode_passages,
            release=self.release,
            source=str(store.path),
        )
        return Run(self.name, ids, scores)


def split_params(body: str, keys: tuple[str, ...]) -> tuple[str, str]:
    """Split ``"<inner spec>:<k=v,...>"`` at the leftmost ``:`` after which every
    comma-separated item is ``key=value`` with a key from ``keys`` (values may hold ``:``).

    Returns:
        ``(inner, params)``; ``params`` is ``""`` when no such split exists.
    """
    pos = body.find(":")
    while pos != -1:
        tail = body[pos + 1 :]
        items = tail.split(",")
        if tail and all("=" in it and it.partition("=")[0].strip() in keys for it in items):
            return body[:pos], tail
        pos = body.find(":", pos + 1)
    return body, ""
