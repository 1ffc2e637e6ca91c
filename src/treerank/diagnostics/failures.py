"""Per-query failure analysis between any two systems (step 3 of the DRT seed's diagnostics).

Given the per-query values of one metric for system A and system B on the same queries
(``EvalResult.per_query[metric]``, NaN for queries left out), this computes ``delta = A - B``,
picks the top-N wins (largest positive deltas) and losses (most negative), and profiles wins,
losses and all queries by length bucket and query type, with example queries. Nothing here knows
about DRT: any two runs (or any two arrays) can be compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from treerank.diagnostics.labels import length_bucket


def per_query_delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``float64 (nq,)`` ``a - b``, NaN where either side is NaN (a query left out).

    Raises:
        ValueError: different shapes or not 1-D.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"per-query arrays must be equal-length 1-D, got {a.shape} and {b.shape}")
    return a - b


def _profile(
    idx: np.ndarray, groups: Sequence[str], delta: np.ndarray
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if idx.size == 0:
        return out
    counts = Counter(groups[i] for i in idx)
    for g in sorted(counts):
        members = np.array([i for i in idx if groups[i] == g], dtype=np.int64)
        out[g] = {
            "n": int(counts[g]),
            "share": counts[g] / idx.size,
            "mean_delta": float(np.mean(delta[members])),
        }
    return out


def failure_analysis(
    a: np.ndarray,
    b: np.ndarray,
    query_texts: Sequence[str],
    *,
    query_types: Sequence[str] | None = None,
    query_ids: Sequence[str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    top_n: int = 10,
    n_examples: int = 5,
    name_a: str = "A",
    name_b: str = "B",
    metric: str = "",
    tol: float = 1e-12,
) -> dict[str, Any]:
    """Wins, losses and ties of system A over B on one metric, profiled by length and type.

    Args:
        a, b: ``float (nq,)`` per-query metric values of A and B on the same queries (NaN = left
            out; such queries are ignored).
        query_texts: ``nq`` query texts (for length buckets and examples).
        query_types: optional ``nq`` type labels (e.g. MS MARCO ``query_type`` or
            :func:`~treerank.diagnostics.labels.factoid_type`); absent -> profiled by length only.
        query_ids: optional source ids shown in the examples.
        groups: more per-query labellings to profile by, name -> ``nq`` labels (e.g.
            ``{"entity": [...]}``).
        top_n: how many wins and losses to profile (the largest ``|delta|`` each way).
        n_examples: example queries listed for each of wins and losses.
        tol: ``|delta| <= tol`` counts as a tie.

    Returns:
        A JSON-serialisable dict: ``summary`` (n, wins, losses, ties, mean delta, means of A and
        B), ``top_wins`` / ``top_losses`` (``{"profile": {"length": ..., "type": ...},
        "examples": [...]}``), ``all`` (the same profiles over every evaluated query, the
        reference distribution), and ``delta`` (the per-query array, NaN kept).
    """
    delta = per_query_delta(a, b)
    nq = delta.shape[0]
    if len(query_texts) != nq:
        raise ValueError(f"{len(query_texts)} query texts for {nq} per-query values")
    if query_types is not None and len(query_types) != nq:
        raise ValueError(f"{len(query_types)} query types for {nq} per-query values")
    extra = {k: list(v) for k, v in (groups or {}).items()}
    for k, v in extra.items():
        if len(v) != nq:
            raise ValueError(f"{len(v)} {k!r} labels for {nq} per-query values")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    valid = np.flatnonzero(~np.isnan(delta))
    lengths = [length_bucket(t) for t in query_texts]
    types = list(query_types) if query_types is not None else None

    d = delta[valid]
    # Stable sorts: ties in delta keep query-id order, so the selection is deterministic.
    order_win = valid[np.argsort(-d, kind="stable")]
    order_loss = valid[np.argsort(d, kind="stable")]
    wins_idx = np.array([i for i in order_win if delta[i] > tol][:top_n], dtype=np.int64)
    loss_idx = np.array([i for i in order_loss if delta[i] < -tol][:top_n], dtype=np.int64)

    def block(idx: np.ndarray) -> dict[str, Any]:
        prof: dict[str, Any] = {"length": _profile(idx, lengths, delta)}
        if types is not None:
            prof["type"] = _profile(idx, types, delta)
        for k, v in extra.items():
            prof[k] = _profile(idx, v, delta)
        examples = [
            {
                "query_index": int(i),
                **({"query_id": str(query_ids[i])} if query_ids is not None else {}),
                "query": query_texts[i],
                name_a: float(a[i]),
                name_b: float(b[i]),
                "delta": float(delta[i]),
                "length": lengths[i],
                **({"type": types[i]} if types is not None else {}),
            }
            for i in idx[:n_examples]
        ]
        return {"n": int(idx.size), "profile": prof, "examples": examples}

    n_wins = int(np.sum(d > tol))
    n_losses = int(np.sum(d < -tol))
    return {
        "metric": metric,
        "system_a": name_a,
        "system_b": name_b,
        "summary": {
            "n_evaluated": int(valid.size),
            "n_left_out": int(nq - valid.size),
            "wins": n_wins,
            "losses": n_losses,
            "ties": int(valid.size - n_wins - n_losses),
            "mean_delta": float(np.mean(d)) if d.size else float("nan"),
            f"mean_{name_a}": float(np.mean(a[valid])) if d.size else float("nan"),
            f"mean_{name_b}": float(np.mean(b[valid])) if d.size else float("nan"),
        },
        "top_wins": block(wins_idx),
        "top_losses": block(loss_idx),
        "all": block(valid)["profile"],
        "delta": [None if np.isnan(x) else float(x) for x in delta],
    }
