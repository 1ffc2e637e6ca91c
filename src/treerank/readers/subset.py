"""Cut a split down for quick runs: the first queries, and a capped corpus."""

from __future__ import annotations

import numpy as np

from treerank.readers.split import RetrievalSplit


def subset_split(
    split: RetrievalSplit, limit: int | None = None, max_passages: int | None = None
) -> RetrievalSplit:
    """Keep the first ``limit`` queries and at most ``max_passages`` passages.

    The passage cap keeps every candidate passage of the kept queries (so labels stay exact)
    plus the first other passages in id order until ``max_passages`` passages are kept (more
    when the kept queries' candidates alone exceed it). Passage ids are renumbered in their
    original order; aliases of dropped passages are dropped; the source qrels keep the kept queries'
    judgments. Without ``max_passages`` the
    corpus is kept whole (evaluation is against all passages of the split).

    Raises:
        ValueError: a negative ``limit`` or ``max_passages``.
    """
    if (limit is not None and limit < 0) or (max_passages is not None and max_passages < 0):
        raise ValueError("limit and max_passages must be >= 0")
    nq = split.n_queries if limit is None else min(limit, split.n_queries)
    cands = split.candidates[:nq]
    labels = split.labels[:nq]
    keep = np.ones(split.n_passages, dtype=bool)
    if max_passages is not None and max_passages < split.n_passages:
        keep[:] = False
        used = np.unique(cands[cands >= 0])
        keep[used] = True
        room = max_passages - len(used)
        if room > 0:
            others = np.flatnonzero(~keep)[:room]
            keep[others] = True
    if nq == split.n_queries and keep.all():
        return split
    new_id = np.full(split.n_passages, -1, dtype=np.int64)
    kept = np.flatnonzero(keep)
    new_id[kept] = np.arange(len(kept))
    new_cands = np.where(cands >= 0, new_id[np.maximum(cands, 0)], -1).astype(np.int32)
    width = max(1, int((new_cands >= 0).sum(axis=1).max(initial=0)))
    # candidate slots stay in place; trim trailing all-padding columns only for judged sources
    if split.source not in ("msmarco",):
        new_cands, labels = new_cands[:, :width], labels[:, :width]
    kept_queries = set(split.query_ids[:nq])
    out = RetrievalSplit(
        name=split.name,
        source=split.source,
        query_ids=split.query_ids[:nq],
        query_texts=split.query_texts[:nq],
        passage_ids=[split.passage_ids[i] for i in kept],
        passage_texts=[split.passage_texts[i] for i in kept],
        candidates=np.ascontiguousarray(new_cands),
        labels=np.ascontiguousarray(labels),
        relevance_threshold=split.relevance_threshold,
        query_types=None if split.query_types is None else split.query_types[:nq],
        passage_aliases={s: int(new_id[p]) for s, p in split.passage_aliases.items() if keep[p]},
        qrels=None if split.qrels is None else [j for j in split.qrels if j[0] in kept_queries],
        meta={
            **split.meta,
            "limit": limit,
            "max_passages": max_passages,
            "n_queries_before_subset": split.n_queries,
            "n_passages_before_subset": split.n_passages,
        },
    )
    out.validate()
    return out
