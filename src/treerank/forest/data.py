"""Training data of a TreeRank forest: examples, negatives, each pair's random draws, group tensors.

* :func:`pair_data`: the (query, selected passage) positives and the fixed negatives (judged
  non-selected candidates plus cosine hard negatives mined through the exact top-k kernel).
* :func:`source_pair_data` / :class:`TableStore`: the same from the shared ``data.sources``
  table (labels, pseudo-queries, teacher pairs; :mod:`treerank.training.data`) that the heads
  and DRT read.
* :func:`draw_pair`: everything random about one pair (init, bags, random negatives, dropout
  stream), from its own seed (:func:`pair_seed`), so a pair is the same whatever group it is
  trained in.
* :func:`build_group`: the tensors of a group of pairs, each pair with exactly the rows, bags and
  weights it would have alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from treerank.forest.config import ForestTrainConfig
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.rows import FileRows
from treerank.kernels.topk import exact_search, release_pages
from treerank.kernels.vectors import l2_normalize
from treerank.storelike import StoreLike

CPU = torch.device("cpu")
"""The resolved device a tensor helper defaults to."""

__all__ = [
    "PairData",
    "PairDraw",
    "PairGroup",
    "QueryRows",
    "SharedRows",
    "TableStore",
    "build_group",
    "draw_pair",
    "in_bag_examples",
    "mine_hard_negatives",
    "pair_data",
    "pair_seed",
    "shared_rows",
    "source_pair_data",
]


@dataclass
class PairData:
    """Training examples over the store, in store ids."""

    queries: np.ndarray  # int64 (nq,) store rows of queries with >= 1 selected passage
    pos_q: np.ndarray  # int64 (E+,) index into ``queries``
    pos_p: np.ndarray  # int64 (E+,) store passage ids
    neg_q: np.ndarray  # int64 (E-,) fixed negatives (judged non-selected + hard)
    neg_p: np.ndarray
    pos_keys: np.ndarray  # sorted int64 keys q_index * n_passages + p never used as negatives
    pos_weight: np.ndarray | None = None  # float32 (E+,) source weight of each positive (None: 1)


def mine_hard_negatives(
    q: np.ndarray,
    passages: Any,
    pos_q: np.ndarray,
    pos_p: np.ndarray,
    k: int,
    device: Device = DEFAULT_DEVICE,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` cosine passages per query that are not selected for it.

    Cosine of the stored vectors (both sides L2-normalised, the one rule of
    ``treerank.kernels.vectors``), ranked by the exact streaming kernel
    (``treerank.kernels.topk.exact_search``: ties by ascending passage id) on ``device``
    (None = the CPU; a GPU gives the same ids except where two cosines differ by < 1e-5).
    """
    nq, n = len(q), passages.shape[0]
    if k == 0 or nq == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kk = min(n, k + int(np.bincount(pos_q, minlength=nq).max()))
    best_i, _ = exact_search(
        l2_normalize(q), passages, k=kk, passage_transform=l2_normalize, device=device
    )
    is_pos = np.isin(
        np.arange(nq)[:, None] * n + best_i, pos_q * n + pos_p
    )  # (nq, kk) selected ones are not negatives
    rank = np.cumsum(~is_pos, axis=1)
    keep = ~is_pos & (rank <= k) & (best_i >= 0)
    rows, cols = np.nonzero(keep)
    return rows.astype(np.int64), best_i[rows, cols].astype(np.int64)


