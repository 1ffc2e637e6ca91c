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
  only the queries are re-encoded: the passage vectors are the parent's, byte for byte (the
  model was trained against them), and re-embedding over a store with other passage vectors
  is refused naming both;
* ``eval/``: ``compare_systems`` on the evaluation split, the tuned encoder against frozen
  cosine, paired tests, the seen / unseen breakdown against the train split;
* ``results.json``: the headline numbers, the drift diagnostics (linear CKA and
  neighbour overlap between frozen and tuned vectors of the same items) and the cost (CPU
  seconds, wall seconds, peak RSS, tokens) of every part.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_write_json
from treerank.readers.split import RetrievalSplit
from treerank.store.embed import embed_split
from treerank.store.embedding_store import EmbeddingStore
from treerank.storelike import StoreLike
from treerank.training.finetune import (
    FINETUNE_JSON,
    EncoderStoreMismatchError,
    finetune,
)
from treerank.training.finetune_config import FinetuneConfig

__all__ = [
    "RESULTS_JSON",
    "TunedStoreSystem",
    "finetune_rows",
    "reembed_split",
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
) -> EmbeddingStore:
    """Embed ``parent``'s split again with the tuned encoder of ``run_dir``.

    Args:
        run_dir: a :func:`~treerank.training.finetune.finetune` output folder.
        parent: the store split to re-embed (same data; for ``query-tower``, the passage vectors
            the model was trained against, or the same encoder's vectors of another split).
        out_dir: the new split folder.

    Returns:
        The new store split, opened.

    Raises:
        EncoderStoreMismatchError: ``query-tower`` over a store whose passage vectors come
            from another encoder than the one it was trained against (both named).
        StoreExistsError: ``out_dir`` holds a store (and not ``overwrite``).
    """
    from treerank.encoders import SentenceEncoder
    from treerank.encoders.sentence import BatchResult

    run = Path(run_dir)
    info = json.loads((run / FINETUNE_JSON).read_text(encoding="utf-8"))
    family = info["config"]["family"]
    trained_on = info["trained_on"]
    if family == "query-tower" and parent.encoder_fingerprint != trained_on["fingerprint"]:
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
        token_budget=int(enc_meta.get("token_budget", 16384)),
        max_batch_size=int(enc_meta.get("max_batch_size", 256)),
        max_padding=float(enc_meta.get("max_padding", 0.1)),
        progress=False,
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
        reuse=family != "query-tower",
        progress=progress,
        batch_source=frozen_passages if family == "query-tower" else None,
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
            if family == "query-tower"
            else "encoded by the tuned encoder"
        ),
    }
    atomic_write_json(out / "meta.json", meta)
    return EmbeddingStore.open(out)


class TunedStoreSystem:
    """Frozen-store evaluation of a re-embedded store: cosine over ``tuned``'s vectors, for the
    queries of the store it is asked about, which must hold the same data.

    Raises (from :meth:`retrieve`):
        EncoderStoreMismatchError: the evaluated store holds other data than ``tuned`` (both
            named): a model trained on one store is not evaluated on another's rows.
    """

    def __init__(self, tuned: StoreLike, name: str = "finetune") -> None:
        from treerank.search.systems import build_system

        self.tuned = tuned
        self.name = name
        self._cosine = build_system("cosine")

    def retrieve(self, store: StoreLike, k: int = 1000) -> Any:
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


def _clock() -> tuple[float, float]:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, time.perf_counter()


