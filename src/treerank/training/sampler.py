"""Contrastive batches: designated positives, hard negatives and exact masks by passage id.

A batch holds ``B`` queries. Each query brings one *designated positive* (one of its relevant
candidates, drawn afresh every epoch) and up to ``H`` *hard negatives* (its non-selected
candidates, e.g. MS MARCO's shown-but-not-selected passages, or, for sources without such
candidates, BM25 passages mined into the store, see ``treerank.search.negatives``). The batch's
columns are the **de-duplicated** passage ids of all of them, so ``M <= B * (1 + H)``, and every
query is scored against every column (in-batch negatives, DPR's trick).

Masks are exact because columns are unique passage ids: for query ``i``, ``positive[i, j]`` is
True only at its designated positive, and ``mask_out[i, j]`` is True for every *other* column
whose passage is labelled for query ``i`` (relevant, or graded below the relevance threshold but
above 0): such passages are neither pushed away nor pulled in. Two queries sharing a positive
share its column, positive for both.

The false-negative guard for mined negatives (:func:`guard_mined_negatives`) drops the top of a
BM25 list and/or anything the frozen encoder scores within a margin of the query's best positive.
Default (``treerank.training.heads.SamplerConfig``): skip the first 3 BM25 ranks, no margin.
Measured on SciFact train (``bench/scifact_heads.py guard``): hiding one of the relevant
passages of each of the 77 queries with >= 2 of them (187 trials), the hidden positive sat in
the BM25 top-30 negative pool in 148 trials (median rank 2.5), i.e. ~26 false negatives per
1,000 pool negatives. Skipping the first 3 ranks removes 50% of them at the cost of 6.7% of the
pool (skip 1: 22% for 1.9%; skip 10: 89% for 28%; margin 0 on the frozen cosine: 44% for 10%,
a worse trade). Downstream (held-out nDCG@10, 3 seeds) no guard, skip 3, skip 10 and margin 0
were within seed noise (0.791-0.797, std ~0.015), so the default takes the cheap half of the
false negatives out without a measurable cost.

Reference: Karpukhin et al. (2020), "Dense Passage Retrieval" (in-batch + BM25 hard negatives);
Qu et al. (2021), "RocketQA" (denoising false negatives among mined hard negatives).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from treerank.kernels.vectors import l2_normalize

__all__ = [
    "Batch",
    "ContrastiveSampler",
    "collision_mask",
    "guard_mined_negatives",
    "hard_negative_pool",
    "relevant_lists",
    "text_keys",
]


@dataclass(frozen=True)
class Batch:
    """One contrastive batch.

    Attributes:
        query_rows: ``int64 (B,)`` query ids (store rows).
        passage_rows: ``int64 (M,)`` unique passage ids (store rows), ascending.
        positive: ``bool (B, M)`` True at each query's designated positive (one per row).
        mask_out: ``bool (B, M)`` True where the passage is labelled for the query but is not
            its designated positive (removed from that row's softmax denominator).
        target: ``float32 (B, M)`` teacher distribution over the columns (soft labels), or
            None (one-hot on ``positive``: InfoNCE).
        target_ids, target_weights: ``int64 / float32 (B, L)`` the same target by passage id
            (``-1`` padding), for losses over the whole corpus (``negatives: all``); None: the
            designated positives.
        exclude_ids: ``int64 (B, K)`` passages kept out of each row's softmax over the whole
            corpus, ``-1`` padding; None: the row's labelled non-positive candidates.
        teacher_scores: ``float32 (B, M)`` a ``margin-mse`` teacher's scores of the columns it
            ranked for the row (NaN elsewhere, and on rows of other sources), or None.
    """

    query_rows: np.ndarray
    passage_rows: np.ndarray
    positive: np.ndarray
    mask_out: np.ndarray
    target: np.ndarray | None = None
    target_ids: np.ndarray | None = None
    target_weights: np.ndarray | None = None
    exclude_ids: np.ndarray | None = None
    teacher_scores: np.ndarray | None = None

    @property
    def size(self) -> tuple[int, int]:
        """``(B, M)``."""
        return int(self.positive.shape[0]), int(self.positive.shape[1])


def relevant_lists(
    candidates: np.ndarray, labels: np.ndarray, relevance_threshold: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query relevant and labelled passage ids, ``-1`` padded.

    Args:
        candidates: ``int32 (nq, K)`` candidate passage ids, ``-1`` padding.
        labels: ``uint8 (nq, K)`` grades.
        relevance_threshold: a grade ``>=`` this is relevant.

    Returns:
        ``(relevant, labelled)``: two ``int64 (nq, K)`` arrays; ``relevant`` keeps candidates
        with grade ``>= threshold``, ``labelled`` those with grade ``> 0``; others are ``-1``.

    Raises:
        ValueError: shapes differ.
    """
    if candidates.shape != labels.shape or candidates.ndim != 2:
        raise ValueError(
            f"candidates {candidates.shape} and labels {labels.shape} must be equal 2-D shapes"
        )
    cand = np.asarray(candidates, dtype=np.int64)
    lab = np.asarray(labels)
    valid = cand >= 0
    relevant = np.where(valid & (lab >= relevance_threshold), cand, -1)
    labelled = np.where(valid & (lab > 0), cand, -1)
    return relevant, labelled


def hard_negative_pool(
    candidates: np.ndarray,
    labels: np.ndarray,
    mined: np.ndarray | None = None,
    source: str = "auto",
    depth: int | None = None,
) -> np.ndarray:
    """Hard-negative pool of every query, ``int64 (nq, P)``, ``-1`` padded, in rank order.

    Args:
        candidates, labels: as :func:`relevant_lists`.
        mined: ``int (nq, N)`` mined passage ids in rank order (BM25), ``-1`` where a slot was
            dropped (labelled relevant, or removed by :func:`guard_mined_negatives`).
        source: ``"candidates"`` (the query's candidates with grade 0), ``"mined"``,
            ``"auto"`` (candidates when the split has any grade-0 candidate, else mined, else
            none) or ``"none"``.
        depth: keep only the first ``depth`` valid entries of each row (None: all).

    Raises:
        ValueError: unknown source, or ``"mined"`` without a mined array, or a mined array with
            the wrong number of rows.
    """
    nq = candidates.shape[0]
    if source == "auto":
        has_neg = bool(np.any((candidates >= 0) & (labels == 0)))
        source = "candidates" if has_neg else ("mined" if mined is not None else "none")
    if source == "none":
        return np.full((nq, 0), -1, dtype=np.int64)
    if source == "candidates":
        pool = np.where((candidates >= 0) & (labels == 0), candidates, -1).astype(np.int64)
    elif source == "mined":
        if mined is None:
            raise ValueError("hard negatives 'mined' requested but no mined array was given")
        if mined.shape[0] != nq:
            raise ValueError(f"mined negatives have {mined.shape[0]} rows for {nq} queries")
        pool = np.asarray(mined, dtype=np.int64).copy()
        # never use a passage labelled for the query as its negative
        _, labelled = relevant_lists(candidates, labels, 1)
        for start in range(0, nq, 8192):  # blocks keep the (b, N, K) comparison small
            sl = slice(start, start + 8192)
            lab = labelled[sl][:, None, :]
            hit = ((pool[sl][:, :, None] == lab) & (lab >= 0)).any(axis=2)
            pool[sl][hit] = -1
    else:
        raise ValueError(f"unknown hard-negative source {source!r} (auto, candidates, mined, none)")
    # compact each row (valid entries first, rank order kept) and cut to depth
    order = np.argsort(pool < 0, axis=1, kind="stable")
    pool = np.take_along_axis(pool, order, axis=1)
    width = int((pool >= 0).sum(axis=1).max(initial=0))
    if depth is not None:
        width = min(width, depth)
    return pool[:, :width]


def guard_mined_negatives(
    mined: np.ndarray,
    *,
    skip_top: int = 0,
    margin: float | None = None,
    query_vectors: np.ndarray | None = None,
    passage_vectors: np.ndarray | None = None,
    relevant: np.ndarray | None = None,
    chunk_size: int = 4096,
) -> np.ndarray:
    """False-negative guard: drop mined negatives likely to be unlabelled positives.

    Two rules, both optional:

    * ``skip_top``: drop the first ``skip_top`` ranks of each mined list (an unlabelled relevant
      passage is most likely near the top of BM25's ranking).
    * ``margin``: drop a negative whose frozen-embedding cosine ``cos(q, n)`` is ``>=
      max_pos(cos(q, p)) - margin``, vectors L2-normalised whatever the store holds (the one
      rule of ``treerank.kernels.vectors``): the encoder already finds it as good as a labelled
      positive (RocketQA's denoising idea with the frozen bi-encoder in place of a
      cross-encoder). Queries without a relevant passage are left alone by this rule.

    Args:
        mined: ``int (nq, N)`` passage ids in rank order, ``-1`` for empty slots.
        skip_top: number of leading ranks to drop (0 keeps all).
        margin: cosine margin, or None to disable.
        query_vectors: ``float32 (nq, d)`` stored query vectors (needed with ``margin``).
        passage_vectors: ``float32 (np, d)`` stored passage vectors (array or memmap).
        relevant: ``int (nq, K)`` relevant passage ids, ``-1`` padded (needed with ``margin``).
        chunk_size: queries per block for the margin rule.

    Returns:
        ``int64 (nq, N)``: ``mined`` with dropped slots set to ``-1`` (positions kept, so a
        column is still the BM25 rank).

    Raises:
        ValueError: ``margin`` given without vectors / relevant ids, or mismatched rows.
    """
    out = np.asarray(mined, dtype=np.int64).copy()
    if skip_top > 0:
        out[:, :skip_top] = -1
    if margin is None:
        return out
    if query_vectors is None or passage_vectors is None or relevant is None:
        raise ValueError("guard margin needs query_vectors, passage_vectors and relevant")
    nq = out.shape[0]
    if query_vectors.shape[0] != nq or relevant.shape[0] != nq:
        raise ValueError(
            f"guard: {nq} mined rows, {query_vectors.shape[0]} query vectors, "
            f"{relevant.shape[0]} relevant rows"
        )
    for start in range(0, nq, chunk_size):
        sl = slice(start, min(start + chunk_size, nq))
        q = l2_normalize(np.asarray(query_vectors[sl], dtype=np.float32))  # (b, d) unit rows
        neg, rel = out[sl], np.asarray(relevant[sl], dtype=np.int64)
        neg_s = _row_scores(q, passage_vectors, neg)  # (b, N)
        pos_s = _row_scores(q, passage_vectors, rel)  # (b, K)
        best = np.where(rel >= 0, pos_s, -np.inf).max(axis=1, initial=-np.inf)  # (b,)
        drop = (neg >= 0) & (neg_s >= (best - margin)[:, None])
        neg[drop] = -1
    return out


def _row_scores(q: np.ndarray, passages: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``float32 (b, n)``: ``q[i] . unit(passages[ids[i, j]])``, NaN where ``ids < 0``."""
    flat = ids.reshape(-1)
    valid = flat >= 0
    uniq, inv = np.unique(flat[valid], return_inverse=True)
    vecs = l2_normalize(np.asarray(passages[uniq], dtype=np.float32)) if uniq.size else None
    out = np.full(flat.shape, np.nan, dtype=np.float32)
    if vecs is not None:
        rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])[valid]
        out[valid] = np.einsum("nd,nd->n", q[rows], vecs[inv])
    return out.reshape(ids.shape)


def text_keys(texts: Sequence[str]) -> np.ndarray:
    """``int64 (n,)`` a 64-bit BLAKE2b hash of each exact text (equal texts, equal keys)."""
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "little")
            - 2**63
            for t in texts
        ],
        dtype=np.int64,
    )


def collision_mask(keys: np.ndarray, known: Sequence[np.ndarray], cols: np.ndarray) -> np.ndarray:
    """The batch-collision rule of every sampler: ``bool (B, M)``, True where column ``c`` is a
    known passage of another row of the batch that *collides* with row ``i``.

    Two rows collide when their queries have the same text (equal ``keys``) or share a known
    passage (both label it). A colliding row's positives are evidence for row ``i`` too, so
    they must never be row ``i``'s in-batch negatives; callers OR this into ``mask_out`` and then
    clear row ``i``'s own positive / target columns. Without it, two SciFact-style twin queries
    (one text, two different positives) push each other's positive away.

    Args:
        keys: ``int64 (B,)`` query-text keys (:func:`text_keys`).
        known: per row, ``int (n_i,)`` passage ids labelled for it (targets and excluded ids),
            ``-1`` ignored.
        cols: ``int64 (M,)`` the batch's sorted unique passage columns.

    Returns:
        ``bool (B, M)``; all False when no two rows collide.
    """
    bsz, m = len(known), int(cols.size)
    ids = [np.asarray(k, dtype=np.int64) for k in known]
    ids = [k[k >= 0] for k in ids]
    lengths = np.array([k.size for k in ids])
    flat = np.concatenate(ids) if ids else np.empty(0, np.int64)
    row_of = np.repeat(np.arange(bsz), lengths)
    uniq, inv = np.unique(flat, return_inverse=True)
    inc = np.zeros((bsz, uniq.size), dtype=np.float32)  # row x known passage incidence
    inc[row_of, inv] = 1.0
    keys = np.asarray(keys, dtype=np.int64)
    link = (inc @ inc.T > 0) | (keys[:, None] == keys[None, :])
    np.fill_diagonal(link, False)
    if not link.any():
        return np.zeros((bsz, m), dtype=bool)
    at = np.clip(np.searchsorted(cols, uniq), 0, max(m - 1, 0))
    in_batch = (cols[at] == uniq) if m else np.zeros(uniq.size, bool)
    on_cols = np.zeros((bsz, m), dtype=np.float32)  # row x column: the row knows this column
    hit = in_batch[inv]
    on_cols[row_of[hit], at[inv[hit]]] = 1.0
    return (link.astype(np.float32) @ on_cols) > 0


class ContrastiveSampler:
    """Seeded epochs of :class:`Batch` over a set of training queries.

    Args:
        candidates: ``int32 (nq, K)`` candidate passage ids of *all* queries of the split.
        labels: ``uint8 (nq, K)`` grades.
        relevance_threshold: grade ``>=`` this is relevant (positives are drawn from these).
        query_rows: ``int (n,)`` queries to train on (default: all); queries without a relevant
            passage are skipped (they cannot have a positive).
        batch_size: ``B``, queries per batch.
        n_hard: ``H``, hard negatives per query (0 = in-batch negatives only).
        hard_pool: ``int64 (nq, P)`` hard-negative pool from :func:`hard_negative_pool`
            (None = no hard negatives). ``H`` of a query's pool are drawn uniformly without
            replacement each epoch (all of them when the pool is smaller).
        seed: the epoch ``e`` draws from ``numpy.random.default_rng([seed, e])``: same seed, same
            batches.
        drop_last: drop a final batch smaller than ``B`` (kept when it is the only batch).
        query_keys: ``int64 (nq,)`` query-text keys of the split (:func:`text_keys`) for the
            batch-collision rule (:func:`collision_mask`: a batch never leaves a same-text or
            label-sharing query's positive as an unmasked negative); None: only queries that
            share a labelled passage collide.

    Raises:
        ValueError: no training query has a relevant passage, or bad sizes.
    """

    def __init__(
        self,
        candidates: np.ndarray,
        labels: np.ndarray,
        *,
        relevance_threshold: int = 1,
        query_rows: np.ndarray | None = None,
        batch_size: int = 64,
        n_hard: int = 1,
        hard_pool: np.ndarray | None = None,
        seed: int = 0,
        drop_last: bool = True,
        query_keys: np.ndarray | None = None,
    ) -> None:
        if batch_size < 1 or n_hard < 0:
            raise ValueError(
                f"batch_size must be >= 1 and n_hard >= 0 (got {batch_size}, {n_hard})"
            )
        self.relevant, self.labelled = relevant_lists(candidates, labels, relevance_threshold)
        nq = self.relevant.shape[0]
        rows = np.arange(nq) if query_rows is None else np.asarray(query_rows, dtype=np.int64)
        has_pos = (self.relevant[rows] >= 0).any(axis=1)
        self.query_rows = rows[has_pos]
        if self.query_rows.size == 0:
            raise ValueError("no training query has a relevant passage")
        self.batch_size = int(batch_size)
        self.n_hard = int(n_hard)
        if hard_pool is not None and hard_pool.shape[0] != nq:
            raise ValueError(f"hard_pool has {hard_pool.shape[0]} rows for {nq} queries")
        self.hard_pool = hard_pool if hard_pool is not None and hard_pool.shape[1] else None
        self.seed = int(seed)
        self.drop_last = drop_last
        if query_keys is not None and np.shape(query_keys) != (nq,):
            raise ValueError(f"query_keys has shape {np.shape(query_keys)} for {nq} queries")
        # None: every query its own key (distinct negative numbers never equal a row's index)
        self.query_keys = (
            np.asarray(query_keys, dtype=np.int64)
            if query_keys is not None
            else -1 - np.arange(nq, dtype=np.int64)
        )

    def __len__(self) -> int:
        """Batches per epoch."""
        n, b = self.query_rows.size, self.batch_size
        if self.drop_last and n >= b:
            return n // b
        return -(-n // b)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The batches of epoch ``epoch`` (a seeded shuffle of the training queries)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.query_rows)
        for b in range(len(self)):
            rows = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.make_batch(rows, rng)

    def make_batch(self, rows: np.ndarray, rng: np.random.Generator) -> Batch:
        """Build the batch of queries ``rows``: draw positives and hard negatives, build masks."""
        rows = np.asarray(rows, dtype=np.int64)
        rel = self.relevant[rows]  # (B, K)
        pos = _draw(rel, 1, rng)[:, 0]  # (B,) one relevant id per query
        parts = [pos]
        if self.hard_pool is not None and self.n_hard > 0:
            neg = _draw(self.hard_pool[rows], self.n_hard, rng)  # (B, H), -1 where short
            parts.append(neg[neg >= 0])
        cols = np.unique(np.concatenate(parts))  # (M,) sorted unique passage ids
        bsz, m = rows.size, cols.size
        positive = np.zeros((bsz, m), dtype=bool)
        positive[np.arange(bsz), np.searchsorted(cols, pos)] = True
        lab = self.labelled[rows]  # (B, K)
        at = np.clip(np.searchsorted(cols, lab), 0, m - 1)
        present = (lab >= 0) & (cols[at] == lab)
        mask_out = np.zeros((bsz, m), dtype=bool)
        r_idx = np.broadcast_to(np.arange(bsz)[:, None], lab.shape)
        mask_out[r_idx[present], at[present]] = True
        mask_out |= collision_mask(self.query_keys[rows], list(lab), cols)
        mask_out &= ~positive
        excl = np.where(lab != pos[:, None], lab, -1)  # (B, K) labelled, not designated
        return Batch(
            rows,
            cols,
            positive,
            mask_out,
            target_ids=pos[:, None].copy(),
            target_weights=np.ones((bsz, 1), dtype=np.float32),
            exclude_ids=excl,
        )


def _draw(pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` valid entries per row without replacement (``-1`` where a row runs short).

    Args:
        pool: ``int64 (B, P)`` ids, ``-1`` = empty.

    Returns:
        ``int64 (B, n)``.
    """
    if pool.shape[1] == 0:
        return np.full((pool.shape[0], n), -1, dtype=np.int64)
    keys = rng.random(pool.shape)
    keys[pool < 0] = np.inf
    pick = np.argsort(keys, axis=1)[:, :n]
    out = np.take_along_axis(pool, pick, axis=1)
    if out.shape[1] < n:
        out = np.pad(out, ((0, 0), (0, n - out.shape[1])), constant_values=-1)
    return out
