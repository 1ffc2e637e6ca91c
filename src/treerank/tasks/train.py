"""``train_model``: train a model of any registered family on a store and write its directory.

The one library call behind ``treerank train`` and the ``train:`` stage of ``treerank run``.
This is where the training layer meets evaluation: the held-out validation callback (early
stopping on full-split MRR@10 / nDCG@10 of held-out training queries) is built here from
``treerank.kernels.topk.exact_search`` and ``treerank.metrics.metrics.evaluate_run``, and
handed to the family's trainer, which never imports those layers. The ``mine:``, ``pseudo:``,
``denoise:`` and ``teacher:`` stages call the preparation steps (:func:`ensure_mined_negatives`,
:func:`ensure_pseudo_split`, :func:`ensure_denoised_negatives`, :func:`ensure_teacher_run`)
that ``train_model`` runs first.

The family (``treerank.families``) supplies the config parser, the trainer and whether it
mines hard negatives; ``treerank.training.output.save_trained_model`` writes the directory
(checkpoint + ``training_log.jsonl`` + ``training_curves.png``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treerank.config import ConfigError
from treerank.distributed.context import is_main_process, main_first
from treerank.encoders.precision import vector_precision
from treerank.evaluation.provenance import training_provenance
from treerank.families import CHECKPOINTS, family, family_names
from treerank.faults import crash_point
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.vectors import ROW_CHUNK
from treerank.lock import writer_lock
from treerank.search.systems import SystemHook
from treerank.storelike import StoreLike, Vectors
from treerank.training.data import sample_rows
from treerank.training.denoise import DenoiseJob
from treerank.training.heads import SamplerConfig
from treerank.training.history import TrainingLog
from treerank.training.holdout import (
    HoldoutError,
    ValidationConfig,
    holdout_split,
    passage_groups,
)
from treerank.training.output import save_trained_model

__all__ = [
    "TrainResult",
    "ValidationConfig",
    "ensure_denoised_negatives",
    "ensure_mined_negatives",
    "ensure_pseudo_split",
    "ensure_teacher_run",
    "ensure_teacher_runs",
    "ensure_training_sources",
    "make_validator",
    "open_train_store",
    "train_model",
    "training_accounting",
    "training_sources",
]


@dataclass
class TrainResult:
    """What :func:`train_model` produced.

    Attributes:
        model_type: the trained model's family.
        checkpoint: the checkpoint directory.
        model: the trained model object.
        summary: the trainer's JSON summary (also in the checkpoint's ``extra["training"]``).
        heldout_rows: ``int64`` query ids held out for validation (never trained on).
        log_path / curves_path: training log and PNG inside the checkpoint (None if absent).
    """

    model_type: str
    checkpoint: Path
    model: Any
    summary: dict[str, Any]
    heldout_rows: np.ndarray
    log_path: Path | None = None
    curves_path: Path | None = None


def open_train_store(path: str | Path, split: str = "train", dim: int | None = None) -> Any:
    """Open a store from a split directory, or from a store root holding ``<root>/<split>/``.

    Args:
        dim: the vector dimension, needed only for stores written by the Go ``cmd/embed`` tool
            (no ``meta.json``; 3840 dims).

    Raises:
        FileNotFoundError: neither ``path/meta.json`` nor ``path/<split>/`` exists.
        StoreFormatError: a Go-layout store opened without ``dim`` (the message says so).
    """
    from treerank.store import EmbeddingStore, StoreRootError

    path = Path(path)
    if (path / split).is_dir() and not (path / "queries.bin").exists():
        path = path / split
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: no such store directory (expected a split dir or a root holding {split}/)"
        )
    try:
        return EmbeddingStore.open(path, dim=dim)
    except StoreRootError as exc:  # a root without the wanted split: never suggest another
        raise StoreRootError.missing_split(exc, split) from None


def _subsample_passages(
    store: StoreLike, rows: np.ndarray, max_passages: int | None, seed: int
) -> np.ndarray | None:
    """Passage ids to score for validation: None (all), or every judged passage of the
    held-out queries plus a seeded random remainder, ascending (the DPR lesson's recipe)."""
    n = int(store.n_passages)
    if max_passages is None or n <= max_passages:
        return None
    cand = np.asarray(store.candidates[rows])
    gold = np.unique(cand[cand >= 0])
    rest = np.setdiff1d(np.arange(n), gold)
    n_more = max(0, int(max_passages) - gold.size)
    rng = np.random.default_rng([seed, 7919])
    more = rng.choice(rest, size=min(n_more, rest.size), replace=False)
    return np.sort(np.concatenate([gold, more])).astype(np.int64)


class _Split:
    """The held-out queries and (subsampled) passages of a split as :class:`Vectors`: what a
    family's own retrieval (``SystemHook`` -> ``VectorSystem.retrieve``) reads.

    Args:
        path: the split directory (named in messages).
        queries: ``float32 (nq, dim)``. passages: ``float32 (np, dim)`` (an ndarray or memmap).
    """

    def __init__(self, path: Path, queries: np.ndarray, passages: np.ndarray) -> None:
        self.path = path
        self.meta: dict[str, object] = {}  # no record of its own: nothing is trusted unread
        self.queries, self.passages = queries, passages
        self.n_queries, self.n_passages = len(queries), int(passages.shape[0])
        self.dim = int(passages.shape[1])

    def iter_passage_chunks(self, chunk_size: int = ROW_CHUNK) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, self.n_passages, chunk_size):
            yield start, np.asarray(self.passages[start : start + chunk_size], dtype=np.float32)