def _since(start: tuple[float, float]) -> dict[str, float]:
    import resource

    cpu, wall = _clock()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {
        "cpu_seconds": round(cpu - start[0], 3),
        "wall_seconds": round(wall - start[1], 3),
        "peak_rss_mib": round(rss, 1),
    }


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
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune, re-embed both splits, evaluate against frozen cosine, measure drift.

    Args:
        cfg: the parsed config.
        store_root: a store root holding ``train_split`` and ``eval_split``.
        out_dir: the output folder (see the module doc).
        resume: continue an interrupted training run in ``out_dir`` (re-embedding and
            evaluation are redone).
        n_permutations: randomization-test permutations (default: the evaluation default).
        drift_k: neighbours compared by the drift diagnostics.

    Returns:
        The ``results.json`` document.

    Raises:
        FileNotFoundError / StoreFormatError: a split is missing or incomplete.
        EncoderStoreMismatchError, FileExistsError: see :func:`finetune`.
    """
    from treerank.diagnostics.drift import store_drift
    from treerank.evaluation.compare import compare_systems
    from treerank.evaluation.settings import EvaluationSettings
    from treerank.search.negatives import mine_bm25_negatives

    say = log or (lambda _m: None)
    root, out = Path(store_root), Path(out_dir)
    train = EmbeddingStore.open(root / train_split)
    test = EmbeddingStore.open(root / eval_split)
    t0 = _clock()
    train_rows, held = finetune_rows(train, cfg)
    mined = None
    if cfg.data.hard_negatives == "mined":
        # into the run's folder: the user's store is only read
        say(f"mining BM25 negatives (depth {cfg.data.mine_depth}) into {out / 'arrays'}")
        mined = mine_bm25_negatives(train.with_derived(out / "arrays"), cfg.data.mine_depth)
    say(f"fine-tuning {cfg.family} on {len(train_rows)} training queries of {train.path}")
    ft = finetune(
        train,
        cfg,
        out,
        train_rows=train_rows,
        mined=mined,
        resume=resume,
        progress=progress,
        log=say,
    )
    t1 = _clock()
    train_part = _since(t0)  # mining + loading + training, measured now
    stores: dict[str, EmbeddingStore] = {}
    for name, parent in ((train_split, train), (eval_split, test)):
        say(f"re-embedding {parent.path} with the tuned encoder")
        stores[name] = reembed_split(out, parent, out / STORES_DIR / name, overwrite=True)
    t2 = _clock()
    settings = EvaluationSettings()
    if n_permutations is not None:
        settings = settings.with_(n_permutations=n_permutations)
    system = f"finetune-{cfg.family}"
    comp = compare_systems(
        test,
        {"cosine": "cosine", system: TunedStoreSystem(stores[eval_split], system)},
        baseline="cosine",
        settings=settings,
        out_dir=out / "eval",
        train_store=train,
    )
    heldout: dict[str, Any] | None = None
    if len(held):
        from treerank.store.view import QuerySubset

        hc = compare_systems(
            QuerySubset(train, held),
            {
                "cosine": "cosine",
                system: TunedStoreSystem(QuerySubset(stores[train_split], held), system),
            },
            baseline="cosine",
            settings=settings,
        )
        heldout = {
            "n_queries": int(len(held)),
            **{s: {m: float(v) for m, v in r.mean.items()} for s, r in hc.results.items()},
        }
    t3 = _clock()
    drift = {
        split: store_drift(parent, stores[split], k=drift_k, passages=cfg.family != "query-tower")
        for split, parent in ((eval_split, test),)
    }
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
        "systems": {s: {m: float(v) for m, v in r.mean.items()} for s, r in comp.results.items()},
        "paired_vs_cosine": {
            m: {
                "delta": float(t.delta),
                "p": float(t.p_randomization),
                "ci_low": float(t.ci_low),
                "ci_high": float(t.ci_high),
            }
            for m, t in tests.items()
        },
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
            "reembed": {
                "cpu_seconds": round(t2[0] - t1[0], 3),
                "wall_seconds": round(t2[1] - t1[1], 3),
            },
            "evaluate": {
                "cpu_seconds": round(t3[0] - t2[0], 3),
                "wall_seconds": round(t3[1] - t2[1], 3),
            },
            "total": _since(t0),
        },
    }
    atomic_write_json(out / RESULTS_JSON, results)
    return results
