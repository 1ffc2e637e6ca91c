"""``treerank finetune`` end to end: train the encoder, re-embed the store, evaluate honestly.

:func:`run_finetune` reads a store root (``train`` and the evaluation split, embedded by
``treerank embed`` with the encoder to tune), and writes into ``out_dir``:

* ``checkpoints/``, ``model/``, ``finetune.json``: the training run
  (:func:`treerank.training.finetune.finetune`);
* ``stores/<split>/``: **re-embedded stores**, one per split, written by
  :func:`treerank.store.embed.embed_split` with the tuned encoder (:func:`reembed_split`).
  Their ``meta.json`` has a ``finetune`` record naming the parent store, the checkpoint and the
  tuned weights' fingerprint; the store's ``encoder.fingerprint`` *is* the tuned one, so its
  signature and every key built from it change with the checkpoint, and ``search`` / ``serve``
  pin the tuned encoder (``encoder.name`` is the tuned model's folder). For ``query-tower``
  and ``drt-query-tower`` only the queries are re-encoded: the passage vectors are the
  parent's, byte for byte (the model was trained against them), and re-embedding over a store
  with other passage vectors is refused naming both;
* ``eval/``: ``compare_systems`` on the evaluation split, the tuned encoder against frozen
  cosine, paired tests, the seen / unseen breakdown against the train split (``drt-e2e`` and
  ``drt-query-tower``: the trained heads ``ckpt:RUN/drt_head`` over the re-embedded store, and
  cosine over the same tuned vectors as ``finetune-<family>-cosine``);
* ``results.json``: the headline numbers, the drift diagnostics (linear CKA and
  neighbour overlap between frozen and tuned vectors of the same items) and the cost (CPU
  seconds, wall seconds, peak RSS, tokens) of every part.

The ``cross-encoder`` family (:func:`run_cross_encoder_finetune`) trains a reranker instead:
``checkpoints/``, ``model/``, ``cross_encoder.json`` and a ``results.json`` with its training
cost (CPU seconds, pairs per CPU second, peak RSS); nothing is re-embedded, and its reranking
is evaluated with the system spec ``rescore:<first stage>:depth=N,scorer=ce:OUT/model``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from treerank.atomic import atomic_write_json
from treerank.distributed.context import current, main_first
from treerank.encoders.batching import DEFAULT_TOKEN_BUDGET
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import RUN_DEPTH
from treerank.readers.split import RetrievalSplit
from treerank.store.embed import embed_split
from treerank.store.embedding_store import EmbeddingStore
from treerank.storelike import StoreLike
from treerank.tasks.train import ensure_denoised_negatives, ensure_teacher_run
from treerank.training.data import SourceSpec
from treerank.training.finetune import (
    DRT_HEAD_DIR,
    FINETUNE_JSON,
    EncoderStoreMismatchError,
    FinetuneOutput,
    check_data_parallel,
    finetune,
)
from treerank.training.finetune_config import CE_FAMILY, QUERY_ONLY_FAMILIES, FinetuneConfig

if TYPE_CHECKING:
    from treerank.evaluation.compare import Comparison

__all__ = [
    "RESULTS_JSON",
    "TunedStoreSystem",
    "paired_summary",
    "finetune_rows",
    "reembed_split",
    "run_cross_encoder_finetune",
    "run_finetune",
    "split_of_store",
]

RESULTS_JSON = "results.json"
STORES_DIR = "stores"


def split_of_store(store: EmbeddingStore) -> RetrievalSplit:
    """The :class:`RetrievalSplit` a store was embedded from (texts, ids, tables, qrels), so
    that it can be embedded again with another encoder; its digest equals the store's
    ``data_sha256``."""
    src_meta = store.meta.get("source_meta") or {}
    return RetrievalSplit(
        name=store.split,
        source=str(store.source or ""),
        query_ids=list(store.query_ids()),
        query_texts=list(store.query_texts()),
        passage_ids=list(store.passage_ids()),
        passage_texts=list(store.passage_texts()),
        candidates=np.array(store.candidates, dtype=np.int32),
        labels=np.array(store.labels, dtype=np.uint8),
        relevance_threshold=int(store.relevance_threshold),
        query_types=store.query_types(),
        passage_aliases=dict(store.passage_aliases()),
        qrels=store.source_qrels(),
        meta=dict(src_meta),
    )


def reembed_split(
    run_dir: str | Path,
    parent: EmbeddingStore,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = False,
    device: Device = DEFAULT_DEVICE,
) -> EmbeddingStore:
    """Embed ``parent``'s split again with the tuned encoder of ``run_dir``.

    Args:
        run_dir: a :func:`~treerank.training.finetune.finetune` output folder.
        parent: the store split to re-embed (same data; for the query towers, the passage vectors
            the model was trained against, or the same encoder's vectors of another split).
        out_dir: the new split folder.
        device: torch device of the tuned encoder.

    Returns:
        The new store split, opened.

    Raises:
        EncoderStoreMismatchError: a query tower over a store whose passage vectors come
            from another encoder than the one it was trained against (both named).
        StoreExistsError: ``out_dir`` holds a store (and not ``overwrite``).
    """
    from treerank.encoders import SentenceEncoder
    from treerank.encoders.sentence import BatchResult

    run = Path(run_dir)
    info = json.loads((run / FINETUNE_JSON).read_text(encoding="utf-8"))
    family = info["config"]["family"]
    trained_on = info["trained_on"]
    query_only = family in QUERY_ONLY_FAMILIES
    if query_only and parent.encoder_fingerprint != trained_on["fingerprint"]:
        raise EncoderStoreMismatchError(
            f"{run}: the query tower was trained against passage vectors of "
            f"{trained_on['store']} ({str(trained_on['fingerprint'])[:19]}...), but store "
            f"{parent.path} holds vectors of {str(parent.encoder_fingerprint)[:19]}...: "
            "re-embed a store of the same encoder"
        )
    enc_meta = parent.meta.get("encoder", {}) or {}
    encoder = SentenceEncoder(
        run / "model",
        name=str((run / "model").resolve()),
        query_prompt=enc_meta.get("query_prompt"),
        passage_prompt=enc_meta.get("passage_prompt"),
        max_seq_length=enc_meta.get("max_seq_length"),
        token_budget=int(enc_meta.get("token_budget", DEFAULT_TOKEN_BUDGET)),
        max_batch_size=int(enc_meta.get("max_batch_size", 256)),
        max_padding=float(enc_meta.get("max_padding", 0.1)),
        progress=False,
        device=device,
    )
    if encoder.fingerprint != info["fingerprint"]:
        raise EncoderStoreMismatchError(
            f"{run / 'model'}: weights {encoder.fingerprint[:19]}... differ from the run's "
            f"record {str(info['fingerprint'])[:19]}... in {run / FINETUNE_JSON}"
        )
    split = split_of_store(parent)
    passages = np.asarray(parent.passages)

    def frozen_passages(kind: str, b_i: int, idx: np.ndarray) -> BatchResult:
        if kind == "query":
            return encoder.encode_batch([split.query_texts[i] for i in idx], "query")
        return BatchResult(np.array(passages[idx], dtype=np.float32), 0, 0)

    embed_split(
        split,
        encoder,
        out_dir,
        overwrite=overwrite,
        # biencoder: passages already re-encoded into a sibling split (same tuned weights)
        # are copied (SciFact's train and test share one corpus); the query tower has its own
        reuse=not query_only,
        progress=progress,
        batch_source=frozen_passages if query_only else None,
    )
    out = Path(out_dir)
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    meta["finetune"] = {
        "family": family,
        "run": str(run.resolve()),
        "checkpoint": info["checkpoint"],
        "fingerprint": info["fingerprint"],
        "base_fingerprint": info["base_fingerprint"],
        "parent": {
            "store": str(Path(parent.path).resolve()),
            "fingerprint": parent.encoder_fingerprint,
            "data_sha256": parent.meta.get("data_sha256"),
        },
        "passage_vectors": (
            "copied from the parent store (the frozen passage tower)"
            if query_only
            else "encoded by the tuned encoder"
        ),
    }
    atomic_write_json(out / "meta.json", meta)
    return EmbeddingStore.open(out)


class TunedStoreSystem:
    """Frozen-store evaluation of a re-embedded store: ``inner`` (a system spec, default
    cosine; ``ckpt:RUN/drt_head`` for the DRT families) over ``tuned``'s vectors, for the queries
    of the store it is asked about, which must hold the same data.

    Raises (from :meth:`retrieve`):
        EncoderStoreMismatchError: the evaluated store holds other data than ``tuned`` (both
            named): a model trained on one store is not evaluated on another's rows.
    """

    def __init__(self, tuned: StoreLike, name: str = "finetune", inner: str = "cosine") -> None:
        from treerank.search.specs import build_system

        self.tuned = tuned
        self.name = name
        self._cosine = build_system(inner)

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Any:
        want = store.meta.get("data_sha256")
        have = self.tuned.meta.get("data_sha256")
        if want is None or want != have:
            raise EncoderStoreMismatchError(
                f"{self.name}: re-embedded store {self.tuned.path} holds data {str(have)[:19]}..., "
                f"but the evaluated store {store.path} holds {str(want)[:19]}..."
            )
        run = self._cosine.retrieve(self.tuned, k)
        run.name = self.name
        return run


def paired_summary(tests: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``metric -> {"delta", "p", "ci_low", "ci_high"}`` of a comparison's paired tests
    (:class:`~treerank.evaluation.significance.PairedTest` by metric): what ``results.json``
    keeps of them."""
    return {
        m: {
            "delta": float(t.delta),
            "p": float(t.p_randomization),
            "ci_low": float(t.ci_low),
            "ci_high": float(t.ci_high),
        }
        for m, t in tests.items()
    }


def finetune_rows(train: StoreLike, cfg: FinetuneConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(train rows, held-out rows)``: ``int64`` query ids of ``train`` a fine-tune trains on
    and the ones its ``validation`` section holds out (seeded by ``seed``; whole passage
    groups with ``group_by_passage``)."""
    from treerank.training.holdout import holdout_split, passage_groups
    from treerank.training.sampler import relevant_lists

    rel, _ = relevant_lists(train.candidates, train.labels, int(train.relevance_threshold))
    val = cfg.train.validation
    groups = (
        passage_groups(train.candidates, train.labels, int(train.relevance_threshold))
        if val.group_by_passage
        else None
    )
    return holdout_split(
        np.asarray((rel >= 0).any(axis=1)), val.fraction, cfg.train.seed, val.max_queries, groups
    )


def cost_clock() -> tuple[float, float]:
    """``(CPU seconds of this process, user + system; wall clock seconds)`` now: the start of
    a :func:`cost_since` measurement."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, time.perf_counter()


def cost_since(start: tuple[float, float]) -> dict[str, float]:
    """``{"cpu_seconds", "wall_seconds", "peak_rss_mib"}`` since ``start`` (a
    :func:`cost_clock` value); the peak RSS is the process's so far (MiB), not the interval's."""
    import resource

    cpu, wall = cost_clock()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {
        "cpu_seconds": round(cpu - start[0], 3),
        "wall_seconds": round(wall - start[1], 3),
        "peak_rss_mib": round(rss, 1),
    }


def _between(a: tuple[float, float], b: tuple[float, float]) -> dict[str, float]:
    """CPU and wall seconds from :func:`cost_clock` reading ``a`` to reading ``b``."""
    return {"cpu_seconds": round(b[0] - a[0], 3), "wall_seconds": round(b[1] - a[1], 3)}


def _means(comp: Any) -> dict[str, dict[str, float]]:
    """``system -> metric -> mean`` of a comparison's results."""
    return {s: {m: float(v) for m, v in r.mean.items()} for s, r in comp.results.items()}


def _quiet(_message: str) -> None:
    """The log of the ranks other than 0 under ``torchrun``."""


def _derived_training_data(
    cfg: FinetuneConfig,
    view: EmbeddingStore,
    arrays_dir: Path,
    say: Callable[[str], None],
    scorer: Any,
    progress: bool,
) -> tuple[np.ndarray | None, dict[str, Any] | None, list[SourceSpec]]:
    """What a fine-tune derives from its training split before training, written into
    ``view``'s derived folder ``arrays_dir`` (the user's store is only read): BM25-mined
    negatives with ``data.hard_negatives: mined`` (int64 ``(n_q, mine_depth)``), denoised by the
    cross-encoder with ``data.denoise`` (RocketQA; ``-1`` where one was dropped), and each
    ``data.sources`` teacher's run of the training queries.

    Returns ``(mined or None, the denoised pool's metadata or None, the teacher specs)``.
    """
    from treerank.search.negatives import mine_bm25_negatives

    mined, denoised = None, None
    if cfg.data.hard_negatives == "mined":
        say(f"mining BM25 negatives (depth {cfg.data.mine_depth}) into {arrays_dir}")
        mined = mine_bm25_negatives(view, cfg.data.mine_depth)
        job = cfg.data.denoise_job()
        if job is not None:  # RocketQA: the cross-encoder's flagged negatives are dropped
            say(f"denoising them with {job.settings.scorer} (first {job.settings.depth})")
            denoised = ensure_denoised_negatives(view, job, scorer=scorer, progress=progress)
            mined = np.asarray(view.load_array(job.array))
    teachers = [s for s in cfg.data.source_specs() or () if s.kind == "teacher"]
    for spec in teachers:
        say(f"ranking the training queries with the teacher {spec.system} (top {spec.k})")
        ensure_teacher_run(view, None, spec, progress=progress)
    return mined, denoised, teachers


def _drift(
    cfg: FinetuneConfig,
    frozen: EmbeddingStore,
    tuned: EmbeddingStore,
    head_dir: Path,
    ft: FinetuneOutput,
    k: int,
) -> dict[str, Any]:
    """Drift of the tuned split from the frozen one (:func:`~treerank.diagnostics.drift.
    store_drift`: CKA and neighbour overlap@k; passages only where they were re-encoded), and
    for DRT heads the seed's slot comparisons: the trained heads over the frozen and the tuned
    vectors."""
    from treerank.diagnostics.drift import drt_slot_drift, store_drift

    drift = store_drift(frozen, tuned, k=k, passages=not cfg.query_only)
    if cfg.drt_heads:
        from treerank.models.drt import DRTHead
        from treerank.models.registry import load_model

        head = load_model(head_dir, expected_fingerprint=ft.fingerprint)
        assert isinstance(head, DRTHead)
        drift["drt_slots"] = {
            "passages": drt_slot_drift(head, frozen.passages, tuned.passages, side="passage"),
            "queries": drt_slot_drift(head, frozen.queries, tuned.queries, side="query"),
        }
    return drift


def run_finetune(
    cfg: FinetuneConfig,
    store_root: str | Path,
    out_dir: str | Path,
    *,
    train_split: str = "train",
    eval_split: str = "test",
    resume: bool = False,
    progress: bool = False,
    n_permutations: int | None = None,
    drift_k: int = 10,
    device: Device = DEFAULT_DEVICE,
    log: Callable[[str], None] | None = None,
    scorer: Any = None,
) -> dict[str, Any] | None:
    """Fine-tune, re-embed both splits, evaluate against frozen cosine, measure drift.

    Under ``torchrun`` (a process group from :func:`treerank.distributed.context.launch`) the
    training is data-parallel (:func:`treerank.training.finetune.finetune`: each planned batch
    split over the ranks, every rank's rows the negatives of all); rank 0 mines the negatives
    first, and re-embeds and evaluates alone after the last checkpoint while the other ranks
    return None.

    A ``cross-encoder`` config goes to :func:`run_cross_encoder_finetune` (``eval_split`` is
    not read).

    Args:
        cfg: the parsed config.
        store_root: a store root holding ``train_split`` and ``eval_split``.
        out_dir: the output folder (see the module doc).
        resume: continue an interrupted training run in ``out_dir`` (re-embedding and
            evaluation are redone).
        n_permutations: randomization-test permutations (default: the evaluation default).
        drift_k: neighbours compared by the drift diagnostics.
        device: torch device of training and re-embedding (``cpu``, ``cuda[:n]``).
        scorer: in place of ``data.denoise.scorer``'s cross-encoder folder, anything with
            ``score_pairs`` (tests).

    Returns:
        The ``results.json`` document (None on the ranks other than 0 under ``torchrun``).

    Raises:
        FileNotFoundError / StoreFormatError: a split is missing or incomplete.
        EncoderStoreMismatchError, FileExistsError: see :func:`finetune`.
    """
    if cfg.family == CE_FAMILY:
        if (ctx := current()) is not None:
            check_data_parallel(cfg, ctx.world_size)  # refuses the family
        return run_cross_encoder_finetune(
            cfg, store_root, out_dir, train_split=train_split, resume=resume, device=device, log=log
        )
    say = log or (lambda _m: None)
    root, out = Path(store_root), Path(out_dir)
    train = EmbeddingStore.open(root / train_split)
    test = EmbeddingStore.open(root / eval_split)
    t0 = cost_clock()
    train_rows, held = finetune_rows(train, cfg)
    view = train.with_derived(out / "arrays")  # derived arrays go into the run's folder
    ctx = current()  # torchrun: rank 0 mines (denoises, ranks teachers), the others read it
    if ctx is not None:
        check_data_parallel(cfg, ctx.world_size)  # before any work
        if not ctx.is_main:  # rank 0 speaks
            say = _quiet
    with main_first():
        mined, denoised, teachers = _derived_training_data(
            cfg, view, out / "arrays", say, scorer, progress
        )
    say(f"fine-tuning {cfg.family} on {len(train_rows)} training queries of {train.path}")
    ft = finetune(
        view if teachers else train,
        cfg,
        out,
        train_rows=train_rows,
        mined=mined,
        denoised=denoised,
        resume=resume,
        progress=progress and (ctx is None or ctx.is_main),
        device=device,
        log=say,
    )
    if ctx is not None and not ctx.is_main:
        return None  # only the training is data-parallel: rank 0 re-embeds and evaluates
    t1 = cost_clock()
    train_part = cost_since(t0)  # mining + loading + training, measured now
    stores: dict[str, EmbeddingStore] = {}
    for name, parent in ((train_split, train), (eval_split, test)):
        say(f"re-embedding {parent.path} with the tuned encoder")
        stores[name] = reembed_split(
            out, parent, out / STORES_DIR / name, overwrite=True, device=device
        )
    t2 = cost_clock()
    head_dir = out / DRT_HEAD_DIR
    system = f"finetune-{cfg.family}"
    comp, heldout = _evaluate_tuned(
        cfg,
        system,
        (train, test),
        (stores[train_split], stores[eval_split]),
        held,
        out,
        n_permutations,
    )
    t3 = cost_clock()
    drift = {eval_split: _drift(cfg, test, stores[eval_split], head_dir, ft, drift_k)}
    metric = "ndcg@10"
    tests = comp.tests.get("cosine", {}).get(system, {})
    results: dict[str, Any] = {
        "family": cfg.family,
        "config": cfg.to_dict(),
        "store": str(root.resolve()),
        "eval_split": eval_split,
        "n_eval_queries": int(test.n_queries),
        "n_train_queries": int(len(train_rows)),
        "n_heldout_queries": int(len(held)),
        "systems": _means(comp),
        "paired_vs_cosine": paired_summary(tests),
        "seen_unseen": comp.overlap,
        "heldout": heldout,
        "headline_metric": metric,
        "drift": drift,
        "checkpoint": ft.checkpoint,
        "fingerprint": ft.fingerprint,
        "base_fingerprint": ft.base_fingerprint,
        "training": {k: v for k, v in ft.summary.items() if k != "log"},
        "cost": {
            "train": ft.summary["cost"],
            "train_process": train_part,
            "reembed": _between(t1, t2),
            "evaluate": _between(t2, t3),
            "total": cost_since(t0),
        },
    }
    atomic_write_json(out / RESULTS_JSON, results)
    return results


def _evaluate_tuned(
    cfg: FinetuneConfig,
    system: str,
    frozen: tuple[EmbeddingStore, EmbeddingStore],
    tuned: tuple[EmbeddingStore, EmbeddingStore],
    held: np.ndarray,
    out: Path,
    n_permutations: int | None,
) -> tuple[Comparison, dict[str, Any] | None]:
    """Evaluate a run's re-embedded stores against frozen cosine: ``system`` (cosine over the
    tuned vectors, or the DRT heads ``ckpt:OUT/drt_head`` with ``-cosine`` beside them) on
    every query of the evaluation split (``(train, eval)`` in ``frozen`` and ``tuned``), run
    files under ``out/eval``, the seen / unseen parts against the training split; and, when
    ``held`` (training query rows held out) is not empty, the same pair on those queries.

    Returns:
        ``(comparison, {"n_queries", system -> metric -> mean} or None)``.
    """
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.store.view import QuerySubset

    (train, test), (tuned_train, tuned_test) = frozen, tuned
    settings = EvaluationSettings().with_(baseline="cosine")
    if n_permutations is not None:
        settings = settings.with_(n_permutations=n_permutations)
    inner = f"ckpt:{out / DRT_HEAD_DIR}" if cfg.drt_heads else "cosine"
    systems: dict[str, Any] = {
        "cosine": "cosine",
        system: TunedStoreSystem(tuned_test, system, inner),
    }
    if cfg.drt_heads:
        systems[f"{system}-cosine"] = TunedStoreSystem(tuned_test, f"{system}-cosine")
    comp = compare_systems(
        test, systems, settings=settings, out_dir=out / "eval", train_store=train
    )
    if not len(held):
        return comp, None
    hc = compare_systems(
        QuerySubset(train, held),
        {
            "cosine": "cosine",
            system: TunedStoreSystem(QuerySubset(tuned_train, held), system, inner),
        },
        settings=settings,
    )
    return comp, {"n_queries": int(len(held)), **_means(hc)}


def run_cross_encoder_finetune(
    cfg: FinetuneConfig,
    store_root: str | Path,
    out_dir: str | Path,
    *,
    train_split: str = "train",
    resume: bool = False,
    device: Device = DEFAULT_DEVICE,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train a cross-encoder on ``store_root/train_split`` (the ``cross-encoder`` family).

    Mines the split's BM25 negatives once into its sidecar (``data.hard_negatives: mined``),
    scores every training group with ``data.teacher`` for ``margin-mse``, trains with
    :func:`~treerank.training.cross_encoder.train_cross_encoder` on the queries that
    ``validation`` does not hold out, and writes ``out_dir/results.json``: the config, the
    training summary (steps, pairs, loss) and its cost (``cost.train``: CPU seconds, wall
    seconds, peak RSS MiB, pairs per CPU second; ``cost.total``: mining and teacher included).

    Returns:
        The ``results.json`` document (``model_dir``: the trained ``CrossEncoder`` folder;
        ``rerank_spec``: the system spec that reranks BM25's top 20 with it).

    Raises:
        FileNotFoundError / StoreFormatError: the split is missing or incomplete.
        FileExistsError: ``out_dir`` holds an earlier run and not ``resume``.
        ValueError: see :func:`~treerank.training.cross_encoder.train_cross_encoder`.
    """
    from treerank.search.negatives import mine_bm25_negatives

    say = log or (lambda _m: None)
    root = Path(store_root)
    train = EmbeddingStore.open(root / train_split)
    data = cfg.train.data
    t0 = cost_clock()
    mined = None
    if data.hard_negatives == "mined":
        say(f"mining BM25 negatives (depth {data.mine_depth}) into {train.path}")
        mined = mine_bm25_negatives(train, data.mine_depth)
    return train_cross_encoder_run(
        cfg, train, out_dir, mined=mined, resume=resume, device=device, log=log, started=t0
    )


def train_cross_encoder_run(
    cfg: FinetuneConfig,
    train: EmbeddingStore,
    out_dir: str | Path,
    *,
    mined: np.ndarray | None,
    resume: bool = False,
    device: Device = DEFAULT_DEVICE,
    log: Callable[[str], None] | None = None,
    started: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The training part of :func:`run_cross_encoder_finetune`, on negatives mined elsewhere
    (the ``finetune:`` stage of ``treerank run`` reads them from its mine stage; nothing is
    written into ``train``).

    Args:
        cfg: a ``family: cross-encoder`` config. train: the training split.
        out_dir: the run folder (``model/``, ``checkpoints/``, ``cross_encoder.json``,
            ``results.json``).
        mined: ``int (n_queries, depth)`` BM25 negatives (``-1`` padding), or ``None`` with
            ``data.hard_negatives: none`` (seeded random unlabelled passages).
        started: the cost clock's reading when the run began (``None``: now).

    Returns:
        The ``results.json`` document (see :func:`run_cross_encoder_finetune`).
    """
    import torch

    from treerank.models.cross_encoder import CrossEncoderScorer
    from treerank.training.cross_encoder import build_groups, score_groups, train_cross_encoder

    say = log or (lambda _m: None)
    out = Path(out_dir)
    ce, data = cfg.cross_encoder, cfg.train.data
    torch.set_num_threads(int(cfg.train.trainer.threads))
    t0 = cost_clock() if started is None else started
    train_rows, held = finetune_rows(train, cfg)
    if mined is None:
        mined = np.full((int(train.n_queries), 1), -1, dtype=np.int32)
    teacher = None
    if data.teacher is not None:
        say(f"scoring every training group with the teacher {data.teacher}")
        groups = build_groups(train, mined, ce.negatives, seed=ce.seed, train_rows=train_rows)
        scorer = CrossEncoderScorer(data.teacher[len("ce:") :], device=device)
        teacher = score_groups(scorer, train, groups)
    say(f"training a cross-encoder ({ce.loss}) on {len(train_rows)} queries of {train.path}")
    res = train_cross_encoder(
        train,
        ce,
        out,
        mined=mined,
        teacher_scores=teacher,
        train_rows=train_rows,
        resume=resume,
        device=device,
        log=say,
    )
    summary = {k: v for k, v in res.summary.items() if k != "log"}
    steps = int(summary["steps"])
    results: dict[str, Any] = {
        "family": cfg.family,
        "config": cfg.to_dict(),
        "store": str(Path(train.path).parent.resolve()),
        "train_split": Path(train.path).name,
        "n_train_queries": int(len(train_rows)),
        "n_heldout_queries": int(len(held)),
        "model_dir": str(res.model_dir.resolve()),
        "fingerprint": res.fingerprint,
        "rerank_spec": f"rescore:bm25:depth=20,scorer=ce:{res.model_dir}",
        "training": {**summary, "pairs": steps * ce.batch_size * (1 + ce.negatives)},
        "cost": {"train": summary["cost"], "total": cost_since(t0)},
    }
    atomic_write_json(out / RESULTS_JSON, results)
    return results
