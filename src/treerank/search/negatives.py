"""Mining BM25 hard negatives into a store sidecar (for sources without non-selected candidates).

DPR trains with "the top passages returned by BM25 which don't contain the answer"; for
BEIR-style sources (SciFact, TREC) the split has no shown-but-not-selected passages, so the
thin heads draw their hard negatives from the BM25 ranking of each query over the split's own
passages, mined once and stored beside the split (``store.save_array``), hence reproducible.

The stored array keeps BM25's rank positions: ``negatives[i, r]`` is the passage BM25 ranked
``r``-th (0-based) for query ``i``, or ``-1`` where that passage is labelled for the query (any
grade ``> 0``) or scored 0 (no shared term: not a *hard* negative). The false-negative guard
(``treerank.training.sampler.guard_mined_negatives``) is applied at training time, so its
settings can change without mining again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from treerank.kernels.vectors import Scores
from treerank.metrics.qrels import Grades, PassageIds
from treerank.search.bm25 import BM25Index, BM25Params
from treerank.store.format import MINED_NEGATIVES_ARRAY
from treerank.storelike import StoreLike

__all__ = ["DEFAULT_ARRAY", "drop_labelled", "mine_bm25_negatives"]

DEFAULT_ARRAY = MINED_NEGATIVES_ARRAY


def drop_labelled(
    ranked: PassageIds,
    candidates: PassageIds,
    labels: Grades,
    scores: Scores | None = None,
) -> npt.NDArray[np.int32]:
    """Blank out (``-1``) ranked passages that are labelled for their query, or scored ``<= 0``.

    Args:
        ranked: ``int (nq, N)`` passage ids per query in rank order (``-1`` padding).
        candidates: ``int32 (nq, K)`` labelled passage ids, ``-1`` padding.
        labels: ``uint8 (nq, K)`` grades.
        scores: ``float (nq, N)`` scores of ``ranked`` (entries ``<= 0`` are dropped), or None.

    Returns:
        ``int32 (nq, N)``, positions kept (column = rank).

    Raises:
        ValueError: row counts differ.
    """
    ranked = np.asarray(ranked, dtype=np.int64)
    if ranked.shape[0] != candidates.shape[0] or candidates.shape != labels.shape:
        raise ValueError(
            f"ranked {ranked.shape}, candidates {candidates.shape} and labels {labels.shape} "
            "must have one row per query"
        )
    labelled = np.where((candidates >= 0) & (labels > 0), candidates, -1).astype(np.int64)
    out = ranked.copy()
    for s in range(0, out.shape[0], 8192):  # blocks keep the (b, N, K) comparison small
        lab = labelled[s : s + 8192][:, None, :]
        hit = ((out[s : s + 8192][:, :, None] == lab) & (lab >= 0)).any(axis=2)
        out[s : s + 8192][hit] = -1
    if scores is not None:
        out[np.asarray(scores) <= 0] = -1
    return out.astype(np.int32)


def mine_bm25_negatives(
    store: StoreLike,
    depth: int = 100,
    *,
    name: str = DEFAULT_ARRAY,
    params: BM25Params | None = None,
    overwrite: bool = False,
) -> npt.NDArray[np.int32]:
    """Mine each query's BM25 top-``depth`` over the split's passages into ``store``.

    Reuses the sidecar when it exists with the same ``depth`` and BM25 parameters (unless
    ``overwrite``).

    Args:
        store: an ``EmbeddingStore`` (texts, candidates, labels, ``save_array``).
        depth: BM25 ranks kept per query.
        name: sidecar array name.
        params: BM25 hyperparameters (default: ``treerank.search.bm25.BM25Params()``).
        overwrite: mine again even if the sidecar exists.

    Returns:
        ``int32 (n_queries, depth')`` (``depth' = min(depth, n_passages)``), see
        :func:`drop_labelled`.
    """
    params = params or BM25Params()
    want = {
        "source": "bm25",
        "depth": int(depth),
        "k1": params.k1,
        "b": params.b,
        "method": params.method,
        "stemmer": params.stemmer,
        "stopwords": params.stopwords,
    }
    if not overwrite and store.has_array(name):
        meta = store.load_array_meta(name)
        if meta is not None and all(meta.get(k) == v for k, v in want.items()):
            arr = store.load_array(name)
            if arr is not None:
                return np.asarray(arr)
    index = BM25Index(store.passage_texts(), params)
    ids, scores = index.search(store.query_texts(), k=depth)
    neg = drop_labelled(ids, np.asarray(store.candidates), np.asarray(store.labels), scores)
    meta = {
        **want,
        "kept": int((neg >= 0).sum()),
        "dropped_labelled_or_zero": int((neg < 0).sum()),
        "n_queries": int(neg.shape[0]),
    }
    store.save_array(name, neg, meta=meta)
    return neg
