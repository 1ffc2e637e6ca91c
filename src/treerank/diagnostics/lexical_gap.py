"""Lexical-gap diagnostic: how much of a query's vocabulary its relevant passages share.

For each query ``q`` with query terms ``T(q)`` (distinct BM25 tokens: lower-cased, English
stopwords removed, Snowball-stemmed, exactly as :mod:`treerank.search.bm25` indexes passages) and
relevant passages ``R(q)`` (grade ``>=`` the split's relevance threshold)::

    coverage(q) = mean_{p in R(q)}  sum_{t in T(q) & p} idf(t) / sum_{t in T(q)} idf(t)

with Lucene's ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))`` over the split's ``N``
passages (a query term found in no passage has ``df = 0``: the largest idf, never covered).
Coverage 1 means every relevant passage holds every query term (BM25's home ground); 0 means no
relevant passage shares a term with the query (only a dense model can find them). Queries with no
term left after stopword removal, or without a relevant passage, have no coverage (NaN) and are
counted apart.

The report buckets queries by coverage (``[0, .25)``, ``[.25, .5)``, ``[.5, .75)``, ``[.75, 1)``,
``1``) and gives each system's mean metric (nDCG@10 by default) per bucket beside the histogram:
where the dense side beats BM25 and where it loses (the DPR lesson's "which queries each side
wins"). The per-bucket means come from the same per-query values as the headline table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from treerank.metrics.qrels import Qrels
from treerank.search.bm25 import BM25Index, BM25Params
from treerank.storelike import StoreLike

EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)
FULL = "1"


def lucene_idf(df: np.ndarray, n_passages: int) -> np.ndarray:
    """``float64`` Lucene BM25 idf ``ln(1 + (N - df + 0.5) / (df + 0.5))`` per term."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n_passages - df + 0.5) / (df + 0.5))


def idf_coverage(
    query_terms: Sequence[Sequence[str]],
    passage_terms: Sequence[set[str]],
    df: Mapping[str, int],
    n_passages: int,
    relevant: Sequence[Sequence[int]],
) -> np.ndarray:
    """``float64 (n_queries,)`` coverage of each query (see module docstring; NaN if undefined).

    Args:
        query_terms: each query's tokens (repeats ignored).
        passage_terms: each passage's set of tokens.
        df: token -> number of passages containing it (absent = 0).
        n_passages: ``N``, the number of passages of the split.
        relevant: each query's relevant passage ids; ids outside ``[0, len(passage_terms))``
            (judged passages absent from the corpus, which ``Qrels`` keys past the last
            passage) have no text and are skipped.
    """
    out = np.full(len(query_terms), np.nan)
    n_known = len(passage_terms)
    for i, (terms, rel_all) in enumerate(zip(query_terms, relevant, strict=True)):
        rel = [p for p in rel_all if 0 <= p < n_known]
        uniq = sorted(set(terms))
        if not uniq or not len(rel):
            continue
        idf = lucene_idf(np.array([df.get(t, 0) for t in uniq]), n_passages)
        total = idf.sum()
        covered = [
            sum(w for t, w in zip(uniq, idf, strict=True) if t in passage_terms[p]) for p in rel
        ]
        out[i] = float(np.mean(covered) / total)
    return out


def store_coverage(store: StoreLike, params: BM25Params | None = None) -> np.ndarray:
    """:func:`idf_coverage` of every query of a store split (BM25's tokenisation of its texts)."""
    index = BM25Index(store.passage_texts(), params)
    vocab = index.model.vocab_dict
    words = [""] * len(vocab)
    for w, j in vocab.items():
        words[j] = w
    passage_terms = [{words[t] for t in doc} for doc in index.corpus_token_ids]
    df: dict[str, int] = {}
    for terms in passage_terms:
        for t in terms:
            df[t] = df.get(t, 0) + 1
    qrels = Qrels.from_store(store)
    keys, grades = qrels.index()
    keep = grades >= qrels.relevance_threshold
    rel: list[list[int]] = [[] for _ in range(qrels.n_queries)]
    for key in keys[keep]:
        rel[int(key >> 32)].append(int(key & 0xFFFFFFFF))
    return idf_coverage(
        index.query_tokens(store.query_texts()), passage_terms, df, index.n_passages, rel
    )


def bucket_labels() -> list[str]:
    return [f"[{lo:.2f}, {hi:.2f})" for lo, hi in zip(EDGES[:-1], EDGES[1:], strict=True)] + [FULL]


