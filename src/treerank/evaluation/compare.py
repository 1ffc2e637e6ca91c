"""Run several systems on one store split, evaluate them, test them against a baseline, report.

:func:`compare_systems` is the library entry point behind ``treerank evaluate`` and the pipeline's
evaluation stage. With ``out_dir`` it writes::

    results.json        settings, per-system means / counts / timings, paired tests, McNemar
    per_query.jsonl     one line per (system, query): query id and every metric (null = left out)
    runs/<system>.trec  TREC run files (source ids; a passage that stands for several source ids
                        of identical text is listed as all of them, at consecutive ranks);
                        ``<system>`` is ``treerank.names.file_name(system)``: the name itself
                        when plain (``bm25``), else a slug plus a digest
                        (``rrf_bm25+cosine~<16 hex>``), so two systems never share a file
    plots/deltas.png    each system's difference to the baseline, paired bootstrap 95% CI
    plots/recall_at_k.png  mean Recall@k curves
    table.md            the comparison table, then the departures from the source
    overlap.json        with ``train_store``: metrics on queries with / without a training positive

Every metric is computed on the ranking that the run file holds, against the source's own qrels
when the store keeps them (:meth:`Qrels.from_store`), so ``trec_eval -c`` / ir-measures on
``runs/<system>.trec`` and the source's qrels file give the same per-query values (on the
evaluated queries; queries without a relevant judgment are left out of treerank's means).
What differs from the source is counted in ``results.json`` (``departures``): judgments on
documents absent from the corpus (relevant and never retrieved), duplicate texts merged,
judgments on unknown topics, self-hits dropped.

A system that raises (a bad checkpoint, an index that cannot be built) is recorded in
``failed`` with its error; every other system is still run, evaluated and written.

``ignore_identical_ids=True`` drops, per query, a retrieved document whose id equals the
query's id (BEIR's ``ignore_identical_ids`` for ArguAna / Quora, where queries are also corpus
documents); ``k + 1`` passages are retrieved so that ``k`` remain.

Files an earlier comparison left in ``out_dir`` for systems no longer evaluated (run files, an
``overlap.json``) are removed and listed under ``removed_stale_files`` in ``results.json``, so
the folder never mixes two comparisons. Only files that earlier comparison wrote are removed
(run files named after a system of the ``results.json`` found there, its ``overlap.json``);
any other file is left alone and listed under ``kept_unknown_files``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from treerank.atomic import is_disk_full
from treerank.distributed.context import DistContext
from treerank.evaluation.checks import check_depth, check_evaluable
from treerank.evaluation.overlap import OverlapDoc, overlap_breakdown, seen_positive_mask
from treerank.evaluation.plots import dataset_label, plot_deltas, plot_recall_curve
from treerank.evaluation.provenance import Leak, check_leaks, check_train_store
from treerank.evaluation.report import (
    atomic_write_text,
    markdown_table,
    remove_stale,
    rich_table,
    table_rows,
    write_json,
)
from treerank.evaluation.seeds import SeedSpread, seed_average, seed_spread
from treerank.evaluation.settings import EvaluationSettings
from treerank.evaluation.significance import McNemarResult, PairedTest, compare_paired, mcnemar
from treerank.evaluation.trec_io import write_trec_run
from treerank.families import CHECKPOINTS
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.vectors import I64, Scores
from treerank.lock import writer_lock
from treerank.metrics.metrics import EvalResult, evaluate_run, parse_metric
from treerank.metrics.qrels import Qrels
from treerank.names import file_name
from treerank.search import fusion_tuning
from treerank.search.ce_rescore import check_cross_encoders, cross_encoders
from treerank.search.run import Run
from treerank.search.specs import BuildContext, SystemSpec, build_system, system_uses_trained_model
from treerank.search.systems import CheckpointSystem, System
from treerank.storelike import StoreLike

if TYPE_CHECKING:
    from rich.table import Table

    from treerank.store.view import QuerySubset

RECALL_CURVE_KS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
HIT_METRIC = "success@10"


class QuerySample(TypedDict):
    """``settings["sample"]`` of a comparison on a seeded query sample."""

    queries: int
    seed: int
    of_queries: int
    rule: str


class ComparisonSettings(TypedDict, total=False):
    """What a comparison ran on and with (``results.json``'s ``settings``)."""

    store: str
    split: str
    n_queries: int
    n_passages: int
    encoder: str | None
    k: int
    relevance_threshold: int
    ndcg_gain: str
    n_permutations: int
    seed: int
    candidates: str
    ties: str
    sample: QuerySample
    failed_systems: list[str]
    train_store: str


@dataclass
class Comparison:
    """Everything :func:`compare_systems` measured.

    Attributes:
        runs: system -> its run.
        results: system -> :class:`EvalResult` (requested metrics plus success@10 and the
            Recall@k curve cutoffs).
        evaluation: the settings it ran with (``metrics``, ``baseline``, ``second_baseline``
            and the recall curves are read from it and from ``results``).
        tests: baseline -> system -> metric -> :class:`PairedTest`.
        mcnemar: baseline -> system -> :class:`McNemarResult` on success@10.
        seconds: system -> retrieval wall time.
        files: name -> path written (empty without ``out_dir``).
        failed: system -> error message, for systems that raised (left out of the rest).
        departures: what differs from the source's qrels and corpus (counts), see the module doc.
        doc_runs: system -> the ranking as scored and written: document ids (indices into
            ``doc_ids``), aliases expanded, self-hits dropped.
        doc_ids: source id of each document id (``None``: the store's passage ids).
        overlap: with a train store, :func:`~treerank.evaluation.overlap.overlap_breakdown`.
        removed_stale: files of an earlier comparison removed from ``out_dir``.
        seed_spread: model -> per-seed means, mean and std over seeds
            (:func:`~treerank.evaluation.seeds.seed_spread`) for models given as seed groups.
        trained: the systems that are, or are built on, a trained model
            (:func:`~treerank.search.specs.uses_trained_model`; seed groups of such models
            included): the memorisation caveat concerns only these.
        untrained: the ``ckpt:`` systems whose saved model is its initialisation (training
            early-stopped at step 0, :meth:`CheckpointSystem.kept_initialisation`): they score
            like their starting point (an identity-initialised head: exactly like cosine).
        leaks: ``ckpt:`` system -> :meth:`Leak.to_dict
            <treerank.evaluation.provenance.Leak.to_dict>`, for checkpoints evaluated on the
            split they trained on or on queries they trained on (warned, flagged, not refused).
        trained_on: ``ckpt:`` system -> ``{"store", "split"}`` it trained on (its record).
        cross_encoders: system -> the folder, weights fingerprint and pin of each
            cross-encoder reranker in it (itself, or inside a fusion;
            :meth:`~treerank.search.ce_rescore.CrossEncoderIdentity.to_dict`), for the
            systems that rerank with one.
    """

    runs: dict[str, Run]
    results: dict[str, EvalResult]
    evaluation: EvaluationSettings = field(default_factory=lambda: EvaluationSettings())
    tests: dict[str, dict[str, dict[str, PairedTest]]] = field(default_factory=dict)
    mcnemar: dict[str, dict[str, McNemarResult]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    settings: ComparisonSettings = field(default_factory=lambda: ComparisonSettings())
    failed: dict[str, str] = field(default_factory=dict)
    departures: dict[str, int] = field(default_factory=dict)
    doc_runs: dict[str, Run] = field(default_factory=dict)
    doc_ids: list[str] | None = None
    overlap: OverlapDoc | None = None
    removed_stale: list[str] = field(default_factory=list)
    kept_unknown: list[str] = field(default_factory=list)
    seed_spread: dict[str, SeedSpread] = field(default_factory=dict)
    tuning: dict[str, dict[str, object]] = field(default_factory=dict)
    trained: list[str] = field(default_factory=list)
    untrained: list[str] = field(default_factory=list)
    leaks: dict[str, dict[str, object]] = field(default_factory=dict)
    trained_on: dict[str, dict[str, object]] = field(default_factory=dict)
    cross_encoders: dict[str, list[dict[str, str | None]]] = field(default_factory=dict)

    @property
    def metrics(self) -> tuple[str, ...]:
        """The requested metrics (table columns)."""
        return self.evaluation.metrics

    @property
    def baseline(self) -> str:
        return self.evaluation.baseline

    @property
    def second_baseline(self) -> str | None:
        return self.evaluation.second_baseline

    @property
    def recall_curves(self) -> dict[str, dict[int, float]]:
        """System -> {cutoff: mean Recall@cutoff} at :data:`RECALL_CURVE_KS` up to ``k``."""
        ks = [c for c in RECALL_CURVE_KS if c <= self.evaluation.k]
        return {s: {c: r.mean[f"recall@{c}"] for c in ks} for s, r in self.results.items()}

    def mean(self, system: str, metric: str) -> float:
        return self.results[system].mean[metric]

    def table(self, baseline: str | None = None) -> tuple[list[str], list[list[str]]]:
        """Header and rows (value, delta vs ``baseline``, randomization p) per metric."""
        b = baseline or self.baseline
        means = {s: {m: r.mean[m] for m in self.metrics} for s, r in self.results.items()}
        return table_rows(means, self.tests.get(b, {}), self.metrics, b)

    def markdown(self) -> str:
        out = []
        for b in [self.baseline] + ([self.second_baseline] if self.second_baseline else []):
            if b in self.failed:
                continue
            out.append(f"Against baseline `{b}` (p: paired randomization test; * p < 0.05)\n\n")
            out.append(markdown_table(*self.table(b)))
        for name, err in self.failed.items():
            out.append(f"**{name} failed**: {err}\n")
        for name in self.untrained:
            out.append(f"**{name}**: {untrained_note(name)}\n")
        for leak in self.leaks.values():
            out.append(f"**warning, train/test leak**: {leak['message']}\n")
        if any(self.departures.values()):
            items = ", ".join(
                f"{k.replace('_', ' ')}: {v:,}" for k, v in self.departures.items() if v
            )
            out.append(f"Departures from the source: {items}\n")
        if self.tuning:
            out.append(fusion_tuning.tuning_markdown(self.tuning))
        return "\n".join(out)

    def rich(self, baseline: str | None = None) -> Table:
        b = baseline or self.baseline
        title = f"{self.settings.get('split') or ''}: Δ and p against {b}"
        return rich_table(*self.table(b), title=title)

    def to_dict(self) -> dict[str, object]:
        return {
            "settings": self.settings,
            "metrics": list(self.metrics),
            "baseline": self.baseline,
            "second_baseline": self.second_baseline,
            "systems": {
                s: {
                    "mean": r.mean,
                    "n_evaluated": r.n_evaluated,
                    "n_left_out": r.n_left_out,
                    "seconds": self.seconds.get(s),
                    "recall_curve": {str(k): v for k, v in self.recall_curves.get(s, {}).items()},
                }
                for s, r in self.results.items()
            },
            "tests": {
                b: {s: {m: t.to_dict() for m, t in ts.items()} for s, ts in by_sys.items()}
                for b, by_sys in self.tests.items()
            },
            "mcnemar_hit@10": {
                b: {s: r.to_dict() for s, r in by_sys.items()} for b, by_sys in self.mcnemar.items()
            },
            "failed": self.failed,
            "departures": self.departures,
            "overlap": self.overlap,
            "seed_spread": self.seed_spread,
            "removed_stale_files": self.removed_stale,
            "kept_unknown_files": self.kept_unknown,
            "tuning": self.tuning,
            "trained": self.trained,
            "untrained": self.untrained,
            "leaks": self.leaks,
            "trained_on": self.trained_on,
            "cross_encoders": self.cross_encoders,
        }


def untrained_note(name: str) -> str:
    """The warning printed and written for a system in :attr:`Comparison.untrained`."""
    return (
        f"the saved model of {name} is its untrained initialisation (training ran, but no "
        "held-out check after step 0 beat the initial weights, so early stopping kept them: "
        "best_step 0), so it scores like its starting "
        "point (an identity-initialised head: exactly like cosine); train on more queries or "
        "lower the learning rate"
    )


def _as_systems(
    systems: Mapping[str, System | SystemSpec | str] | Sequence[str], ctx: BuildContext
) -> dict[str, System]:
    if isinstance(systems, Mapping):
        items = list(systems.items())
    elif isinstance(systems, str | bytes):
        raise TypeError(
            f"systems must be a mapping name -> System or spec, or a list of spec strings, not "
            f"{type(systems).__name__} {systems!r}; e.g. compare_systems(store, [{systems!r}])"
        )
    else:
        items = [(s, s) for s in systems]
    out: dict[str, System] = {}
    for name, sys_ in items:
        if name in out:
            raise ValueError(f"system {name!r} given twice")
        out[name] = build_system(sys_, ctx) if isinstance(sys_, str | SystemSpec) else sys_
    return out


def compare_systems(
    store: StoreLike,
    systems: Mapping[str, System | SystemSpec | str] | Sequence[str],
    *,
    settings: EvaluationSettings | None = None,
    out_dir: str | Path | None = None,
    progress: bool = False,
    runs: Mapping[str, Run] | None = None,
    train_store: StoreLike | None = None,
    seed_groups: Mapping[str, Mapping[str, int]] | None = None,
    device: Device = DEFAULT_DEVICE,
    shard: DistContext | None = None,
) -> Comparison:
    """Run, evaluate and compare systems on all passages of one store split.

    Args:
        store: an opened store split (:class:`~treerank.storelike.StoreLike`).
        systems: name -> :class:`System`, spec node or spec string, or a list of spec strings
            (name = spec).
        settings: the :class:`~treerank.evaluation.settings.EvaluationSettings`, the one way to
            give every setting: ``baseline`` (the system every other one is tested against,
            among ``systems``), run depth ``k``, ``metrics``, ``second_baseline``,
            ``n_permutations``, ``seed``, ``gain``, ``relevance_threshold``,
            ``ignore_identical_ids`` (see its fields); default: the defaults.
        out_dir: where to write results (see module docstring); ``None`` writes nothing.
        progress: tqdm bars in dense search.
        runs: precomputed runs by system name (skips retrieval for those).
        train_store: the training split's store: adds the seen / unseen breakdown
            (:mod:`treerank.evaluation.overlap`) against ``baseline``.
        seed_groups: model -> {system name: training seed} for a model trained with several
            seeds: the model is added as a system whose per-query metrics are averaged over
            its seeds (tested like any system; no run file, no McNemar) and its spread over
            seeds is kept in ``seed_spread`` (:mod:`treerank.evaluation.seeds`).
        device: where dense search and a family's own search run.
        shard: under ``torchrun``, the process group (``distributed.context.launch()``): every
            dense system searches this rank's passage shard and merges the top-k across ranks
            (:func:`~treerank.kernels.sharded.sharded_exact_search`; the same runs as one
            process). Every rank must then make the same calls. None: one process.

    Returns:
        The :class:`Comparison`; systems that raised are in ``failed``, not ``results``.

    Raises:
        TypeError: ``systems`` given as one string.
        ValueError: the baseline is not among the systems, a bad spec / metric, ``k`` below 1
            or below a metric's cutoff, or a store that cannot be evaluated (no passages, no
            queries, no relevant judgment; see :mod:`treerank.evaluation.checks`).
        LockHeldError: another process is writing ``out_dir``.
        TrainStoreMismatchError: ``train_store`` shares no passage with ``store`` (another
            collection; :func:`~treerank.evaluation.provenance.check_train_store`).
        CrossEncoderMismatchError: a reranker's ``fingerprint=`` pin does not match its
            cross-encoder's weights (checked before any retrieval; the folder and both
            fingerprints are recorded in ``cross_encoders`` when they agree).

    A ``ckpt:`` system evaluated on the split it trained on, or on queries it trained on (by
    id or by text), is flagged in :attr:`Comparison.leaks` (checked before any retrieval).
    """
    cfg = settings or EvaluationSettings()
    cfg = cfg.with_(metrics=tuple(f"{m}@{c}" for m, c in map(parse_metric, cfg.metrics)))
    check_evaluable(store, cfg.relevance_threshold)
    if cfg.sample_queries is not None:
        store = query_sample(store, cfg.sample_queries, cfg.sample_seed, cfg.relevance_threshold)
    check_depth(cfg.k, cfg.metrics, int(store.n_passages))
    ctx = BuildContext(
        progress=progress, device=device, cache={}, shard=shard, checkpoints=CHECKPOINTS
    )
    built = _as_systems(systems, ctx)  # a ckpt: spec loads through the family table
    for b in cfg.baselines:
        if b not in built:
            raise ValueError(f"baseline {b!r} is not one of the systems: {', '.join(built)}")
    for system in built.values():  # a checkpoint bound to other vectors: refused before work
        check = getattr(system, "check_store", None)
        if callable(check):
            try:
                check(store)
            except (FileNotFoundError, ValueError) as exc:
                from treerank.encoders.precision import PrecisionMixError
                from treerank.models.checkpoint import EncoderMismatchError

                if isinstance(exc, (EncoderMismatchError, PrecisionMixError)):
                    raise
                # an unreadable checkpoint is not a mismatch: it fails alone when it is loaded,
                # and the other systems are still scored (exit 1, `failed` in results.json)
                continue
    check_cross_encoders(built.values())  # a pinned cross-encoder of other weights: refused
    # a writer lock on the output folder; nothing to lock when nothing is written
    lock = writer_lock(out_dir, "evaluate") if out_dir is not None else nullcontext()
    trained = {n for n, s in built.items() if system_uses_trained_model(s)}
    trained |= {m for m, members in (seed_groups or {}).items() if trained & set(members)}
    provenances = {
        n: s.training_provenance() for n, s in built.items() if isinstance(s, CheckpointSystem)
    }
    leaks = check_leaks(store, provenances)  # before any retrieval
    if train_store is not None:
        check_train_store(store, train_store)
    with lock:
        return _compare(
            store,
            built,
            cfg,
            out_dir=None if out_dir is None else Path(out_dir),
            runs=runs,
            train_store=train_store,
            seed_groups=seed_groups,
            trained=trained,
            leaks=leaks,
            provenances=provenances,
        )


def query_sample(store: StoreLike, n: int, seed: int, threshold: int | None = None) -> QuerySubset:
    """A seeded sample of ``n`` of ``store``'s queries that have a relevant passage.

    Rows are ``numpy.random.default_rng(seed).choice(eligible, n, replace=False)``, sorted
    into split order; the view keeps every passage of the split
    (:class:`~treerank.store.view.QuerySubset`), so each system is scored on the same queries
    against the same passages.

    Args:
        store: the split. n: queries wanted (>= 1). seed: the sample's seed.
        threshold: grade counted as relevant (None: the store's).

    Raises:
        ValueError: fewer than ``n`` queries have a relevant passage (both counts named).
    """
    from treerank.store.view import QuerySubset

    thr = int(store.relevance_threshold if threshold is None else threshold)
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    eligible = np.flatnonzero(((cand >= 0) & (lab >= thr)).any(axis=1))
    if n > eligible.size:
        raise ValueError(
            f"{store.path}: --sample-queries {n} asks for more queries "
            f"than the {eligible.size} with a relevant passage (grade >= {thr})"
        )
    rows = np.sort(np.random.default_rng(int(seed)).choice(eligible, size=int(n), replace=False))
    return QuerySubset(store, rows)


def _drop_identical(ids: I64, scores: Scores, self_doc: I64) -> tuple[I64, Scores, int]:
    """Remove, per row, the document ``self_doc[row]``; rows stay left-aligned."""
    hit = (ids == self_doc[:, None]) & (ids >= 0)
    n = int(hit.sum())
    if not n:
        return ids, scores, 0
    order = np.argsort(hit, axis=1, kind="stable")  # kept entries first, in rank order
    ids = np.take_along_axis(np.where(hit, -1, ids), order, axis=1)
    scores = np.take_along_axis(np.where(hit, -np.inf, scores), order, axis=1)
    return ids, scores, n


def _comparison_settings(
    store: StoreLike, cfg: EvaluationSettings, relevance_threshold: int
) -> ComparisonSettings:
    """The ``settings`` block of a comparison's ``results.json``: the split, the search and
    test settings, the candidate and tie rules, and a query sample's rule when there is one."""
    settings: ComparisonSettings = {
        "store": str(store.path),
        "split": store.split,
        "n_queries": int(store.n_queries),
        "n_passages": int(store.n_passages),
        "encoder": store.encoder_name,
        "k": cfg.k,
        "relevance_threshold": relevance_threshold,
        "ndcg_gain": cfg.gain,
        "n_permutations": cfg.n_permutations,
        "seed": cfg.seed,
        "candidates": "all passages of the split",
        "ties": "by ascending passage id",
    }
    if cfg.sample_queries is not None:
        settings["sample"] = {
            "queries": int(store.n_queries),
            "seed": int(cfg.sample_seed),
            "of_queries": int(getattr(store, "base", store).n_queries),
            "rule": "numpy default_rng(seed).choice of the queries with a relevant passage, "
            "without replacement, kept in split order; the same queries for every system",
        }
    return settings


def _self_documents(store: StoreLike, qrels: Qrels) -> I64:
    """``int64 (n_queries,)``: per query, the document whose id equals the query's id (BEIR's
    ``ignore_identical_ids``), -1 where there is none."""
    doc_ids = qrels.doc_ids if qrels.doc_ids is not None else list(store.passage_ids())
    index = {d: i for i, d in enumerate(doc_ids)}
    return np.array([index.get(q, -1) for q in store.query_ids()], np.int64)


def _paired_tests(comp: Comparison, cfg: EvaluationSettings) -> None:
    """Fill ``comp.tests`` (paired randomization test and bootstrap CI per metric) and
    ``comp.mcnemar`` (hit@10; not for seed averages, whose hit is not binary) of every system
    against every baseline that did not fail."""
    n_permutations = cfg.n_permutations
    for b in cfg.baselines:
        if b in comp.failed:
            continue
        base = comp.results[b].per_query
        comp.tests[b] = {}
        comp.mcnemar[b] = {}
        for name, res in comp.results.items():
            if name == b:
                continue
            comp.tests[b][name] = compare_paired(
                res.per_query, base, cfg.metrics, n_permutations, n_permutations, cfg.seed
            )
            if name not in comp.seed_spread:
                comp.mcnemar[b][name] = mcnemar(res.per_query[HIT_METRIC], base[HIT_METRIC])


def _compare(
    store: StoreLike,
    built: dict[str, System],
    cfg: EvaluationSettings,
    *,
    out_dir: Path | None,
    runs: Mapping[str, Run] | None,
    train_store: StoreLike | None,
    seed_groups: Mapping[str, Mapping[str, int]] | None,
    trained: set[str],
    leaks: Sequence[Leak] = (),
    provenances: Mapping[str, Mapping[str, object] | None] | None = None,
) -> Comparison:
    k, metrics, gain, seed = cfg.k, cfg.metrics, cfg.gain, cfg.seed
    n_permutations, ignore_identical_ids = cfg.n_permutations, cfg.ignore_identical_ids
    baseline = cfg.baseline
    qrels = Qrels.from_store(store, cfg.relevance_threshold)
    doc_qrels = replace(qrels, expansion=None)  # scored on rankings expanded here
    curve_ks = tuple(c for c in RECALL_CURVE_KS if c <= k)
    all_metrics = tuple(
        dict.fromkeys(metrics + (HIT_METRIC,) + tuple(f"recall@{c}" for c in curve_ks))
    )
    comp = Comparison(runs={}, results={}, evaluation=cfg)
    comp.settings = _comparison_settings(store, cfg, qrels.relevance_threshold)
    comp.departures = dict(qrels.departures)
    comp.doc_ids = qrels.doc_ids
    self_doc = np.full(qrels.n_queries, -1, np.int64)
    if ignore_identical_ids:
        self_doc = _self_documents(store, qrels)
        comp.departures["self_hits_dropped"] = 0
    depth = k + 1 if ignore_identical_ids else k
    for name, system in built.items():
        try:  # one failing system never takes the others down
            t0 = time.perf_counter()
            run = runs[name] if runs and name in runs else system.retrieve(store, depth)
            comp.seconds[name] = time.perf_counter() - t0
            if getattr(system, "tuning", None):  # tuned fusion: the frozen weight and its curve
                comp.tuning[name] = dict(system.tuning)  # type: ignore[attr-defined]
            run = Run(name, run.ids, run.scores)
            if run.n_queries != qrels.n_queries:
                raise ValueError(
                    f"system {name!r} returned {run.n_queries} rows for {qrels.n_queries} queries"
                )
            ids, scores = qrels.expand(run.ids, run.scores)
            assert scores is not None
            if ignore_identical_ids:
                ids, scores, n = _drop_identical(ids, scores, self_doc)
                comp.departures["self_hits_dropped"] = max(comp.departures["self_hits_dropped"], n)
            res = evaluate_run(ids, doc_qrels, all_metrics, gain=gain)
        except Exception as exc:  # noqa: BLE001 - recorded and reported, see module doc
            if is_disk_full(exc):  # a machine fault, not this system's: stop (exit 3 at the CLI)
                raise
            comp.failed[name] = f"{type(exc).__name__}: {exc}"
            comp.seconds.pop(name, None)
            continue
        comp.runs[name] = run
        comp.doc_runs[name] = Run(name, ids, scores)
        comp.results[name] = res
    comp.settings["failed_systems"] = sorted(comp.failed)
    for model, members in (seed_groups or {}).items():
        if any(s not in comp.results for s in members):  # a seed's system failed
            continue
        comp.results[model] = seed_average([comp.results[s] for s in members])
        comp.seed_spread[model] = seed_spread(comp.results, members, metrics)
    comp.trained = [n for n in comp.results if n in trained]
    ckpts = {n: s for n, s in built.items() if isinstance(s, CheckpointSystem)}
    comp.untrained = [n for n in comp.trained if n in ckpts and ckpts[n].kept_initialisation()]
    comp.cross_encoders = {
        n: [ce.identity().to_dict() for ce in ces]
        for n, s in built.items()
        if n in comp.results and (ces := cross_encoders(s))
    }
    comp.leaks = {x.system: x.to_dict() for x in leaks}
    comp.trained_on = {
        n: {"store": p.get("store"), "split": p.get("split")}
        for n, p in (provenances or {}).items()
        if p
    }
    _paired_tests(comp, cfg)
    if train_store is not None and baseline in comp.results:
        seen = seen_positive_mask(store, train_store)
        per_query = {s: r.per_query for s, r in comp.results.items()}
        comp.overlap = overlap_breakdown(
            per_query, seen, baseline, metrics, n_permutations=n_permutations, seed=seed
        )
        comp.settings["train_store"] = str(getattr(train_store, "path", ""))
    if out_dir is not None:
        _write(comp, store, out_dir)
    return comp


def _earlier_files(out: Path) -> set[Path]:
    """The run files and ``overlap.json`` the comparison whose ``results.json`` is in ``out``
    wrote (empty when there is none or it cannot be read)."""
    import json

    try:
        doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
        systems = list(doc.get("systems") or {})
        overlap = doc.get("overlap") is not None
    except (OSError, ValueError, AttributeError):
        return set()
    files = {out / "runs" / f"{file_name(str(s))}.trec" for s in systems}
    return files | ({out / "overlap.json"} if overlap else set())


def _write(comp: Comparison, store: StoreLike, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_files(out)
    qids = list(store.query_ids())
    pids = comp.doc_ids if comp.doc_ids is not None else list(store.passage_ids())
    for name, run in comp.doc_runs.items():
        comp.files[f"run:{name}"] = write_trec_run(
            out / "runs" / f"{file_name(name)}.trec", run, qids, pids, tag=file_name(name)
        )
    if comp.overlap is not None:
        comp.files["overlap"] = write_json(out / "overlap.json", comp.overlap)
    written = set(comp.files.values())
    candidates = [*(out / "runs").glob("*.trec"), out / "overlap.json"]
    comp.removed_stale = remove_stale(out, [p for p in candidates if p in earlier], written)
    comp.kept_unknown = sorted(
        p.relative_to(out).as_posix()
        for p in candidates
        if p.is_file() and p not in written and p not in earlier
    )

    def lines():  # type: ignore[no-untyped-def]
        import json

        for name, res in comp.results.items():
            cols = {m: res.per_query[m] for m in comp.metrics + (HIT_METRIC,)}
            for i, q in enumerate(qids):
                row: dict[str, object] = {
                    "system": name,
                    "query_id": q,
                    "query_index": i,
                    "evaluated": bool(res.evaluated[i]),
                }
                for m, v in cols.items():
                    row[m] = None if np.isnan(v[i]) else float(v[i])
                yield json.dumps(row) + "\n"

    comp.files["per_query"] = atomic_write_text(out / "per_query.jsonl", lines())
    comp.files["results"] = write_json(out / "results.json", comp.to_dict())
    comp.files["table"] = atomic_write_text(out / "table.md", comp.markdown())
    dataset = dataset_label(comp.settings.get("store"), comp.settings.get("split"))
    tests = {
        s: {m: {"delta": t.delta, "ci_low": t.ci_low, "ci_high": t.ci_high} for m, t in ts.items()}
        for s, ts in comp.tests.get(comp.baseline, {}).items()
    }
    comp.files["plot:deltas"] = plot_deltas(
        tests, comp.metrics, comp.baseline, out / "plots" / "deltas.png", dataset, list(comp.failed)
    )
    comp.files["plot:recall"] = plot_recall_curve(
        comp.recall_curves, out / "plots" / "recall_at_k.png", dataset, int(store.n_passages)
    )
    if comp.tuning:
        comp.files["tuning"] = write_json(out / "tuning.json", comp.tuning)
        comp.files["plot:tuning"] = fusion_tuning.plot_tuning_curves(
            comp.tuning, out / "plots" / "fusion_tuning.png"
        )
