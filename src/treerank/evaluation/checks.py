"""Refuse evaluations that cannot give a meaningful number, in the user's terms.

Metrics are undefined on a split without passages, without queries, or whose judgments match
none of its passages; and a metric with a cutoff deeper than the run depth would silently
equal the metric at the run depth (Recall@1000 of a top-5 run is Recall@5). These checks run
before any retrieval, so the message names the store and the setting, not a search kernel's
internals. Unlabelled stores stay valid for label-free training and serving: only evaluation
refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from treerank.kernels.topk import DEPTH_SETTING, check_run_depth
from treerank.metrics.metrics import parse_metric
from treerank.storelike import Judgments


def too_deep(k: int, metrics: Sequence[str], n_passages: int | None = None) -> list[str]:
    """The metrics whose cutoff a top-``k`` run cannot serve.

    A run of depth ``k >= n_passages`` ranks every passage, so any cutoff is exact on it.
    """
    if n_passages is not None and k >= n_passages:
        return []
    return [m for m in metrics if parse_metric(m)[1] > k]


def check_depth(k: int, metrics: Sequence[str], n_passages: int | None = None) -> None:
    """Refuse a run depth below 1 or below any metric's cutoff.

    Args:
        k: run depth (passages retrieved per query).
        metrics: metric names such as ``"recall@1000"``.
        n_passages: passages in the split; a depth that covers them all serves every cutoff.

    Raises:
        ValueError: ``k < 1``, or a metric whose cutoff exceeds ``k`` (every such metric named).
    """
    check_run_depth(k)
    deep = too_deep(k, metrics, n_passages)
    if deep:
        need = max(parse_metric(m)[1] for m in deep)
        raise ValueError(
            f"{', '.join(deep)} cannot be measured on a top-{k} run ({DEPTH_SETTING} is {k}); "
            f"raise k to at least {need} or drop {'that metric' if len(deep) == 1 else 'them'}"
        )


def check_evaluable(store: Judgments, relevance_threshold: int | None = None) -> None:
    """Refuse a store split on which every metric would be undefined.

    Args:
        store: an opened store split (``n_queries``, ``n_passages``, ``candidates``, ``labels``,
            ``relevance_threshold``, ``path``).
        relevance_threshold: the grade counted as relevant (default: the store's).

    Raises:
        ValueError: the split has no passages, no queries, or no judged relevant passage
            (the message names the store directory).
    """
    where = f"store {store.path or '(in memory)'}"
    if int(store.n_passages) == 0:
        raise ValueError(
            f"{where} has no passages, so there is nothing to rank: the corpus it was embedded "
            "from was empty or every document's text was empty"
        )
    if int(store.n_queries) == 0:
        raise ValueError(f"{where} has no queries, so there is nothing to evaluate")
    thr = int(store.relevance_threshold if relevance_threshold is None else relevance_threshold)
    cands = np.asarray(store.candidates)
    labels = np.asarray(store.labels)
    if not bool(((cands >= 0) & (labels >= thr)).any()):
        raise ValueError(
            f"{where}: none of its {int(store.n_queries):,} queries has a relevant passage "
            f"(grade >= {thr}) among its {int(store.n_passages):,} passages, so every metric "
            "is undefined; its judgments match no passage of the split, or it has none. An "
            "unlabelled store serves search and label-free training, not evaluation"
        )