def pair_data(
    store: StoreLike,
    hard_negatives: int,
    train_rows: np.ndarray | None,
    device: Device = DEFAULT_DEVICE,
) -> PairData:
    """The training examples of a store split.

    Args:
        store: an ``EmbeddingStore`` (``candidates`` / ``labels`` / ``relevance_threshold``).
        hard_negatives: cosine hard negatives mined per query (0 = none).
        train_rows: query rows to train on (None: every query with a selected passage).
        device: where the hard negatives are mined (:func:`mine_hard_negatives`).

    Returns:
        :class:`PairData`: positives, fixed negatives (judged non-selected + mined), keys.

    Raises:
        ValueError: no query has a selected passage.
    """
    cand = np.asarray(store.candidates)
    lab = np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    valid = cand >= 0
    pos = valid & (lab >= thr)
    has_pos: np.ndarray = np.asarray(pos.any(axis=1))
    if train_rows is not None:
        allowed = np.zeros(has_pos.shape[0], dtype=np.bool_)
        allowed[np.asarray(train_rows, dtype=np.int64)] = True
        has_pos = has_pos & allowed
    queries = np.nonzero(has_pos)[0].astype(np.int64)
    if len(queries) == 0:
        raise ValueError(f"{store.path}: no query has a selected passage; cannot train a forest")
    cand, lab, pos, valid = cand[queries], lab[queries], pos[queries], valid[queries]
    pq, pc = np.nonzero(pos)
    nq_, nc = np.nonzero(valid & ~pos)
    qv = np.asarray(store.queries[queries], dtype=np.float32) if hard_negatives > 0 else None
    return _with_hard_negatives(
        queries,
        pq.astype(np.int64),
        cand[pq, pc].astype(np.int64),
        nq_.astype(np.int64),
        cand[nq_, nc].astype(np.int64),
        qv,
        store.passages,
        hard_negatives,
        device=device,
    )


def _with_hard_negatives(
    queries: np.ndarray,
    pos_q: np.ndarray,
    pos_p: np.ndarray,
    neg_q: np.ndarray,
    neg_p: np.ndarray,
    query_vectors: np.ndarray | None,
    passages: Any,
    hard_negatives: int,
    pos_weight: np.ndarray | None = None,
    excluded: tuple[np.ndarray, np.ndarray] | None = None,
    device: Device = DEFAULT_DEVICE,
) -> PairData:
    """:class:`PairData` of the given examples plus ``hard_negatives`` mined per query; the
    ``excluded`` ``(query index, passage id)`` pairs are never negatives (nor are positives)."""
    n_pass = int(passages.shape[0])
    ex_q, ex_p = excluded if excluded is not None else (np.zeros(0, np.int64),) * 2
    never_q, never_p = np.concatenate([pos_q, ex_q]), np.concatenate([pos_p, ex_p])
    if hard_negatives > 0:
        assert query_vectors is not None
        hq, hp = mine_hard_negatives(
            query_vectors, passages, never_q, never_p, hard_negatives, device
        )
        neg_q, neg_p = np.concatenate([neg_q, hq]), np.concatenate([neg_p, hp])
    if hard_negatives > 0 or excluded is not None:
        keys = np.unique(neg_q * n_pass + neg_p)
        keys = keys[~np.isin(keys, never_q * n_pass + never_p)]
        neg_q, neg_p = keys // n_pass, keys % n_pass
    return PairData(
        queries=queries,
        pos_q=pos_q,
        pos_p=pos_p,
        neg_q=neg_q,
        neg_p=neg_p,
        pos_keys=np.unique(never_q * n_pass + never_p),
        pos_weight=pos_weight,
    )


@dataclass
class TableStore:
    """A training store seen through its ``data.sources`` table: the trainer's store interface
    (``queries``, ``passages``, ``n_passages``, ``dim``, encoder fields) over the table's
    vectors (training store queries, then pseudo-queries; the corpus, then new pseudo
    passages)."""

    queries: np.ndarray  # float32 (nq', d)
    passages: np.ndarray  # float32 (N', d)
    path: Any
    encoder_name: Any = None
    encoder_fingerprint: Any = None

    @property
    def n_passages(self) -> int:
        return int(self.passages.shape[0])

    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    @property
    def dim(self) -> int:
        return int(self.queries.shape[1])