def _family_of(model: Any) -> Any:
    """The family entry of a model (None for an object outside the family table)."""
    name = getattr(model, "model_type", None)
    if not isinstance(name, str) or name not in family_names():
        return None
    return family(name)


def make_validator(
    store: StoreLike,
    rows: np.ndarray,
    cfg: ValidationConfig,
    seed: int = 0,
    device: Device = DEFAULT_DEVICE,
) -> Callable[[Any], dict[str, float]]:
    """The held-out callback: rank the split's passages for queries ``rows`` with the model.

    Each call runs ``exact_search(model.encode_queries(Q[rows]), P, k,
    passage_transform=model.encode_passages)`` (a family with its own ``system``, such as the
    forest, retrieves through that system instead) over the full split (or the fixed subsample of
    :func:`_subsample_passages` when the split has more than ``cfg.max_passages`` passages) and
    returns the mean of ``cfg.metrics`` from ``evaluate_run`` against the store's labels.

    Args:
        store: the training store. rows: held-out query ids. cfg: the validation section.
        seed: seed of the passage subsample.
        device: where a family's own system retrieves (its :class:`SystemHook` always gets
            it; the forest's classification and counting). The dense path's exact search stays
            on the CPU.
    """
    from treerank.kernels.topk import exact_search
    from treerank.metrics.metrics import evaluate_run
    from treerank.metrics.qrels import Qrels

    rows = np.asarray(rows, dtype=np.int64)
    queries = np.asarray(store.queries[rows], dtype=np.float32)
    qrels = Qrels(
        np.asarray(store.candidates[rows]),
        np.asarray(store.labels[rows]),
        int(store.relevance_threshold),
    )
    subset = _subsample_passages(store, rows, cfg.max_passages, seed)
    passages = store.passages if subset is None else np.asarray(store.passages[subset])
    metrics = list(cfg.metrics)

    def validate(model: Any) -> dict[str, float]:
        fam = _family_of(model)
        if fam is not None and fam.system is not None:
            # A family with its own retrieval (the forest's inverted lists): searched as it is
            # searched at evaluation time, never through a dense view (one-hot features).
            make: SystemHook = fam.system
            system = make(model, None, device=device)
            split: Vectors = _Split(store.path, queries, passages)
            ids = system.retrieve(split, cfg.k).ids
        else:
            ids, _ = exact_search(
                model.encode_queries(queries),
                passages,
                k=cfg.k,
                passage_transform=model.encode_passages,
            )
        if subset is not None:
            ids = np.where(ids >= 0, subset[np.clip(ids, 0, None)], -1)
        return dict(evaluate_run(ids, qrels, metrics).mean)

    return validate


