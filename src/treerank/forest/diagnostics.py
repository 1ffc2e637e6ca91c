"""Why a forest wins or loses: per-model collision rates and the correlation of models' votes.

Beside the class-balance statistics (:meth:`treerank.forest.index.ForestSystem.
balance_stats`), for held-out (query, relevant passage) pairs and as many (query, random
passage) pairs:

* **collision rate** per model ``m``: the fraction of pairs whose passage is indexed in one of
  the query's probed classes under ``m`` (with ``t = K = 1``: ``class_m(q) == class_m(p)``). A
  useful model collides far more often on relevant pairs than on random ones; the ratio is its
  **lift** (random pairs collide about ``t K / C`` of the time under balanced classes);
* **vote correlation**: the mean Pearson correlation, over pairs of distinct models, of their
  0/1 collision indicators on the relevant pairs. Models that agree (correlation near 1) add
  little to each other's votes; independent hash functions (LSH) sit near the correlation that
  the pairs' similarity alone induces.

The multi-probe / multi-assignment rules are those of the forest's ``search`` settings, except
that capacity is not applied (each passage is tested against its own top-``K`` classes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treerank.forest.model import Forest


def _passage_top(forest: Forest, x: np.ndarray, kk: int) -> np.ndarray:
    """``int32 (n, M, K)`` each passage's top-K real classes per model, ``-1`` where not
    retrievable."""
    pr = forest.passage_probabilities(x, 0, forest.n_models)  # (M, n, C + 1)
    top = np.argsort(-pr[..., :-1], axis=-1, kind="stable")[..., :kk]  # (M, n, K)
    nr = pr[..., -1] > forest.config.nr_threshold
    top = np.where(nr[..., None], -1, top)
    return np.ascontiguousarray(top.transpose(1, 0, 2)).astype(np.int32)


def collisions(forest: Forest, queries: np.ndarray, passages: np.ndarray) -> np.ndarray:
    """``bool (n, M)``: whether passage row ``i`` is indexed in one of query row ``i``'s probed
    classes under each model (the forest's ``search.probe`` / ``search.assign``).

    Args:
        queries, passages: ``float32 (n, d)`` paired rows.
    """
    sc = forest.search
    qc, _, _ = forest.query_top(queries, min(sc.probe, forest.n_classes))  # (n, M, t)
    pc = _passage_top(forest, passages, min(sc.assign, forest.n_classes))  # (n, M, K)
    return (qc[:, :, :, None] == pc[:, :, None, :]).any(axis=(2, 3))


def vote_correlation(votes: np.ndarray) -> float:
    """Mean Pearson correlation between distinct columns of ``votes (n, M)`` (constant columns
    left out; nan with fewer than two varying columns)."""
    v = np.asarray(votes, dtype=np.float64)
    keep = v.std(axis=0) > 0
    if keep.sum() < 2:
        return float("nan")
    c = np.asarray(np.corrcoef(v[:, keep], rowvar=False), dtype=np.float64).reshape(
        int(keep.sum()), int(keep.sum())
    )
    m = int(keep.sum())
    return float((c.sum() - np.trace(c)) / (m * (m - 1)))


def forest_diagnostics(
    forest: Forest,
    queries: np.ndarray,
    passages: np.ndarray,
    pairs: np.ndarray,
    seed: int = 0,
) -> dict[str, Any]:
    """Collision rates (relevant vs random pairs) and vote correlation of a forest.

    Args:
        forest: the forest (its ``search`` settings apply).
        queries: ``float32 (nq, d)``. passages: ``float32 (n, d)``.
        pairs: ``int (E, 2)`` (query row, relevant passage row), held-out queries.
        seed: seed of the random passages paired with the same queries.

    Returns:
        ``collision_relevant`` / ``collision_random``: per-model lists; their means;
        ``lift_mean`` (mean relevant / mean random); ``vote_correlation_relevant`` /
        ``vote_correlation_random``; ``mean_votes_relevant`` / ``mean_votes_random`` (models
        that collide per pair); ``n_pairs``.

    Raises:
        ValueError: ``pairs`` not of shape ``(E, 2)`` or rows out of range.
    """
    pairs = np.asarray(pairs, dtype=np.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not len(pairs):
        raise ValueError(f"forest diagnostics: pairs must be (E, 2), got {pairs.shape}")
    if pairs[:, 0].max() >= len(queries) or pairs[:, 1].max() >= len(passages) or pairs.min() < 0:
        raise ValueError("forest diagnostics: pair rows out of range")
    rng = np.random.default_rng(seed)
    q = np.asarray(queries, dtype=np.float32)[pairs[:, 0]]
    rel = collisions(forest, q, np.asarray(passages[pairs[:, 1]], dtype=np.float32))
    rnd_rows = rng.integers(0, len(passages), size=len(pairs))
    rnd = collisions(forest, q, np.asarray(passages[rnd_rows], dtype=np.float32))
    cr, cn = rel.mean(axis=0), rnd.mean(axis=0)
    return {
        "n_pairs": int(len(pairs)),
        "collision_relevant": cr.tolist(),
        "collision_random": cn.tolist(),
        "collision_relevant_mean": float(cr.mean()),
        "collision_random_mean": float(cn.mean()),
        "lift_mean": float(cr.mean() / max(cn.mean(), 1e-12)),
        "vote_correlation_relevant": vote_correlation(rel),
        "vote_correlation_random": vote_correlation(rnd),
        "mean_votes_relevant": float(rel.sum(axis=1).mean()),
        "mean_votes_random": float(rnd.sum(axis=1).mean()),
    }