def source_pair_data(
    store: StoreLike,
    table: Any,
    specs: Sequence[Any],
    hard_negatives: int,
    device: Device = DEFAULT_DEVICE,
) -> tuple[TableStore, PairData]:
    """The forest's training examples from a ``data.sources`` table.

    Each source's pairs (:class:`treerank.training.sources.PairSet`) become (query, selected
    passage) positives: in ``sample`` mode every target with mass, in ``soft`` mode (a
    listwise teacher) the ``n_positives`` targets of highest mass; each positive carries its
    source's ``weight`` (the larger one when two sources give the same pair). A row's
    ``exclude_ids`` (labelled but not a target, or a same-text twin's target) are never
    negatives. Fixed negatives: the judged non-selected candidates of the training store's
    queries, plus ``hard_negatives`` cosine hard negatives per query mined over the table's
    passages.

    Args:
        store: the training split (its candidate table gives the judged negatives).
        table: :class:`treerank.training.data.TrainingTable` built from ``specs``.
        specs: the parsed ``data.sources`` entries, in the table's order.
        hard_negatives: mined per query (0 = none).
        device: where they are mined (:func:`mine_hard_negatives`).

    Returns:
        ``(TableStore over the table's vectors, PairData in its row ids)``.

    Raises:
        ValueError: no source gives a positive.
    """
    view = TableStore(
        np.asarray(table.queries, dtype=np.float32),
        np.asarray(table.passages, dtype=np.float32),
        getattr(store, "path", None),
        getattr(store, "encoder_name", None),
        getattr(store, "encoder_fingerprint", None),
    )
    n_pass = view.n_passages
    rows_q: list[np.ndarray] = []
    rows_p: list[np.ndarray] = []
    rows_w: list[np.ndarray] = []
    ex_q: list[np.ndarray] = []
    ex_p: list[np.ndarray] = []
    for spec, ps in zip(specs, table.sources, strict=True):
        w = np.asarray(ps.target_weights, dtype=np.float32)
        ids = np.asarray(ps.target_ids, dtype=np.int64)
        keep = (ids >= 0) & (w > 0)
        if ps.mode == "soft":
            order = np.argsort(-np.where(keep, w, -1.0), axis=1, kind="stable")
            rank = np.empty_like(order)
            np.put_along_axis(rank, order, np.arange(ids.shape[1])[None, :], axis=1)
            keep &= rank < int(spec.n_positives)
        r, c = np.nonzero(keep)
        rows_q.append(np.asarray(ps.query_rows, dtype=np.int64)[r])
        rows_p.append(ids[r, c])
        rows_w.append(np.full(len(r), float(spec.weight), dtype=np.float32))
        ex = np.asarray(ps.exclude_ids, dtype=np.int64)
        er, ec = np.nonzero(ex >= 0)
        ex_q.append(np.asarray(ps.query_rows, dtype=np.int64)[er])
        ex_p.append(ex[er, ec])
    all_q: np.ndarray = np.concatenate(rows_q)
    all_p: np.ndarray = np.concatenate(rows_p)
    all_w: np.ndarray = np.concatenate(rows_w)
    if len(all_q) == 0:
        raise ValueError(f"{view.path}: no data.sources entry gives a positive pair")
    # one example per (query, passage): the largest source weight
    key = all_q * n_pass + all_p
    order = np.lexsort((-all_w, key))
    key, all_w = key[order], all_w[order]
    first = np.r_[True, key[1:] != key[:-1]]
    key, pos_w = key[first], all_w[first]
    queries = np.unique(key // n_pass)
    pos_q = np.searchsorted(queries, key // n_pass)
    pos_p = key % n_pass
    # judged non-selected candidates of the store's own queries
    nq_store = int(store.n_queries)
    own = queries[queries < nq_store]
    cand = np.asarray(store.candidates)[own]
    lab = np.asarray(store.labels)[own]
    jr, jc = np.nonzero((cand >= 0) & (lab < int(store.relevance_threshold)))
    neg_q = np.searchsorted(queries, own[jr])
    neg_p = cand[jr, jc].astype(np.int64)
    eq, ep = np.concatenate(ex_q), np.concatenate(ex_p)
    inq = np.isin(eq, queries)
    excluded = (np.searchsorted(queries, eq[inq]), ep[inq])
    qv = view.queries[queries] if hard_negatives > 0 else None
    data = _with_hard_negatives(
        queries,
        pos_q,
        pos_p,
        neg_q,
        neg_p,
        qv,
        view.passages,
        hard_negatives,
        pos_w,
        excluded,
        device,
    )
    return view, data


def _exact_bag(gen: np.random.Generator, n: int, frac: float) -> np.ndarray:
    """``float32 (n,)`` 0/1 with exactly ``ceil(frac * n)`` ones at random places."""
    mask = np.zeros(n, dtype=np.float32)
    mask[gen.choice(n, size=max(1, math.ceil(frac * n)), replace=False)] = 1.0
    return mask


@dataclass
class PairDraw:
    """One pair's random choices, all from its own seed (:func:`pair_seed`)."""

    init: torch.Generator
    dropout: torch.Generator
    qmask: np.ndarray  # float32 (nq,)
    smask: np.ndarray  # float32 (nS,) bag over the shared passage rows
    rand_p: np.ndarray  # int64 (P,) the pair's pool of random negative passages (store ids)
    rmask: np.ndarray  # float32 (P,) bag over them


def pair_seed(seed: int, pair: int) -> np.random.SeedSequence:
    """The seed of pair ``pair`` of a forest trained with ``seed``: every random choice of the
    pair (init, bags, random negatives, dropout masks) comes from it, so pair ``m`` is the same
    whatever ``group_size``."""
    return np.random.SeedSequence([int(seed), int(pair)])


def _pool_size(cfg: ForestTrainConfig, nq: int, n_pass: int) -> int:
    """Rows of a pair's random-negative pool: ``min(random_pool, nq * R, n_passages)``."""
    return min(cfg.data.random_pool, nq * cfg.data.random_negatives, n_pass)


def draw_pair(cfg: ForestTrainConfig, pair: int, nq: int, n_shared: int, n_pass: int) -> PairDraw:
    """Every random choice of pair ``pair`` (global index), from :func:`pair_seed` alone:
    init and dropout generators, bag of ``nq`` queries, bag of ``n_shared`` shared passage rows,
    a pool of random passages out of ``n_pass`` and its bag."""
    rng = np.random.default_rng(pair_seed(cfg.seed, pair))
    init = torch.Generator().manual_seed(int(rng.integers(2**62)))
    dropout = torch.Generator().manual_seed(int(rng.integers(2**62)))
    qmask = _exact_bag(rng, nq, cfg.data.bag_queries)
    smask = _exact_bag(rng, n_shared, cfg.data.bag_passages)
    rand_p = rng.integers(0, n_pass, size=_pool_size(cfg, nq, n_pass)).astype(np.int64)
    rmask = (
        _exact_bag(rng, len(rand_p), cfg.data.bag_passages)
        if len(rand_p)
        else np.zeros(0, np.float32)
    )
    return PairDraw(init, dropout, qmask, smask, rand_p, rmask)


def _read_rows(array: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``float32 (len(ids), d)`` copies of ``array[ids]``.

    A whole read-only memory map is read with ``pread`` (:class:`treerank.kernels.rows.FileRows`),
    never through the map: a scattered gather through the map leaves each row's page, and the
    cached neighbours every fault also maps, in the resident set until released, so one block
    of 65,536 passage rows gathered from a 15 GB file could hold several GiB of it. Any other
    array is indexed, a read-only map's pages then dropped
    (:func:`treerank.kernels.topk.release_pages`). The rows are the stored bytes either way."""
    rows = FileRows.of(array)
    if rows is not None:
        try:
            return np.asarray(rows.gather(np.asarray(ids)), dtype=np.float32)
        finally:
            rows.close()
    out = np.asarray(array[ids], dtype=np.float32)
    release_pages(array, 0, int(array.shape[0]))
    return out


@dataclass
class SharedRows:
    """Passage rows every pair shares: positives and fixed negatives (read from the store on
    demand, a block at a time, so a 1M-passage store is never copied into memory)."""

    store: StoreLike
    ids: np.ndarray  # int64 (nS,) ascending store ids
    pos: np.ndarray  # int64 (E+,) row of each positive example
    neg: np.ndarray  # int64 (E-fixed,) row of each fixed negative example

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """``float32 (hi - lo, d)`` vectors of shared rows ``lo .. hi - 1``."""
        return _read_rows(self.store.passages, self.ids[lo:hi])


def shared_rows(store: StoreLike, data: PairData) -> SharedRows:
    """The shared passage rows of ``data`` (positives and fixed negatives, ascending ids)."""
    ids = np.unique(np.concatenate([data.pos_p, data.neg_p]))
    return SharedRows(
        store, ids, np.searchsorted(ids, data.pos_p), np.searchsorted(ids, data.neg_p)
    )


@dataclass
class QueryRows:
    """The training queries' vectors, read from the store a block at a time (a memory-mapped
    split's queries are never copied whole)."""

    store: StoreLike
    ids: np.ndarray  # int64 (nq,) store query rows, ascending

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.store.dim)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """``float32 (hi - lo, d)`` vectors of training queries ``lo .. hi - 1``."""
        return _read_rows(self.store.queries, self.ids[lo:hi])

    def take(self, idx: np.ndarray) -> np.ndarray:
        """``float32 (len(idx), d)`` vectors of training queries ``idx`` (ascending: ascending
        reads of a memory-mapped store)."""
        return _read_rows(self.store.queries, self.ids[idx])


@dataclass
class PairGroup:
    """Tensors of one group of ``G`` independent pairs trained together.

    Every pair has its own passage rows: the shared rows ``S`` (every positive and fixed
    negative passage, in ascending id order) followed by its own ``R`` random-negative rows, so
    each pair's tensors have exactly the shapes they have when it is trained alone.
    """

    xq: QueryRows  # the nq training queries (shared, read on demand)
    shared: SharedRows  # the nS shared passage rows (read on demand)
    pool_x: Tensor  # (G, R, d) each pair's random-negative pool rows
    qmask: Tensor  # (G, nq) bag of queries
    pos_q: Tensor  # (E+,) index into xq
    pos_p: Tensor  # (E+,) index into the pair's passage rows (a shared row)
    pos_w: Tensor  # (G, E+) bag * boosting weight
    neg_q: Tensor  # (E-,) index into xq
    neg_p: Tensor  # (E-,) index into the pair's passage rows
    neg_w: Tensor  # (G, E-) bag * negative_weight (0 for a random draw that is a positive)
    pmask: Tensor  # (G, nS + R) passages in the bag
    wanted: Tensor  # (G, nS + R) bool: the row is a positive of some training query
    gens: list[torch.Generator]  # one dropout stream per pair (CPU generators)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where every tensor above and every row block served lives (the trainer's device)."""

    @property
    def n_passage_rows(self) -> int:
        return len(self.shared.ids) + int(self.pool_x.shape[1])

    def passage_rows(self, lo: int, hi: int) -> Tensor:
        """``float32 (G, hi - lo, d)`` the pairs' passage rows ``lo .. hi - 1`` (shared, then
        pool)."""
        n_s = len(self.shared.ids)
        parts = []
        if lo < n_s:
            x = torch.from_numpy(self.shared.rows(lo, min(hi, n_s))).to(self.device)
            parts.append(x.unsqueeze(0).expand(self.pool_x.shape[0], -1, -1))
        if hi > n_s:
            parts.append(self.pool_x[:, max(lo, n_s) - n_s : hi - n_s])
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def passage_take(self, idx: np.ndarray) -> Tensor:
        """``float32 (G, len(idx), d)`` the pairs' passage rows ``idx`` (ascending)."""
        n_s = len(self.shared.ids)
        shared = idx[idx < n_s]
        out = torch.empty(self.pool_x.shape[0], len(idx), self.pool_x.shape[2], device=self.device)
        if len(shared):
            x = torch.from_numpy(_read_rows(self.shared.store.passages, self.shared.ids[shared]))
            out[:, : len(shared)] = x.to(self.device, torch.float32).unsqueeze(0)
        if len(shared) < len(idx):
            rest = torch.from_numpy(idx[len(shared) :] - n_s).to(self.device)
            out[:, len(shared) :] = self.pool_x[:, rest]
        return out


def in_bag_examples(
    idx_q: np.ndarray, idx_p: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The example columns some pair of the group weighs (``w > 0`` in any row).

    An example with weight 0 in every pair adds exactly 0 to every loss term and gradient
    (each term is ``sum(w * nll) / sum(w)``), so dropping it changes nothing but the cost: with
    a query bag of fraction ``b`` a group of ``G`` pairs keeps about ``1 - (1 - b)**G`` of the
    examples, which lets a pair bag a small share of a large training set at the bag's cost.

    Args:
        idx_q: ``int64 (E,)`` query row of each example.
        idx_p: ``int64 (E,)`` passage row of each example.
        w: ``float (G, E)`` per-pair example weights.

    Returns:
        ``(idx_q[keep], idx_p[keep], w[:, keep])``, order kept.
    """
    keep = (w > 0).any(axis=0)
    return idx_q[keep], idx_p[keep], w[:, keep]


def build_group(
    cfg: ForestTrainConfig,
    store: StoreLike,
    data: PairData,
    shared: SharedRows,
    xq: QueryRows,
    draws: list[PairDraw],
    boost: np.ndarray,
    device: torch.device = CPU,
) -> PairGroup:
    """Tensors of the pairs of ``draws``: shared rows, then each pair's random-negative rows,
    built on the CPU (numpy draws) and moved to ``device`` (resolved)."""
    dev = device
    n_g, nq, n_s = len(draws), xq.n, len(shared.ids)
    n_pass = int(store.n_passages)
    # Random negative r of query i is slot (i * R + r) mod P of the pair's own pool of P random
    # passages: every pair draws its own passages, the slot layout is shared.
    rand_q = np.repeat(np.arange(nq, dtype=np.int64), cfg.data.random_negatives)
    n_r = _pool_size(cfg, nq, n_pass)
    slot = np.arange(len(rand_q), dtype=np.int64) % max(1, n_r)
    pool_x = torch.empty(n_g, n_r, xq.dim)
    qmask = np.stack([d.qmask for d in draws])
    pmask = np.concatenate(
        [np.stack([d.smask for d in draws]), np.stack([d.rmask for d in draws])], axis=1
    )
    rand_ok = np.empty((n_g, len(rand_q)), dtype=np.float32)
    for i, d in enumerate(draws):
        if n_r:
            order = np.argsort(d.rand_p)  # ascending reads of a memory-mapped store
            rows = np.empty((n_r, xq.dim), dtype=np.float32)
            rows[order] = np.asarray(store.passages[d.rand_p[order]], dtype=np.float32)
            pool_x[i] = torch.from_numpy(rows)
        # a random draw that is one of its query's positives is not a negative
        rand_ok[i] = ~np.isin(rand_q * n_pass + d.rand_p[slot], data.pos_keys)
    pos_in = qmask[:, data.pos_q]  # (G, E+)
    if data.pos_weight is not None:
        boost = boost * data.pos_weight
    g_rows, e_cols = np.nonzero(pos_in)
    pmask[g_rows, shared.pos[e_cols]] = 1.0  # a bagged query keeps its positives
    wanted = np.zeros(pmask.shape, dtype=np.bool_)
    wanted[:, shared.pos] = True  # known relevant to some training query: never a target
    neg_q = np.concatenate([data.neg_q, rand_q])
    neg_p = np.concatenate([shared.neg, n_s + slot])
    ok = np.concatenate([np.ones((n_g, len(data.neg_q)), np.float32), rand_ok], axis=1)
    neg_w = qmask[:, neg_q] * pmask[:, neg_p] * ok * cfg.trainer.negative_weight
    pos_w = pos_in * boost[None, :]
    pos_q, pos_p, pos_w = in_bag_examples(data.pos_q, shared.pos.astype(np.int64), pos_w)
    neg_q, neg_p, neg_w = in_bag_examples(neg_q, neg_p, neg_w)
    return PairGroup(
        xq=xq,
        shared=shared,
        pool_x=pool_x.to(dev),
        qmask=torch.from_numpy(qmask).to(dev),
        pos_q=torch.from_numpy(pos_q).to(dev),
        pos_p=torch.from_numpy(pos_p).to(dev),
        pos_w=torch.from_numpy(pos_w.astype(np.float32)).to(dev),
        neg_q=torch.from_numpy(neg_q).to(dev),
        neg_p=torch.from_numpy(neg_p).to(dev),
        neg_w=torch.from_numpy(neg_w.astype(np.float32)).to(dev),
        pmask=torch.from_numpy(pmask.astype(np.float32)).to(dev),
        wanted=torch.from_numpy(wanted).to(dev),
        gens=[d.dropout for d in draws],
        device=dev,
    )
