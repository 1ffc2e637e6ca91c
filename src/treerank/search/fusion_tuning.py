"""Tuned and query-adaptive fusion: the fusion weight is chosen on training queries, then frozen.

Equal-weight fusion can lose to its stronger component (SQuAD dev: RRF 0.807 < BM25 0.822);
picking the weight by looking at the evaluation split is optimistic. Here the weight is chosen on
**another split's queries** (``on=train`` by default: the sibling directory of the evaluated
store, ``ROOT/train`` for ``ROOT/test``) and never on the split being evaluated; asking to tune
on the evaluated split is an error.

Two system kinds (named in the static table :data:`treerank.search.systems.SYSTEM_KINDS`, built
on first use; this module is in the search layer: it needs only the pure metric layer):

``tuned-fusion:<A>+<B>[:method=linear,norm=zscore,...]``
    one global weight ``w`` of ``A`` (``1 - w`` of ``B``): the grid value with the best mean
    ``metric`` on the tuning queries (ties: the weight closest to 0.5, then the smaller).
    ``method=linear`` is :func:`~treerank.search.fusion.linear_fusion` (``norm`` = minmax or
    zscore); ``method=rrf`` is weighted RRF.
``adaptive-fusion:<A>+<B>[:...]``
    one weight per query. A ridge regression (scikit-learn ``RidgeCV``, features standardised)
    learns, on the tuning queries, each query's metric at every grid weight from the query's
    vector and both runs' score statistics (:func:`query_features`); a query's weight is the
    grid value with the best predicted metric. With uninformative features the prediction is the
    mean curve, i.e. the tuned global weight.

``on=cv`` serves splits without a training split (TREC DL): the evaluated queries are cut into 5
seeded folds and each fold's weight (or adaptive model) is chosen on the other four, so no
query's weight is ever chosen with its own judgments (cross-fitting); ``tuning`` then lists the
fold weights, ``curve`` is the pooled curve and ``tuned_metric`` the cross-fitted mean.

Tuning queries (``queries=``): ``heldout`` (default) = the training queries a trainer holds out
for early stopping with the default validation settings (:func:`~treerank.training.holdout.
holdout_split`, fraction 0.2, ``seed``, at most 2,000), so a component trained on that split is
tuned on queries it never trained on; ``all`` = every query with a relevant passage, at most
``max_queries`` drawn with ``seed``.

Parameters: ``method`` (linear|rrf), ``norm`` (minmax|zscore), ``k`` (RRF k, 60), ``on`` (split),
``queries`` (heldout|all), ``metric`` (ndcg@10), ``grid`` (number of weights in [0, 1], 11),
``max_queries`` (2000), ``seed`` (0), ``depth`` (1000). After ``retrieve`` the system's
``tuning`` dict holds the chosen weight, the tuning curve and (adaptive) the weight histogram
and a 5-fold cross-validated comparison with the global weight on the tuning queries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from treerank.kernels.topk import RUN_DEPTH
from treerank.metrics.metrics import evaluate_run, parse_metric
from treerank.metrics.qrels import Qrels
from treerank.search.fusion import (
    DEFAULT_RRF_K,
    NORMALISATIONS,
    FusionMethod,
    Normalisation,
    linear_fusion,
    rrf,
)
from treerank.search.run import Run
from treerank.search.systems import System
from treerank.store.view import QuerySubset
from treerank.storelike import StoreLike

FUSION_METHODS: tuple[FusionMethod, ...] = ("linear", "rrf")
"""The methods a tuned fusion tunes (the order of its messages)."""
QuerySet = Literal["heldout", "all"]
"""The queries the weight is tuned on: the train split's held-out part, or all of them."""
QUERY_SETS: tuple[QuerySet, ...] = get_args(QuerySet)
DEFAULT_GRID = 11
DEFAULT_MAX_QUERIES = 2000
CROSS_FIT = "cv"
CV_FOLDS = 5
HELDOUT_FRACTION = 0.2  # the trainers' default validation fraction (training.holdout)


