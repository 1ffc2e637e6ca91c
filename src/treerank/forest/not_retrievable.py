"""What a forest's not-retrievable outcome costs in recall and saves in index size, on one split.

The TreeRank seed lets each passage model leave a passage out of its index ("not retrievable").
:func:`not_retrievable_stats` compares a trained forest with the same forest at
``nr_threshold = 1.0`` (the outcome switched off) on a split whose queries were not trained on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treerank.forest.index import ForestIndex
from treerank.forest.model import Forest
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.storelike import StoreLike

__all__ = ["not_retrievable_stats"]


def not_retrievable_stats(forest: Forest, store: StoreLike, k: int = 100) -> dict[str, Any]:
    """What the not-retrievable outcome costs and saves on a split (its queries held out).

    The forest is compared with itself at ``nr_threshold = 1.0`` (every passage indexed under its
    argmax real class), on the split's queries and judgments.

    Args:
        forest: a trained forest.
        store: an ``EmbeddingStore`` split (queries, passages, ``candidates`` / ``labels``).
        k: depth of the recall comparison.

    Returns:
        ``not_indexed_fraction``: per model (list of M), fraction of passages left out;
        ``recall_lost``: per model, of the (query, relevant passage) pairs the model would match
        without the outcome, the fraction it loses; ``recall_at_k`` / ``recall_at_k_without``:
        mean Recall@k of the forest with and without the outcome; ``index_bytes`` /
        ``index_bytes_without`` and ``index_saved_fraction``.
    """
    passages = np.asarray(store.passages, dtype=np.float32)
    queries = np.asarray(store.queries, dtype=np.float32)
    pc, pp = forest.passage_classes(passages)
    pc0, pp0 = forest.with_nr_threshold(1.0).passage_classes(passages)
    qc, qp = forest.query_classes(queries)
    cand = np.asarray(store.candidates)
    rel = (np.asarray(store.labels) >= store.relevance_threshold) & (cand >= 0)
    rq, rc = np.nonzero(rel)
    rp = cand[rq, rc].astype(np.int64)
    matched = qc[rq] == pc0[rp]  # (pairs, M) meetings without the outcome
    lost = matched & (pc[rp] < 0)
    with_nr, without = (
        ForestIndex.build(pc, pp, forest.n_classes),
        ForestIndex.build(pc0, pp0, forest.n_classes),
    )
    metric = f"recall@{k}"
    qrels = Qrels.from_store(store)
    r_with = evaluate_run(with_nr.search(qc, qp, k).ids, qrels, [metric]).mean[metric]
    r_without = evaluate_run(without.search(qc, qp, k).ids, qrels, [metric]).mean[metric]
    return {
        "not_indexed_fraction": (pc < 0).mean(axis=0).tolist(),
        "recall_lost": (lost.sum(0) / np.maximum(matched.sum(0), 1)).tolist(),
        "recall_at_k": r_with,
        "recall_at_k_without": r_without,
        "k": k,
        "index_bytes": with_nr.nbytes,
        "index_bytes_without": without.nbytes,
        "index_saved_fraction": 1.0 - with_nr.nbytes / max(1, without.nbytes),
    }