def ensure_mined_negatives(store: StoreLike, data: Any) -> dict[str, Any] | None:
    """Mine BM25 hard negatives into the store when the sampler will want them.

    The sampler (``data``, a ``treerank.training.heads.SamplerConfig``) uses mined negatives
    when ``hard_negatives`` is ``"mined"``, or ``"auto"`` and no candidate of the split has grade
    0 (BEIR-style sources). Mining is skipped when the sidecar already exists with the same
    settings.

    Returns:
        The sidecar's metadata, or None when no mining was needed.
    """
    from treerank.search.negatives import mine_bm25_negatives

    source = data.hard_negatives
    if int(data.n_hard) <= 0 or source in ("none", "candidates"):
        return None
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    if source == "auto" and bool(np.any((cand >= 0) & (lab == 0))):
        return None
    name = str(data.mined_array)
    mine_bm25_negatives(store, int(data.mine_depth), name=name)
    crash_point("mining", "after-mine")  # the sidecar is written; training has not started
    meta = store.load_array_meta(name) if hasattr(store, "load_array_meta") else None
    return dict(meta or {"array": name})


def ensure_denoised_negatives(
    store: StoreLike, job: DenoiseJob | None, *, scorer: Any = None, progress: bool = True
) -> dict[str, Any] | None:
    """Denoise the mined negatives with a cross-encoder (RocketQA;
    :mod:`treerank.training.denoise`), into the sidecar array ``job.array``.

    Every query with a labelled positive (of the seeded sample, with ``job.max_queries``) has
    its first ``depth`` mined negatives and its positives scored
    (:func:`treerank.diagnostics.false_negatives.score_and_denoise`); the array is ``int32 (nq,
    depth)``, the kept negatives in BM25 order and ``-1`` for dropped ones and for rows not
    scored. Its metadata holds the counts, up to 10 flagged examples, the scorer's weights
    fingerprint and the cost (CPU-s, pairs per CPU-s). An array made by the same weights from
    the same mined array is reused.

    Args:
        store: the training split, with the mined array (:func:`ensure_mined_negatives` first).
        job: a data section's ``denoise_job()`` (a head's ``SamplerConfig``, an encoder
            fine-tune's ``FinetuneData``); None: nothing to do.
        scorer: anything with ``score_pairs`` (and optionally ``fingerprint``) in place of the
            ``ce:<dir>`` folder (tests).
        progress: a progress bar over the scored pairs.

    Returns:
        The array's metadata, or None when ``job`` is None.

    Raises:
        ValueError: the store has no mined array to denoise.
    """
    import time

    from treerank.diagnostics.false_negatives import score_and_denoise

    if job is None:
        return None
    spec, mined_name, name = job.settings, job.mined_array, job.array
    mined = store.load_array(mined_name) if store.has_array(mined_name) else None
    if mined is None:
        raise ValueError(f"{store.path}: no mined array {mined_name!r} to denoise; mine it first")
    mined_meta = store.load_array_meta(mined_name)
    if scorer is None:
        from treerank.models.cross_encoder import CrossEncoderScorer

        scorer = CrossEncoderScorer(spec.path, precision=spec.precision)  # type: ignore[arg-type]
    weights = str(getattr(scorer, "fingerprint", getattr(scorer, "name", "scorer")))
    old = store.load_array_meta(name) if store.has_array(name) else None
    if old and old.get("scorer_fingerprint") == weights and old.get("mined_meta") == mined_meta:
        return dict(old)
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    rows = np.flatnonzero(((cand >= 0) & (lab >= int(store.relevance_threshold))).any(axis=1))
    sample = sample_rows(int(store.n_queries), job.max_queries, job.sample_seed)
    if sample is not None:
        rows = np.intersect1d(rows, sample)
    t0, c0 = time.perf_counter(), time.process_time()
    _, res, n_pairs = score_and_denoise(
        store,
        rows,
        np.asarray(mined)[rows],
        scorer,
        depth=spec.depth,
        threshold=spec.threshold,
        relative_margin=spec.relative_margin,
        progress=progress,
    )
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    out = np.full((int(store.n_queries), spec.depth), -1, dtype=np.int32)
    out[rows] = res.negatives
    qids, pids = store.query_ids(), store.passage_ids()
    meta = {
        "array": name,
        "mined_array": mined_name,
        "mined_meta": mined_meta,
        "denoise": spec.to_dict(),
        "max_queries": job.max_queries,
        "sample_seed": job.sample_seed,
        "scorer_fingerprint": weights,
        "scorer_precision": str(getattr(scorer, "precision", "")),
        "queries": int(rows.size),
        "scorer_pairs": int(n_pairs),
        **{k: v for k, v in res.counts.items() if k != "action"},
        "kept": int((res.negatives >= 0).sum()),
        "examples": [
            {
                "query_id": str(qids[int(rows[e["query"]])]),
                "passage_id": str(pids[e["passage"]]),
                "score": round(e["score"], 4),
                "positive_score": round(e["positive_score"], 4),
            }
            for e in res.examples
        ],
        "cost": {
            "cpu_seconds": round(cpu, 3),
            "wall_seconds": round(wall, 3),
            "pairs_per_cpu_second": round(n_pairs / cpu, 2) if cpu > 0 else None,
        },
    }
    store.save_array(name, out, meta)  # atomic: a killed run leaves no half array
    return meta


