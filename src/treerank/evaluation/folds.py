"""k-fold cross-validation over a split's queries, for collections without a training split.

TREC DL19 (43 judged topics over a pooled corpus) has no training queries, so a trained model is
evaluated by k-fold cross-validation over its topics (``configs/forest/dl19_cv.yaml``): every
fold trains on the other folds' judgments and ranks the **full** passage pool for its held-out
topics; the folds' runs, concatenated, are the evaluated run. :func:`topic_folds` is the one
fold rule, shared by ``scripts/experiments/forest_experiment.py --cv-folds`` and
``bench/bench_forest_rescore.py --cv-folds``: the rows of the queries with at least one relevant
judged candidate (label >= the store's ``relevance_threshold``), permuted by
``numpy.random.default_rng(seed)`` and cut by :func:`numpy.array_split` into ``n_folds``
consecutive parts (sizes differ by at most one).
"""

from __future__ import annotations

import numpy as np

from treerank.kernels.vectors import I64
from treerank.storelike import Judgments


def relevant_rows(store: Judgments) -> I64:
    """``int64 (n,)`` sorted rows of the queries with a relevant candidate (label >= the store's
    ``relevance_threshold`` on a real candidate, id >= 0)."""
    labels = np.asarray(store.labels)
    candidates = np.asarray(store.candidates)
    has_rel = ((labels >= store.relevance_threshold) & (candidates >= 0)).any(1)
    return np.nonzero(has_rel)[0].astype(np.int64)


def topic_folds(store: Judgments, n_folds: int, seed: int = 0) -> list[I64]:
    """The held-out query rows of each of ``n_folds`` folds over a store's queries.

    Args:
        store: the split's judgments (``labels`` / ``candidates`` ``(n_queries, K)``,
            ``relevance_threshold``; an ``EmbeddingStore``).
        n_folds: number of folds, 2 <= n_folds <= the number of queries with a relevant
            candidate.
        seed: seed of the permutation (``numpy.random.default_rng``; the config's ``seed``).

    Returns:
        ``n_folds`` sorted ``int64`` row arrays, disjoint, whose union is
        :func:`relevant_rows`; fold ``f`` is ``array_split(permutation, n_folds)[f]``.

    Raises:
        ValueError: ``n_folds`` below 2 or above the number of queries with a relevant
            candidate (the message gives both numbers).
    """
    rows = relevant_rows(store)
    if not 2 <= n_folds <= len(rows):
        raise ValueError(
            f"topic_folds: n_folds={n_folds}: need 2 <= n_folds <= {len(rows)} "
            "(the queries with a relevant candidate)"
        )
    perm = np.random.default_rng(seed).permutation(rows)
    return [np.sort(part) for part in np.array_split(perm, n_folds)]