def tuning_rows(
    store: StoreLike, queries: str, max_queries: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``store``'s tuning queries (see module docstring) and ``bool (nq,)`` has-relevant.

    Raises:
        ValueError: unknown ``queries``, or no query of the split has a relevant passage.
    """
    from treerank.training.holdout import holdout_split

    has_rel = Qrels.from_store(store).n_relevant() > 0
    if not has_rel.any():
        raise ValueError(f"{store.path}: no query has a relevant passage")
    if queries == "heldout":
        _, rows = holdout_split(has_rel, HELDOUT_FRACTION, seed, DEFAULT_MAX_QUERIES)
        if rows.size == 0:
            rows = np.flatnonzero(has_rel)
        return rows[:max_queries], has_rel
    if queries == "all":
        rows = np.flatnonzero(has_rel)
        if rows.size > max_queries:
            rows = np.sort(np.random.default_rng(seed).choice(rows, max_queries, replace=False))
        return rows, has_rel
    raise ValueError(f"unknown tuning query set {queries!r}; known: {', '.join(QUERY_SETS)}")


def fuse(
    a: Run, b: Run, weight: float | np.ndarray, method: str, norm: str, rrf_k: int, k: int
) -> Run:
    """Weighted fusion of two runs: ``method`` ``"linear"`` (with ``norm``) or ``"rrf"``."""
    if method == "rrf":
        return rrf(a, b, k=k, rrf_k=rrf_k, weight=weight)
    return linear_fusion(a, b, k=k, weight=weight, norm=norm)


def fusion_curve(
    a: Run,
    b: Run,
    qrels: Qrels,
    weights: np.ndarray,
    method: str = "linear",
    norm: str = "zscore",
    rrf_k: int = DEFAULT_RRF_K,
    metric: str = "ndcg@10",
) -> np.ndarray:
    """``float64 (n_queries, n_weights)`` per-query ``metric`` of the fused run at each weight
    (NaN for queries without a relevant passage)."""
    name = "{}@{}".format(*parse_metric(metric))
    cut = parse_metric(metric)[1]
    out = np.empty((a.n_queries, len(weights)))
    for j, w in enumerate(weights):
        f = fuse(a, b, float(w), method, norm, rrf_k, max(cut, 1))
        out[:, j] = evaluate_run(f, qrels, [name]).per_query[name]
    return out


def select_weight(weights: np.ndarray, means: np.ndarray) -> int:
    """Index of the best mean; ties (within 1e-12) go to the weight closest to 0.5, then the
    smaller weight."""
    best = np.nanmax(means)
    tied = np.flatnonzero(means >= best - 1e-12)
    return int(min(tied, key=lambda j: (abs(weights[j] - 0.5), weights[j])))


def _run_stats(run: Run) -> np.ndarray:
    """``float64 (nq, 6)``: log(1 + #retrieved), top-1 score, top1 - top2, top1 - top10,
    mean and std of the top-10 scores (0 where missing)."""
    v = (run.ids >= 0) & np.isfinite(run.scores)
    s = np.where(v, run.scores.astype(np.float64), np.nan)[:, :10]
    n = v.sum(axis=1)
    s10 = np.pad(s, ((0, 0), (0, max(0, 10 - s.shape[1]))), constant_values=np.nan)
    with np.errstate(invalid="ignore"):
        feats = np.stack(
            [
                np.log1p(n),
                s10[:, 0],
                s10[:, 0] - s10[:, 1],
                s10[:, 0] - s10[:, 9],
                np.nanmean(s10, axis=1) if s10.size else np.zeros(len(s10)),
                np.nanstd(s10, axis=1) if s10.size else np.zeros(len(s10)),
            ],
            axis=1,
        )
    return np.nan_to_num(feats, nan=0.0, posinf=0.0, neginf=0.0)


def query_features(query_vectors: np.ndarray, a: Run, b: Run) -> np.ndarray:
    """``float64 (nq, dim + 13)`` features of query-adaptive fusion: the L2-normalised query
    vector, both runs' score statistics (:func:`_run_stats`) and the overlap of their top-10s
    (Jaccard)."""
    q = np.asarray(query_vectors, dtype=np.float64)
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    ta, tb = a.ids[:, :10], b.ids[:, :10]
    jac = np.zeros(len(q))
    for i in range(len(q)):
        sa, sb = set(ta[i][ta[i] >= 0].tolist()), set(tb[i][tb[i] >= 0].tolist())
        jac[i] = len(sa & sb) / max(len(sa | sb), 1)
    return np.concatenate([q, _run_stats(a), _run_stats(b), jac[:, None]], axis=1)


@dataclass
class AdaptiveWeightModel:
    """Ridge regression from query features to the per-query metric curve over the grid.

    ``fit(X, Y)`` with ``X float (n, f)`` features and ``Y float (n, G)`` per-query metric at
    each grid weight; ``weights(X)`` -> ``float (m,)`` the grid weight with the best predicted
    metric per query (ties: the weight closest to 0.5)."""

    grid: np.ndarray
    alphas: tuple[float, ...] = tuple(float(a) for a in np.logspace(-1, 4, 11))
    model: Any = None

    def fit(self, x: np.ndarray, y: np.ndarray) -> AdaptiveWeightModel:
        from sklearn.linear_model import RidgeCV
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        self.model = make_pipeline(StandardScaler(), RidgeCV(alphas=self.alphas))
        self.model.fit(x, y)
        return self

    @property
    def alpha(self) -> float:
        return float(self.model[-1].alpha_)

    def weights(self, x: np.ndarray) -> np.ndarray:
        pred = np.atleast_2d(self.model.predict(x))
        return np.array([self.grid[select_weight(self.grid, row)] for row in pred])


CV_MIN_TRAIN = 2  # tuning queries a fold's global weight / adaptive model is fitted on, at least


def cross_validate(
    x: np.ndarray, y: np.ndarray, grid: np.ndarray, folds: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Mean metric on held-out folds of the tuning queries: the global weight picked on the other
    folds vs the adaptive model fitted on them.

    Args:
        x: ``float (n, f)`` query features. y: ``float (n, G)`` per-query metric at each grid
            weight. grid: ``float (G,)`` weights, ascending. folds: number of folds (>= 1).

    Returns:
        ``{"global": float, "adaptive": float, "folds": int, "n_queries": int}``, the means over
        the ``n_queries`` queries whose fold could be fitted (a fold needs
        :data:`CV_MIN_TRAIN` other queries); when no fold could be (fewer than
        ``CV_MIN_TRAIN + 1`` tuning queries) ``{"status": "not enough queries", "folds": int,
        "n_queries": 0, "tuning_queries": n, "needed": CV_MIN_TRAIN + 1}`` and no numbers:
        never a mean over unset memory.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    glob, adap = np.full(len(x), np.nan), np.full(len(x), np.nan)
    scored = np.zeros(len(x), dtype=bool)
    for f in range(folds):
        te = order[f::folds]
        tr = np.setdiff1d(order, te)
        if tr.size < CV_MIN_TRAIN or te.size == 0:
            continue
        j = select_weight(grid, np.nanmean(y[tr], axis=0))
        glob[te] = y[te, j]
        w = AdaptiveWeightModel(grid).fit(x[tr], y[tr]).weights(x[te])
        adap[te] = y[te, np.searchsorted(grid, w)]
        scored[te] = True
    if not scored.any():
        return {
            "status": "not enough queries",
            "folds": folds,
            "n_queries": 0,
            "tuning_queries": len(x),
            "needed": CV_MIN_TRAIN + 1,
        }
    return {
        "global": float(np.mean(glob[scored])),
        "adaptive": float(np.mean(adap[scored])),
        "folds": folds,
        "n_queries": int(scored.sum()),
    }


class TunedFusionSystem:
    """Fusion whose weight is tuned on another split's queries (see module docstring)."""

    def __init__(
        self,
        a: System,
        b: System,
        *,
        adaptive: bool = False,
        method: FusionMethod = "linear",
        norm: Normalisation = "zscore",
        rrf_k: int = DEFAULT_RRF_K,
        on: str = "train",
        queries: QuerySet = "heldout",
        metric: str = "ndcg@10",
        grid: int = DEFAULT_GRID,
        max_queries: int = DEFAULT_MAX_QUERIES,
        seed: int = 0,
        depth: int = 1000,
        name: str | None = None,
        open_store: Callable[[Path], Any] | None = None,
    ) -> None:
        if method not in FUSION_METHODS:
            known = ", ".join(FUSION_METHODS)
            raise ValueError(f"unknown fusion method {method!r}; known: {known}")
        if norm not in NORMALISATIONS:
            raise ValueError(f"unknown normalisation {norm!r}; known: {', '.join(NORMALISATIONS)}")
        if queries not in QUERY_SETS:
            known = ", ".join(QUERY_SETS)
            raise ValueError(f"unknown tuning query set {queries!r}; known: {known}")
        if grid < 2:
            raise ValueError(f"the weight grid needs at least 2 points, got {grid}")
        parse_metric(metric)
        self.a, self.b = a, b
        self.adaptive, self.method, self.norm, self.rrf_k = adaptive, method, norm, rrf_k
        self.on, self.queries, self.metric, self.seed = on, queries, metric, seed
        self.grid = np.round(np.linspace(0.0, 1.0, grid), 6)  # 0.7, not 0.7000000000000001
        self.max_queries, self.depth = max_queries, depth
        kind = "adaptive-fusion" if adaptive else "tuned-fusion"
        self.name = name or f"{kind}:{a.name}+{b.name}"
        self._open = open_store
        self.tuning: dict[str, Any] = {}
        self._fitted: tuple[str, float, AdaptiveWeightModel | None] | None = None

    def tuning_store(self, store: StoreLike) -> Any:
        """The store of split ``on`` beside ``store`` (``ROOT/<on>`` for ``ROOT/<split>``).

        Raises:
            ValueError: it is the evaluated split itself.
            FileNotFoundError: no such split.
        """
        here = Path(str(store.path)).absolute()  # not resolved: a split may be a symlink (sweeps)
        there = here.parent / self.on
        if there.resolve() == here.resolve() or store.split == self.on:
            raise ValueError(
                f"{self.name}: tuning split {self.on!r} is the evaluated split ({here}); "
                "the fusion weight must be chosen on other queries (on=<another split>)"
            )
        if not (there / "meta.json").is_file():
            raise FileNotFoundError(
                f"{self.name}: no tuning split {self.on!r} beside {here} (looked for {there}); "
                "name one with on=<split>"
            )
        if self._open is not None:
            return self._open(there)
        from treerank.store import EmbeddingStore

        return EmbeddingStore.open(there)

    def cross_fit(self, store: StoreLike, ra: Run, rb: Run) -> np.ndarray:
        """``on=cv``: ``float (n_queries,)`` weights, each query's chosen on the other
        ``CV_FOLDS`` folds of the evaluated split (seeded), never on the query itself."""
        qrels = Qrels.from_store(store)
        y = fusion_curve(ra, rb, qrels, self.grid, self.method, self.norm, self.rrf_k, self.metric)
        ok = ~np.isnan(y).any(axis=1)
        fold = np.empty(store.n_queries, np.int64)
        fold[np.random.default_rng(self.seed).permutation(store.n_queries)] = (
            np.arange(store.n_queries) % CV_FOLDS
        )
        x = query_features(np.asarray(store.queries), ra, rb) if self.adaptive else None
        weight = np.empty(store.n_queries)
        fold_w = []
        for f in range(CV_FOLDS):
            tr, te = ok & (fold != f), fold == f
            if not tr.any():
                raise ValueError(
                    f"{self.name}: fold {f} has no other query with a relevant passage"
                )
            j = select_weight(self.grid, np.nanmean(y[tr], axis=0))
            fold_w.append(float(self.grid[j]))
            weight[te] = self.grid[j]
            if x is not None and te.any():
                weight[te] = AdaptiveWeightModel(self.grid).fit(x[tr], y[tr]).weights(x[te])
        means = np.nanmean(y[ok], axis=0)
        got = y[ok, np.searchsorted(self.grid, weight[ok])]
        self.tuning = {
            "kind": "adaptive-fusion" if self.adaptive else "tuned-fusion",
            "method": self.method,
            "norm": self.norm if self.method == "linear" else None,
            "tuned_on": {
                "split": CROSS_FIT,
                "queries": f"{CV_FOLDS}-fold cross-fitting on the evaluated split",
                "n_queries": int(ok.sum()),
                "seed": self.seed,
            },
            "metric": self.metric,
            "weight_of": self.a.name,
            "curve": {f"{w:.2f}": float(m) for w, m in zip(self.grid, means, strict=True)},
            "fold_weights": [round(w, 6) for w in fold_w],
            "weight": float(np.median(fold_w)),
            "tuned_metric": float(np.mean(got)),
        }
        return weight

    def fit(self, tune_store: StoreLike) -> None:
        """Choose the weight (and fit the adaptive model) on ``tune_store``'s tuning queries."""
        key = str(getattr(tune_store, "path", id(tune_store)))
        if self._fitted is not None and self._fitted[0] == key:
            return
        rows, _ = tuning_rows(tune_store, self.queries, self.max_queries, self.seed)
        sub = QuerySubset(tune_store, rows)
        d = max(self.depth, 10)
        ra, rb = self.a.retrieve(sub, d), self.b.retrieve(sub, d)
        qrels = Qrels.from_store(sub)
        y = fusion_curve(ra, rb, qrels, self.grid, self.method, self.norm, self.rrf_k, self.metric)
        means = np.nanmean(y, axis=0)
        j = select_weight(self.grid, means)
        self.tuning = {
            "kind": "adaptive-fusion" if self.adaptive else "tuned-fusion",
            "method": self.method,
            "norm": self.norm if self.method == "linear" else None,
            "tuned_on": {
                "split": self.on,
                "store": str(getattr(tune_store, "path", "")),
                "queries": self.queries,
                "n_queries": int(rows.size),
                "seed": self.seed,
            },
            "metric": self.metric,
            "weight_of": self.a.name,
            "curve": {f"{w:.2f}": float(m) for w, m in zip(self.grid, means, strict=True)},
            "weight": float(self.grid[j]),
            "tuned_metric": float(means[j]),
        }
        model = None
        if self.adaptive:
            ok = ~np.isnan(y).any(axis=1)
            x = query_features(sub.queries, ra, rb)
            model = AdaptiveWeightModel(self.grid).fit(x[ok], y[ok])
            self.tuning["ridge_alpha"] = model.alpha
            self.tuning["cv_on_tuning_queries"] = cross_validate(
                x[ok], y[ok], self.grid, seed=self.seed
            )
        self._fitted = (key, float(self.grid[j]), model)

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        d = max(k, self.depth)
        weight: float | np.ndarray
        if self.on == CROSS_FIT:
            ra, rb = self.a.retrieve(store, d), self.b.retrieve(store, d)
            weight = self.cross_fit(store, ra, rb)
        else:
            self.fit(self.tuning_store(store))
            assert self._fitted is not None
            _, w, model = self._fitted
            ra, rb = self.a.retrieve(store, d), self.b.retrieve(store, d)
            weight = w
            if model is not None:
                weight = model.weights(query_features(np.asarray(store.queries), ra, rb))
        if self.adaptive:
            hist = np.histogram(weight, bins=len(self.grid), range=(-0.05, 1.05))[0]
            self.tuning["eval_weights"] = {
                "mean": float(np.mean(weight)),
                "histogram": {f"{g:.2f}": int(c) for g, c in zip(self.grid, hist, strict=True)},
            }
        run = fuse(ra, rb, weight, self.method, self.norm, self.rrf_k, k)
        return Run(self.name, run.ids, run.scores)


def tuning_markdown(tuning: dict[str, dict[str, Any]]) -> str:
    """A markdown section: per tuned system, the frozen weight, where it was tuned, the curve."""
    if not tuning:
        return ""
    lines = [
        "Fusion weights chosen on other queries, then frozen (w weighs the first system; "
        "never tuned on the evaluated split)\n",
        "| system | tuned on | w | tuning metric at w | curve (w: metric) | adaptive |",
        "|---|---|---:|---:|---|---|",
    ]
    for name, t in tuning.items():
        on = t.get("tuned_on", {})
        curve = ", ".join(f"{w}: {m:.4f}" for w, m in t.get("curve", {}).items())
        extra = ""
        if t.get("kind") == "adaptive-fusion":
            cv = t.get("cv_on_tuning_queries", {})
            ew = t.get("eval_weights", {})
            if "adaptive" in cv:
                cv_text = f"adaptive {cv['adaptive']:.4f} vs global {cv['global']:.4f}"
            else:
                cv_text = (
                    f"not enough queries ({cv.get('tuning_queries', 0)}, needs "
                    f"{cv.get('needed', CV_MIN_TRAIN + 1)})"
                )
            extra = (
                f"per-query w, mean {ew.get('mean', float('nan')):.2f}; "
                f"{cv.get('folds', CV_FOLDS)}-fold CV on tuning queries: {cv_text}"
            )
        lines.append(
            f"| {name} | {on.get('split')} ({on.get('queries')}, {on.get('n_queries')} q) | "
            f"{t.get('weight', float('nan')):.2f} | {t.get('tuned_metric', float('nan')):.4f} "
            f"{t.get('metric', '')} | {curve} | {extra} |"
        )
    return "\n".join(lines) + "\n"


def plot_tuning_curves(tuning: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """PNG: each tuned system's tuning metric against the weight, the chosen weight marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from treerank.atomic import atomic_savefig

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, t in tuning.items():
        ws = [float(w) for w in t["curve"]]
        ax.plot(ws, list(t["curve"].values()), marker="o", label=name)
        ax.axvline(t["weight"], ls=":", color=ax.lines[-1].get_color())
    ax.set_xlabel("weight of the first system")
    metric = next(iter(tuning.values())).get("metric", "")
    ax.set_ylabel(f"mean {metric} on the tuning queries")
    ax.set_title("fusion weight tuning (dotted: chosen)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)