def training_sources(data: Any) -> list[Any] | None:
    """The parsed ``data.sources`` of a family's data section (None: it has none)."""
    from treerank.training.data import parse_sources

    # a dense family's data section is a dataclass, the forest's a mapping
    raw = data.get("sources") if isinstance(data, Mapping) else getattr(data, "sources", None)
    return None if raw is None else list(parse_sources(raw))


def ensure_pseudo_split(store: StoreLike, data: Any, *, progress: bool = True) -> Any:
    """Build (once) the pseudo split of each ``pseudo`` entry of ``data.sources``.

    Each lives in ``pseudo_dir(store, spec)`` (beside the split, or under a store view's
    pseudo roots); a finished one is reused, nothing is encoded again.

    Returns:
        ``(pseudo store or None, its path or None)`` of the last entry (the one a teacher with
        ``queries: pseudo`` ranks).
    """
    from treerank.store import EmbeddingStore
    from treerank.training.data import pseudo_dir
    from treerank.training.pseudo import build_pseudo_store

    last: tuple[Any, Path | None] = (None, None)
    for spec in training_sources(data) or []:
        if spec.kind != "pseudo":
            continue
        path = pseudo_dir(store, spec)
        if (path / "meta.json").is_file():
            pseudo = EmbeddingStore.open(path)
        else:
            pseudo, _ = build_pseudo_store(
                store, spec.pseudo_config(), out_dir=path, progress=progress
            )
        if isinstance(store, EmbeddingStore):
            pseudo = store.pseudo_view(pseudo)
        last = (pseudo, path)
    return last


def ensure_teacher_run(store: StoreLike, pseudo: Any, spec: Any, *, progress: bool = True) -> str:
    """Run one ``teacher`` source ``spec`` (any ``--system`` spec) over the queries it names
    (``store``'s, or ``pseudo``'s), top-``k``, into the sidecar arrays ``teacher_array(spec)-ids``
    / ``-scores`` of that store (kept for re-runs: an existing pair is not computed again).

    Returns:
        The path of the ids array.
    """
    from treerank.search.specs import BuildContext, build_system
    from treerank.store import EmbeddingStore
    from treerank.store.view import QuerySubset
    from treerank.training.data import source_rows, teacher_array

    target: Any = pseudo if spec.queries == "pseudo" else store
    stem = teacher_array(spec)
    if not (target.has_array(f"{stem}-ids") and target.has_array(f"{stem}-scores")):
        ctx = BuildContext(progress=progress, checkpoints=CHECKPOINTS)
        system = build_system(str(spec.system), ctx)
        meta: dict[str, Any] = {"system": spec.system, "k": spec.k, "queries": spec.queries}
        sample = source_rows(int(target.n_queries), spec)  # None on pseudo queries
        if sample is None:
            run = system.retrieve(target, spec.k)
            ids, scores = run.ids, run.scores
        else:  # only the sampled rows are ranked; the others read "no teacher result"
            part = system.retrieve(QuerySubset(target, sample), spec.k)
            p_ids, p_scores = part.ids, part.scores
            ids = np.full((int(target.n_queries), p_ids.shape[1]), -1, dtype=p_ids.dtype)
            scores = np.full(ids.shape, np.nan, dtype=p_scores.dtype)
            ids[sample], scores[sample] = p_ids, p_scores
            meta.update(max_queries=spec.max_queries, sample_seed=spec.sample_seed)
        target.save_array(f"{stem}-scores", scores, meta=meta)
        target.save_array(f"{stem}-ids", ids, meta=meta)
    found = target.array_file(f"{stem}-ids") if isinstance(target, EmbeddingStore) else None
    return str(found or f"{target.path}/arrays/{stem}-ids.npy")