def bucket_of(coverage: np.ndarray) -> np.ndarray:
    """``int64 (n,)`` bucket index per query (``len(EDGES) - 1`` = full coverage; -1 = NaN)."""
    c = np.asarray(coverage, dtype=np.float64)
    b = np.clip(np.searchsorted(np.asarray(EDGES), c, side="right") - 1, 0, len(EDGES) - 2)
    b = np.where(c >= 1.0 - 1e-9, len(EDGES) - 1, b)
    return np.where(np.isnan(c), -1, b).astype(np.int64)


def lexical_gap(
    coverage: np.ndarray,
    per_query: Mapping[str, Mapping[str, np.ndarray]],
    metric: str = "ndcg@10",
) -> dict[str, Any]:
    """Histogram of coverage and each system's mean ``metric`` per coverage bucket.

    Args:
        coverage: ``float64 (n_queries,)`` from :func:`store_coverage`.
        per_query: system -> metric -> ``float64 (n_queries,)`` (NaN = not evaluated).
        metric: the metric to break down.

    Returns:
        ``{"metric", "n_no_coverage", "mean_coverage", "buckets": [{"bucket", "n", "systems":
        {system: mean or None}}], "coverage": [...]}`` (queries evaluated for ``metric`` only).
    """
    b = bucket_of(coverage)
    labels = bucket_labels()
    systems = list(per_query)
    evaluated = (
        ~np.isnan(np.asarray(per_query[systems[0]][metric]))
        if systems
        else np.ones(len(b), dtype=bool)
    )
    buckets = []
    for j, label in enumerate(labels):
        m = (b == j) & evaluated
        row: dict[str, Any] = {"bucket": label, "n": int(m.sum()), "systems": {}}
        for s in systems:
            v = np.asarray(per_query[s][metric])[m]
            row["systems"][s] = float(np.nanmean(v)) if m.any() else None
        buckets.append(row)
    valid = ~np.isnan(coverage) & evaluated
    return {
        "metric": metric,
        "definition": "mean over relevant passages of the share of the query terms' idf mass "
        "they contain",
        "n_queries": int(evaluated.sum()),
        "n_no_coverage": int((np.isnan(coverage) & evaluated).sum()),
        "mean_coverage": float(coverage[valid].mean()) if valid.any() else None,
        "buckets": buckets,
        "coverage": [None if np.isnan(c) else round(float(c), 6) for c in coverage],
    }


def lexical_gap_markdown(doc: Mapping[str, Any]) -> str:
    """The per-bucket table: queries per coverage bucket and each system's mean metric."""
    systems = list(doc["buckets"][0]["systems"]) if doc["buckets"] else []
    head = ["idf coverage", "queries"] + systems
    lines = [
        f"Lexical gap: share of each query's idf mass found in its relevant passages "
        f"(mean over them); mean {doc['metric']} per bucket; {doc['n_no_coverage']} evaluated "
        "queries have no query term left after stopwords and are not bucketed\n",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    for row in doc["buckets"]:
        vals = ["-" if row["systems"][s] is None else f"{row['systems'][s]:.4f}" for s in systems]
        lines.append(f"| {row['bucket']} | {row['n']} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def plot_lexical_gap(doc: Mapping[str, Any], path: str | Path) -> Path:
    """PNG: coverage histogram (bars, left axis) and per-bucket mean metric per system (lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from treerank.atomic import atomic_savefig

    labels = [r["bucket"] for r in doc["buckets"]]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(x, [r["n"] for r in doc["buckets"]], color="0.85", label="queries")
    ax.set_ylabel("queries")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: no 1.5 queries
    ax.set_xticks(x, labels)
    ax.set_xlabel("idf coverage of the query terms in its relevant passages")
    ax2 = ax.twinx()
    systems = list(doc["buckets"][0]["systems"]) if doc["buckets"] else []
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D", "v", "x"]
    for i, s in enumerate(systems):
        ys = [np.nan if r["systems"][s] is None else r["systems"][s] for r in doc["buckets"]]
        # identical lines (a head that equals cosine) stay visible: each system has its own
        # dash and marker, drawn smaller on top of the earlier ones
        ax2.plot(
            x,
            ys,
            ls=styles[i % len(styles)],
            marker=markers[i % len(markers)],
            ms=max(8 - 1.5 * i, 3),
            lw=max(2.5 - 0.4 * i, 1),
            label=s,
        )
    ax2.set_ylabel(f"mean {doc['metric']}")
    ax2.set_ylim(0, 1)
    handles = ax.get_legend_handles_labels()
    lines = ax2.get_legend_handles_labels()
    # one legend outside the axes: it can never cover a bar or a line
    ax2.legend(
        handles[0] + lines[0],
        handles[1] + lines[1],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.12, 1),
        borderaxespad=0,
    )
    ax.set_title("lexical gap: where each system wins")
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)