def ensure_teacher_runs(
    store: StoreLike, pseudo: Any, data: Any, *, progress: bool = True
) -> dict[str, str]:
    """:func:`ensure_teacher_run` for each ``teacher`` entry of ``data.sources``.

    Returns:
        ``{"teacher:<system>": path of the ids array}``.
    """
    return {
        f"teacher:{spec.system}": ensure_teacher_run(store, pseudo, spec, progress=progress)
        for spec in training_sources(data) or []
        if spec.kind == "teacher"
    }


def ensure_training_sources(
    store: StoreLike, data: Any, *, progress: bool = True
) -> dict[str, Any] | None:
    """Prepare the ``data.sources`` a trainer will read (``treerank.training.data``).

    * ``pseudo``: :func:`ensure_pseudo_split` (embedded once, reused after);
    * ``teacher``: :func:`ensure_teacher_runs` (sidecar arrays, kept for re-runs).

    Returns:
        What was prepared (paths, array names), or None when ``data`` has no sources.
    """
    if training_sources(data) is None:
        return None
    pseudo, path = ensure_pseudo_split(store, data, progress=progress)
    done: dict[str, Any] = {} if path is None else {"pseudo": str(path)}
    done.update(ensure_teacher_runs(store, pseudo, data, progress=progress))
    return done


def training_accounting(
    relevant: np.ndarray,
    has_relevant: np.ndarray,
    train_rows: np.ndarray,
    held: np.ndarray,
    counts: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """What a model trained on: the counts every ``train`` summary, stage record and report
    table gives.

    Args:
        relevant: ``bool (nq, K)`` judged-relevant candidate slots of the training store.
        has_relevant: ``bool (nq,)``. train_rows / held: the holdout's rows.
        counts: :func:`~treerank.training.holdout.holdout_split`'s ``stats``.

    Returns:
        ``{"training_queries": queries trained on that have a relevant passage,
        "positive_pairs": their (query, relevant passage) pairs, "heldout_queries",
        "split_groups": passage-connected groups the holdout split (0: none)}``.
    """
    return {
        "training_queries": int(np.asarray(has_relevant)[train_rows].sum()),
        "positive_pairs": int(np.asarray(relevant)[train_rows].sum()),
        "heldout_queries": int(held.size),
        "split_groups": int((counts or {}).get("split_groups", 0)),
    }


def train_model(
    family_name: str,
    train_store: StoreLike | str | Path,
    config: Mapping[str, Any] | None,
    out_dir: str | Path,
    *,
    progress: bool = True,
    where: str = "config",
    device: Device = DEFAULT_DEVICE,
) -> TrainResult:
    """Train a model of family ``family_name`` on ``train_store`` and write its directory.

    Steps: parse the config with the family's strict parser, hold out ``validation.fraction``
    of the queries (seeded by ``seed``), build the validation callback on them, mine hard
    negatives when the family asks for them, call the family's trainer on the other queries,
    then write the directory (checkpoint bound to the store's encoder fingerprint, training log,
    curves) with :func:`~treerank.training.output.save_trained_model`.

    Args:
        family_name: a registered family (``treerank.families``) with a trainer.
        train_store: an ``EmbeddingStore`` or a path (split directory or store root with
            ``train/``).
        config: the family's config mapping (``seed`` + ``model / data / trainer /
            validation`` sections).
        out_dir: the model directory (replaced atomically).
        progress: progress bars.
        where: names the config in error messages (``"<file>"`` or ``"<file>: models.<name>"``).
        device: where the family's trainer runs; every trainer takes it
            (:class:`~treerank.training.trainer.TrainFunction`).

    Under ``torchrun`` every rank trains (data-parallel, ``treerank.distributed.training``) and
    only rank 0 takes the writer lock and writes the directory.

    Raises:
        KeyError: unknown or untrainable family. ConfigError: bad config. FileNotFoundError:
            no store.
    """
    kw: dict[str, Any] = {"progress": progress, "where": where, "device": device}
    if not is_main_process():
        return _train_model(family_name, train_store, config, out_dir, **kw)
    with writer_lock(out_dir, "train"):
        return _train_model(family_name, train_store, config, out_dir, **kw)


def _train_model(
    family_name: str,
    train_store: StoreLike | str | Path,
    config: Mapping[str, Any] | None,
    out_dir: str | Path,
    *,
    progress: bool = True,
    where: str = "config",
    device: Device = DEFAULT_DEVICE,
) -> TrainResult:
    """:func:`train_model` without the writer lock."""
    fam = family(family_name)
    fn = fam.train_function()
    cfg = fam.parse_config(dict(config or {}), where)
    store: StoreLike = (
        open_train_store(train_store) if isinstance(train_store, str | Path) else train_store
    )
    vcfg: ValidationConfig = cfg.validation
    seed = int(cfg.seed)
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    has_rel = np.asarray(((cand >= 0) & (lab >= int(store.relevance_threshold))).any(axis=1))
    groups = (
        passage_groups(cand, lab, int(store.relevance_threshold)) if vcfg.group_by_passage else None
    )
    counts: dict[str, int] = {}
    try:
        train_rows, held = holdout_split(
            has_rel, vcfg.fraction, seed, vcfg.max_queries, groups, stats=counts
        )
    except HoldoutError as exc:
        raise ConfigError(f"{where}: validation: {exc}") from None
    rel = (cand >= 0) & (lab >= int(store.relevance_threshold))
    if isinstance(cfg.data, SamplerConfig):  # data.max_queries: a seeded sample is trained on
        sample = sample_rows(int(store.n_queries), cfg.data.max_queries, cfg.data.sample_seed)
        train_rows = train_rows if sample is None else np.intersect1d(train_rows, sample)
    accounting = training_accounting(rel, has_rel, train_rows, held, counts)
    validate = make_validator(store, held, vcfg, seed, device) if held.size else None
    with main_first():  # under torchrun rank 0 mines / writes sidecars, the others read them
        mined = ensure_mined_negatives(store, cfg.data) if fam.mines_negatives else None
        denoised = (
            ensure_denoised_negatives(store, cfg.data.denoise_job(), progress=progress)
            if fam.mines_negatives
            else None
        )
        sources = ensure_training_sources(store, cfg.data, progress=progress)
    main = is_main_process()

    log = TrainingLog()
    out = fn(
        store,
        cfg,
        train_rows=train_rows,
        validate=validate,
        log=log,
        progress=progress and main,
        device=device,
    )
    summary = dict(out.summary)
    if mined is not None:
        summary["mined_negatives"] = mined
    if denoised is not None:
        summary["denoised_negatives"] = denoised
    if sources is not None:
        summary["training_sources"] = sources
    summary["validation"] = {**asdict(vcfg), "heldout_queries": int(held.size)}
    summary.update(accounting)
    if not main:  # data-parallel training (torchrun): rank 0 writes the model
        return TrainResult(family_name, Path(out_dir), out.model, summary, held)
    from treerank.models.export_st import encoding_contract

    ckpt_dir, log_path, curves = save_trained_model(
        out_dir,
        out.model,
        encoder_name=store.encoder_name or "",
        encoder_fingerprint=store.encoder_fingerprint or "",
        encoder_precision=vector_precision(store),
        summary=summary,
        records=out.records or log.records,
        extra={
            "train_store": str(getattr(store, "path", "")),
            "heldout_query_rows": held.tolist(),
            # how the store's texts were encoded: what an export must reproduce (export_st)
            "encoding": encoding_contract(dict(getattr(store, "meta", None) or {})),
            "train_provenance": training_provenance(store),
        },
        curves_hook=fam.curves,
        title=f"{family_name}, seed {seed}, trained on {getattr(store, 'path', '')}",
    )
    return TrainResult(family_name, ckpt_dir, out.model, summary, held, log_path, curves)
