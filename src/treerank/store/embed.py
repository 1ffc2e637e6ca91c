"""`embed_split`: encode a `RetrievalSplit` into a store directory, resumably.

The run is a fixed plan: queries then passages, each sorted by token length and cut into
batches of at most ``token_budget`` padded tokens (`plan_batches`). Text tables, candidate and
label tables are written first, the two vector files are pre-sized, and after every batch the
rows are flushed and then ``progress.json`` records how many batches are done. ``meta.json`` is
written LAST and ``progress.json`` removed, so a directory without ``meta.json`` is never taken
for a finished store (`EmbeddingStore.open` raises `IncompleteStoreError`).

``resume=True`` re-plans from the same inputs, checks that the plan's signature (data digest,
encoder fingerprint, prompts, truncation, batching) equals the recorded one, and encodes only
the batches not yet done (passage reuse is re-derived from the sources the first part chose and
must match). Because every batch is encoded exactly as in an uninterrupted run, the
result is byte-identical to one (the vector files, text and label tables; ``meta.json`` differs
only in its timing stats).

Passage reuse: when a complete sibling split store (``<out_dir>/../<other split>``) was written
with the same encoder weights, passage prompt and truncation, passages whose exact text is found
there are copied instead of encoded (SciFact's train and test share one corpus). The copied
vectors come from batches of different composition, so they equal a fresh encoding to float
rounding (cosine > 0.9999), not byte for byte; ``meta.json`` records the count and the sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_write_bytes, atomic_write_json, is_disk_full
from treerank.encoders.batching import padding_stats
from treerank.encoders.sentence import BatchResult, SentenceEncoder
from treerank.faults import crash_point
from treerank.kernels.topk import finite_record
from treerank.kernels.vectors import ROW_CHUNK
from treerank.lock import writes_dir
from treerank.readers.split import RetrievalSplit
from treerank.store.format import (
    ALIASES_TSV,
    ARRAYS_DIR,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_DTYPE,
    INDICES_BIN,
    LABEL_DTYPE,
    META_JSON,
    PASSAGES_BIN,
    PASSAGES_JSONL,
    PROGRESS_JSON,
    QRELS_TSV,
    QUERIES_BIN,
    QUERIES_JSONL,
    SELECTED_BIN,
    STORE_FILES,
    VECTOR_DTYPE,
    StoreFormatError,
)
from treerank.store.reuse import match_passages, reusable_stores


class StoreExistsError(StoreFormatError):
    """The output directory already holds a (complete or partial) store that would be
    overwritten; nothing was changed."""


def check_destination(
    out_dir: str | Path, *, resume: bool = False, overwrite: bool = False
) -> None:
    """Refuse, before any input is read or encoder loaded, a destination that
    :func:`embed_split` would refuse whatever the data: a finished store, an unfinished run or
    bare store files, when neither ``resume`` nor ``overwrite`` is given. (With ``resume`` the
    decision needs the data's signature, so it is left to :func:`embed_split`.)

    Raises:
        StoreExistsError: with the same message :func:`embed_split` gives.
    """
    if resume or overwrite:
        return
    out = Path(out_dir)
    if (out / META_JSON).is_file():
        raise StoreExistsError(
            f"{out / META_JSON}: a finished store is already here; pass overwrite (--overwrite) "
            "to replace it"
        )
    if (out / PROGRESS_JSON).is_file():
        raise StoreExistsError(
            f"{out / PROGRESS_JSON}: an unfinished embed run is here; pass resume (--resume) to "
            "continue it or overwrite (--overwrite) to start again"
        )
    if any((out / n).exists() for n in (QUERIES_BIN, PASSAGES_BIN, INDICES_BIN)):
        raise StoreExistsError(
            f"{out}: holds store files but neither {META_JSON} nor {PROGRESS_JSON}; "
            "pass overwrite (--overwrite) to replace them"
        )


@dataclass
class EmbedStats:
    """Counts and timings of one embed run (cumulative over resumed runs).

    ``*_tokens`` are padded tokens the encoder computed (rows x longest length per batch);
    ``*_real_tokens`` the non-pad ones. Seconds are wall-clock encoding time.
    ``n_truncated_*``: texts longer than the encoder's ``max_seq_length`` (prompt and special
    tokens included), which the encoder cuts; ``truncated_*_tokens``: the tokens cut from them
    (all passages of the split, reused ones included). ``fidelity_*``: the fidelity guard of a
    reduced precision (items re-encoded in fp32, their least cosine, items below the bound and
    replaced by fp32; ``meta.json`` ``encoder.fidelity`` has the details).
    """

    n_queries: int = 0
    n_passages: int = 0
    n_reused_passages: int = 0
    query_batches: int = 0
    passage_batches: int = 0
    query_tokens: int = 0
    query_real_tokens: int = 0
    passage_tokens: int = 0
    passage_real_tokens: int = 0
    query_seconds: float = 0.0
    passage_seconds: float = 0.0
    resumed: bool = False
    reused_from: list[str] = field(default_factory=list)
    n_truncated_queries: int = 0
    truncated_query_tokens: int = 0
    n_truncated_passages: int = 0
    truncated_passage_tokens: int = 0
    fidelity_checked: int = 0
    fidelity_min_cosine: float | None = None
    fidelity_breaches: int = 0

    @property
    def padding_ratio(self) -> float:
        """Fraction of computed tokens that were padding (queries and passages together)."""
        padded = self.query_tokens + self.passage_tokens
        real = self.query_real_tokens + self.passage_real_tokens
        return 1.0 - real / padded if padded else 0.0

    @property
    def seconds(self) -> float:
        return self.query_seconds + self.passage_seconds

    def rows(self) -> list[tuple[str, int, float | None]]:
        """``(what, total, per second)`` rows for the stats table (None: no rate)."""

        def rate(n: int, s: float) -> float | None:
            return n / s if s > 0 else None

        encoded = self.n_passages - self.n_reused_passages
        return [
            ("queries", self.n_queries, rate(self.n_queries, self.query_seconds)),
            ("passages encoded", encoded, rate(encoded, self.passage_seconds)),
            ("passages reused", self.n_reused_passages, None),
            ("queries truncated", self.n_truncated_queries, None),
            ("passages truncated", self.n_truncated_passages, None),
            (
                "tokens cut by truncation",
                self.truncated_query_tokens + self.truncated_passage_tokens,
                None,
            ),
            (
                "tokens",
                self.query_tokens + self.passage_tokens,
                rate(self.query_tokens + self.passage_tokens, self.seconds),
            ),
            (
                "non-pad tokens",
                self.query_real_tokens + self.passage_real_tokens,
                rate(self.query_real_tokens + self.passage_real_tokens, self.seconds),
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["padding_ratio"] = self.padding_ratio
        return d


def split_digest(split: RetrievalSplit) -> str:
    """SHA-256 of a split's content: ids, texts, types, candidates and labels.

    Returns:
        ``"sha256:<hex>"``; equal splits give equal digests whatever file they came from.
    """
    h = hashlib.sha256()
    for name, items in (
        ("qid", split.query_ids),
        ("qtext", split.query_texts),
        ("qtype", split.query_types or []),
        ("pid", split.passage_ids),
        ("ptext", split.passage_texts),
    ):
        h.update(f"{name}:{len(items)}\n".encode())
        for s in items:
            b = s.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    h.update(f"{split.candidates.shape}|{split.relevance_threshold}".encode())
    h.update(np.ascontiguousarray(split.candidates, dtype=INDEX_DTYPE).tobytes())
    h.update(np.ascontiguousarray(split.labels, dtype=LABEL_DTYPE).tobytes())
    if qrels_beyond_candidates(split):
        assert split.qrels is not None
        h.update(f"qrels:{len(split.qrels)}\n".encode())
        for q, d, g in split.qrels:
            h.update(f"{q}\t{d}\t{g}\n".encode())
    return "sha256:" + h.hexdigest()


def qrels_beyond_candidates(split: RetrievalSplit) -> bool:
    """Whether the split's source qrels say more than its candidate tables: judgments on
    documents absent from the corpus, or on source ids that de-duplication folded into another
    passage. (Only then does `split_digest` hash them, so stores of splits without such
    departures keep their digest.)"""
    if split.qrels is None:
        return False
    derived = {
        (split.query_ids[i], split.passage_ids[p], int(g))
        for i, (row, grades) in enumerate(zip(split.candidates, split.labels, strict=True))
        for p, g in zip(row.tolist(), grades.tolist(), strict=True)
        if p >= 0
    }
    return len(split.qrels) != len(derived) or set(split.qrels) != derived


def _encoder_settings(encoder: SentenceEncoder) -> dict[str, Any]:
    """The prompts, truncation and batching settings that ``meta.json`` records and
    :func:`embed_signature` covers."""
    return {
        "query_prompt": encoder.query_prompt,
        "passage_prompt": encoder.passage_prompt,
        "max_seq_length": encoder.max_seq_length,
        "token_budget": encoder.token_budget,
        "max_batch_size": encoder.max_batch_size,
        "max_padding": encoder.max_padding,
    }


def embed_signature(data_sha: str, encoder: SentenceEncoder) -> str:
    """Hex SHA-256 of what fixes an embed run's bytes: data digest, encoder weights
    fingerprint, prompts, truncation, batching settings, dimension and (int8 backends only)
    quantisation settings, (bf16 only) the precision and bf16-weights flag (recorded in
    ``progress.json`` and ``meta.json``; ``--resume`` requires it unchanged)."""
    return hashlib.sha256(
        json.dumps(
            {
                "data": data_sha,
                "encoder": encoder.fingerprint,
                **_encoder_settings(encoder),
                "dim": encoder.dim,
                # only int8 changes the vectors' bytes beyond float rounding; fp32 backends
                # (torch, onnx) keep the signature of stores written before backends existed
                **(
                    {"quantization": encoder.backend.quantization.to_dict()}
                    if encoder.backend.quantization is not None
                    else {}
                ),
                # bf16 likewise; fp32 stores keep their old signature
                **(
                    {"precision": encoder.precision, "bf16_weights": encoder.bf16_weights}
                    if encoder.precision == "bf16"
                    else {}
                ),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()


def _jsonl(rows: Sequence[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def _write_tables(split: RetrievalSplit, out: Path) -> None:
    types = split.query_types
    qrows = [
        {"id": q, "text": t, **({"type": types[i]} if types is not None else {})}
        for i, (q, t) in enumerate(zip(split.query_ids, split.query_texts, strict=True))
    ]
    atomic_write_bytes(out / QUERIES_JSONL, _jsonl(qrows))
    prows = [
        {"id": p, "text": t} for p, t in zip(split.passage_ids, split.passage_texts, strict=True)
    ]
    atomic_write_bytes(out / PASSAGES_JSONL, _jsonl(prows))
    aliases = [
        f"{sid}\t{pid}\n"
        for sid, pid in split.passage_aliases.items()
        if split.passage_ids[pid] != sid
    ]
    atomic_write_bytes(out / ALIASES_TSV, "".join(aliases).encode("utf-8"))
    if split.qrels is not None:
        qrels = "".join(f"{q}\t{d}\t{g}\n" for q, d, g in split.qrels)
        atomic_write_bytes(out / QRELS_TSV, qrels.encode("utf-8"))
    atomic_write_bytes(
        out / INDICES_BIN, np.ascontiguousarray(split.candidates, INDEX_DTYPE).tobytes()
    )
    atomic_write_bytes(
        out / SELECTED_BIN, np.ascontiguousarray(split.labels, LABEL_DTYPE).tobytes()
    )


def _presize(path: Path, n_bytes: int) -> None:
    """Create ``path`` with ``n_bytes`` zero bytes, its blocks reserved now (``posix_fallocate``)
    so that a full filesystem fails here, as ``OSError(ENOSPC)`` naming the file, and not as a
    ``SIGBUS`` in a later write through the memory map; a filesystem without ``fallocate``
    keeps the sparse file."""
    with open(path, "wb") as f:
        f.truncate(n_bytes)
        if n_bytes and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(f.fileno(), 0, n_bytes)
            except OSError as exc:
                if is_disk_full(exc):
                    raise OSError(exc.errno, exc.strerror, str(path)) from None
                # EOPNOTSUPP / EINVAL: no fallocate here; the sparse file is written as before


def _open_rw(path: Path, n: int, dim: int) -> np.memmap | None:
    if n == 0 or dim == 0:
        return None
    return np.memmap(path, dtype=VECTOR_DTYPE, mode="r+", shape=(n, dim))


def clear_store(out: Path) -> None:
    """Remove the store files (and only those) from ``out``."""
    for name in STORE_FILES:
        (out / name).unlink(missing_ok=True)
    if (out / ARRAYS_DIR).is_dir():
        shutil.rmtree(out / ARRAYS_DIR)


@dataclass
class EmbedPlan:
    """The fixed plan of an embed run (what :func:`embed_split` encodes, in which batches).

    Attributes:
        src_stores: complete sibling stores passages are copied from (passage reuse).
        src_idx, src_row: ``int64 (n_passages,)`` source store index and row of each reused
            passage (``-1`` for encoded ones).
        matched: ``bool (n_passages,)`` passages copied instead of encoded.
        reuse_digest: hex digest of the reuse decisions (recorded for resume checks).
        q_len, p_len: token lengths (truncated) of the queries and of the passages to encode.
        q_batches: query ids of each query batch, in encoding order.
        p_batches: passage ids of each passage batch, in encoding order.
        q_full, p_full: untruncated token lengths of every query and every passage.
    """

    src_stores: list[Any]
    src_idx: np.ndarray
    src_row: np.ndarray
    matched: np.ndarray
    reuse_digest: str
    q_len: np.ndarray
    p_len: np.ndarray
    q_batches: list[np.ndarray]
    p_batches: list[np.ndarray]
    q_full: np.ndarray
    p_full: np.ndarray


def plan_embed(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    out: Path,
    reuse: bool | Sequence[str | Path] = True,
) -> EmbedPlan:
    """The batch plan of embedding ``split`` into ``out``: passage reuse, then queries and
    the passages left to encode, each sorted by token length and cut to the token budget.

    Deterministic for equal inputs, so that a resumed run or several processes of a sharded run
    (``treerank.store.sharded_embed``) all compute the same plan.
    """
    npas = split.n_passages
    if reuse is True:
        sources = reusable_stores(
            out,
            encoder.fingerprint,
            encoder.passage_prompt,
            encoder.max_seq_length,
            precision=encoder.precision,
        )
    elif reuse is False:
        sources = []
    else:
        sources = [Path(p) for p in reuse]
    if sources:
        src_idx, src_stores, src_row, matched = match_passages(split.passage_texts, sources)
    else:
        src_stores = []
        src_idx = src_row = np.full(npas, -1, dtype=np.int64)
        matched = np.zeros(npas, dtype=bool)
    reuse_digest = hashlib.sha256(
        json.dumps([str(s.path) for s in src_stores]).encode()
        + matched.tobytes()
        + src_row.tobytes()
    ).hexdigest()
    to_encode = np.flatnonzero(~matched)
    max_len = encoder.max_seq_length
    q_full = encoder.token_lengths(split.query_texts, "query", truncation=False)
    p_full = encoder.token_lengths(split.passage_texts, "passage", truncation=False)
    q_len = np.minimum(q_full, max_len)
    p_len = np.minimum(p_full[to_encode], max_len)
    q_batches = encoder.plan(q_len)
    p_batches = [to_encode[b] for b in encoder.plan(p_len)]
    return EmbedPlan(
        list(src_stores),
        src_idx,
        src_row,
        matched,
        reuse_digest,
        q_len,
        p_len,
        q_batches,
        p_batches,
        q_full,
        p_full,
    )


def _fidelity_guard(
    encoder: SentenceEncoder,
    parts: Sequence[tuple[Any, Sequence[str], np.ndarray]],
    size: int,
    seed: int,
    stats: EmbedStats,
    out: Path,
) -> Any:
    """Re-encode a seeded sample of each part's rows in fp32, compare, overwrite (and flush)
    the rows below the bound with their fp32 vectors, record the counts in ``stats`` and warn
    (naming the store ``out``) when a row was replaced; returns the `FidelityReport`.

    ``parts`` holds ``(memmap or None, texts, rows)``: ``rows`` the candidate rows (an index
    array, or a boolean mask: passages reused from a sibling store are not candidates)."""
    from treerank.encoders.precision import FIDELITY_BOUNDS, FidelityReport, guard_sample

    report = FidelityReport(encoder.precision, FIDELITY_BOUNDS[encoder.precision], seed=seed)
    for (mm, texts, rows), kind in zip(parts, ("query", "passage"), strict=True):
        cand = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, dtype=np.int64)
        if mm is None or not len(cand):
            continue
        pick = cand[guard_sample(len(cand), size, seed)]
        ref = encoder.encode_reference([texts[i] for i in pick], kind)
        from treerank.encoders.precision import cosines

        bad = report.add(kind, pick, cosines(np.asarray(mm[pick]), ref))
        if len(bad):
            mm[pick[bad]] = ref[bad]  # the per-item fp32 fallback
    for mm, _, _ in parts:
        if mm is not None:
            mm.flush()
    stats.fidelity_checked = report.checked
    stats.fidelity_min_cosine = report.min_cosine
    stats.fidelity_breaches = len(report.breaches)
    if report.breaches:
        import warnings

        # stack: this guard, embed_split, its writer-lock wrapper, embed_split's caller
        warnings.warn(report.message(out), stacklevel=4)
    return report


BatchSource = Callable[[str, int, np.ndarray], BatchResult]
"""``source(kind, batch_index, ids) -> BatchResult``: batch ``batch_index`` of the plan's
``"query"`` or ``"passage"`` batches, already encoded elsewhere (the merge step of a sharded
run); a result may carry ``seconds``, the encoding time to record."""


@writes_dir("out_dir", "embed")
def embed_split(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    reuse: bool | Sequence[str | Path] = True,
    progress: bool = True,
    stop_after_batches: int | None = None,
    batch_source: BatchSource | None = None,
    guard_sample: int = 64,
    guard_seed: int = 0,
) -> EmbedStats:
    """Encode ``split`` with ``encoder`` into the store directory ``out_dir``.

    Args:
        split: the split (validated here).
        encoder: the text encoder; its ``token_budget`` / ``max_batch_size`` set the batches.
        out_dir: the split directory to write (created).
        resume: continue an interrupted run into ``out_dir`` (a no-op on a finished store
            with the same signature).
        overwrite: replace an existing (complete or partial) store in ``out_dir``.
        reuse: True: copy passages found in complete sibling stores with the same encoder
            (see module doc); a list: those store directories; False: encode everything.
        progress: tqdm bars on stderr (items/s and ETA).
        stop_after_batches: test hook simulating Ctrl-C: raise ``KeyboardInterrupt`` after
            this many batches were written in this call.
        batch_source: take each batch's vectors from here instead of the encoder (the merge
            step of ``treerank.store.sharded_embed``; same plan, same bytes).
        guard_sample: the fidelity guard of a reduced precision (``bf16``, ``int8``): this many
            queries and this many encoded passages (drawn with ``guard_seed``) are encoded
            again in fp32 (`SentenceEncoder.encode_reference`) and compared by cosine with the
            written rows; a row below the precision's bound
            (`treerank.encoders.precision.FIDELITY_BOUNDS`) is replaced by its fp32 vector
            and reported (a warning and ``meta.json`` ``encoder.fidelity``). 0 turns the guard
            off (recorded as ``checked: 0``). fp32 stores have no guard.
        guard_seed: the guard sample's seed.

    Returns:
        `EmbedStats` (cumulative when resumed).

    Raises:
        StoreExistsError: ``out_dir`` holds a store or partial store and neither ``resume`` nor
            ``overwrite`` was given, or ``resume`` found a run with a different signature
            (other data, encoder, prompt or batching); nothing is overwritten.
        StoreFormatError: partial files with unexpected sizes on resume.
        LockHeldError: another process is writing ``out_dir`` (`treerank.lock`).
        ValueError: an invalid split.
    """
    split.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_sha = split_digest(split)
    signature = embed_signature(data_sha, encoder)
    check_destination(out, resume=resume, overwrite=overwrite)  # the cases without resume
    finished, state = _recorded_run(out, signature, resume=resume, overwrite=overwrite)
    if finished is not None:
        return finished
    # a resumed run reuses exactly the sources its first part chose
    sources = [Path(p) for p in state.get("reuse_sources", [])] if state is not None else reuse
    plan = plan_embed(split, encoder, out, reuse=sources)
    if state is not None:
        stats = _resumed_stats(out, state, plan, split, encoder.dim)
    else:
        stats, state = _start_run(out, split, encoder, plan, signature)
    run_state: dict[str, Any] = state
    qmm = _open_rw(out / QUERIES_BIN, split.n_queries, encoder.dim)
    pmm = _open_rw(out / PASSAGES_BIN, split.n_passages, encoder.dim)

    def checkpoint() -> None:
        for mm in (qmm, pmm):
            if mm is not None:
                mm.flush()
        run_state["stats"] = asdict(stats)
        atomic_write_json(out / PROGRESS_JSON, run_state)

    if not run_state["reuse_done"]:
        _copy_reused(plan, pmm, stats)
        run_state["reuse_done"] = True
        checkpoint()

    _encode_plan(
        split,
        encoder,
        plan,
        (qmm, pmm),
        run_state,
        stats,
        checkpoint,
        batch_source=batch_source,
        progress=progress,
        stop_after_batches=stop_after_batches,
    )
    fidelity = None
    if encoder.precision != "fp32":
        queries = (qmm, split.query_texts, np.arange(split.n_queries))
        parts = (queries, (pmm, split.passage_texts, ~plan.matched))
        fidelity = _fidelity_guard(encoder, parts, guard_sample, guard_seed, stats, out)
    crash_point("embed", "before-meta")
    meta = _store_meta(split, encoder, plan, stats, fidelity, (qmm, pmm), (data_sha, signature))
    atomic_write_json(out / META_JSON, meta)
    (out / PROGRESS_JSON).unlink(missing_ok=True)
    return stats


def _encode_plan(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    plan: EmbedPlan,
    vectors: tuple[np.memmap | None, np.memmap | None],
    run_state: dict[str, Any],
    stats: EmbedStats,
    checkpoint: Callable[[], None],
    *,
    batch_source: BatchSource | None,
    progress: bool,
    stop_after_batches: int | None,
) -> None:
    """Encode (or take from ``batch_source``) the query then passage batches of ``plan`` not
    yet done in ``run_state``, write them into ``vectors`` and checkpoint after each one."""
    from tqdm.auto import tqdm

    written = 0
    for kind, batches, mm, texts, key in (
        ("query", plan.q_batches, vectors[0], split.query_texts, "query_batches_done"),
        ("passage", plan.p_batches, vectors[1], split.passage_texts, "passage_batches_done"),
    ):
        done = int(run_state[key])
        bar = tqdm(
            total=sum(len(b) for b in batches),
            initial=sum(len(b) for b in batches[:done]),
            unit=" queries" if kind == "query" else " passages",
            desc="queries" if kind == "query" else "passages",
            disable=not progress,
            file=sys.stderr,
            mininterval=1.0,
            dynamic_ncols=True,
        )
        try:
            for b_i in range(done, len(batches)):
                idx = batches[b_i]
                t0 = time.perf_counter()
                if batch_source is not None:
                    res = batch_source(kind, b_i, idx)
                else:
                    res = encoder.encode_batch([texts[i] for i in idx], kind)
                if mm is not None:
                    mm[idx] = res.vectors
                dt = float(getattr(res, "seconds", time.perf_counter() - t0))
                if kind == "query":
                    stats.query_batches += 1
                    stats.query_tokens += res.padded_tokens
                    stats.query_real_tokens += res.real_tokens
                    stats.query_seconds += dt
                else:
                    stats.passage_batches += 1
                    stats.passage_tokens += res.padded_tokens
                    stats.passage_real_tokens += res.real_tokens
                    stats.passage_seconds += dt
                run_state[key] = b_i + 1
                checkpoint()
                bar.update(len(idx))
                written += 1
                crash_point("embed", "mid")  # test hook (TREERANK_CRASH_AT), see treerank.faults
                if stop_after_batches is not None and written >= stop_after_batches:
                    raise KeyboardInterrupt(f"test hook: stopped after {written} batches")
        finally:
            bar.close()


def _recorded_run(
    out: Path, signature: str, *, resume: bool, overwrite: bool
) -> tuple[EmbedStats | None, dict[str, Any] | None]:
    """What ``out`` already holds: ``(stats, None)`` for a finished store with this
    ``signature`` (nothing to do), ``(None, progress state)`` for an unfinished run to resume,
    ``(None, None)`` to start afresh.

    Raises:
        StoreExistsError: a finished store or unfinished run with another signature, or bare
            store files (none with ``overwrite``).
    """
    if overwrite:
        return None, None
    if (out / META_JSON).is_file():  # resume: done already when the signature matches
        meta = json.loads((out / META_JSON).read_text(encoding="utf-8"))
        if meta.get("signature") == signature:
            fields = EmbedStats.__dataclass_fields__
            kept = {k: v for k, v in meta.get("stats", {}).items() if k in fields}
            return EmbedStats(**kept), None
        raise StoreExistsError(
            f"{out / META_JSON}: a finished store is already here with a different "
            "data/encoder/batching signature; pass overwrite (--overwrite) to replace it"
        )
    if not (out / PROGRESS_JSON).is_file():
        if any((out / n).exists() for n in (QUERIES_BIN, PASSAGES_BIN, INDICES_BIN)):
            raise StoreExistsError(
                f"{out}: holds store files but neither {META_JSON} nor {PROGRESS_JSON}; "
                "pass overwrite (--overwrite) to replace them"
            )
        return None, None
    if not resume:
        return None, None
    state: dict[str, Any] = json.loads((out / PROGRESS_JSON).read_text(encoding="utf-8"))
    if state.get("signature") != signature:
        raise StoreExistsError(
            f"{out / PROGRESS_JSON}: the unfinished run used other data, encoder, prompt or "
            "batching settings; nothing was overwritten (pass --overwrite to start again)"
        )
    return None, state


def _resumed_stats(
    out: Path, state: dict[str, Any], plan: EmbedPlan, split: RetrievalSplit, dim: int
) -> EmbedStats:
    """The stats of the unfinished run ``state`` records, once its reuse decisions and vector
    files are checked to fit ``plan`` (StoreExistsError / StoreFormatError otherwise)."""
    if state.get("reuse_digest") != plan.reuse_digest:
        raise StoreExistsError(
            f"{out / PROGRESS_JSON}: the stores it reused passages from have changed; "
            "nothing was overwritten (pass --overwrite to start again)"
        )
    for name, n in ((QUERIES_BIN, split.n_queries), (PASSAGES_BIN, split.n_passages)):
        size = (out / name).stat().st_size if (out / name).is_file() else -1
        if size != n * dim * 4:
            raise StoreFormatError(
                f"{out / name}: {size} bytes, the unfinished run needs {n * dim * 4}; "
                "nothing was overwritten (pass --overwrite to start again)"
            )
    stats = EmbedStats(**state["stats"])
    stats.resumed = True
    return stats


def _start_run(
    out: Path, split: RetrievalSplit, encoder: SentenceEncoder, plan: EmbedPlan, signature: str
) -> tuple[EmbedStats, dict[str, Any]]:
    """Write the tables and the pre-sized vector files of a new run and its first
    ``progress.json``; returns the run's stats and progress state. A full disk leaves nothing
    half-made (the same command runs again)."""
    nq, npas, dim = split.n_queries, split.n_passages, encoder.dim
    clear_store(out)
    try:
        _write_tables(split, out)
        _presize(out / QUERIES_BIN, nq * dim * 4)
        _presize(out / PASSAGES_BIN, npas * dim * 4)
    except OSError as exc:
        if is_disk_full(exc):
            clear_store(out)
        raise
    max_len = encoder.max_seq_length
    stats = EmbedStats(n_queries=nq, n_passages=npas)
    stats.n_truncated_queries = int((plan.q_full > max_len).sum())
    stats.truncated_query_tokens = int(np.maximum(plan.q_full - max_len, 0).sum())
    stats.n_truncated_passages = int((plan.p_full > max_len).sum())
    stats.truncated_passage_tokens = int(np.maximum(plan.p_full - max_len, 0).sum())
    state = {
        "signature": signature,
        "reuse_sources": [str(s.path) for s in plan.src_stores],
        "reuse_digest": plan.reuse_digest,
        "reuse_done": False,
        "query_batches_done": 0,
        "passage_batches_done": 0,
        "stats": asdict(stats),
    }
    atomic_write_json(out / PROGRESS_JSON, state)
    return stats, state


def _copy_reused(plan: EmbedPlan, pmm: np.memmap | None, stats: EmbedStats) -> None:
    """Copy the passages ``plan`` reuses from sibling stores into ``pmm``, in row chunks."""
    hits = np.flatnonzero(plan.matched)
    if len(hits) and pmm is not None:
        for s_i, store in enumerate(plan.src_stores):
            sel = hits[plan.src_idx[hits] == s_i]
            for c in range(0, len(sel), ROW_CHUNK):
                rows = sel[c : c + ROW_CHUNK]
                pmm[rows] = store.passages[plan.src_row[rows]]
        stats.reused_from = [str(s.path) for s in plan.src_stores]
    stats.n_reused_passages = len(hits)


def _store_meta(
    split: RetrievalSplit,
    encoder: SentenceEncoder,
    plan: EmbedPlan,
    stats: EmbedStats,
    fidelity: Any,
    vectors: tuple[np.memmap | None, np.memmap | None],
    digests: tuple[str, str],
) -> dict[str, Any]:
    """``meta.json`` of a finished store; ``digests``: its data digest and embed signature."""
    dim = encoder.dim
    planned_padded = padding_stats(plan.p_len, encoder.plan(plan.p_len))
    backend = encoder.backend
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "complete": True,
        "split": split.name,
        "source": split.source,
        "dim": dim,
        "k": split.k,
        "n_queries": split.n_queries,
        "n_passages": split.n_passages,
        "dtype": "float32",
        "byteorder": "little",
        "index_dtype": "int32",
        "label_dtype": "uint8",
        "normalized": True,
        "relevance_threshold": split.relevance_threshold,
        "encoder": {
            "name": encoder.name,
            "fingerprint": encoder.fingerprint,
            **_encoder_settings(encoder),
            "backend": backend.name,
            "quantization": backend.quantization.to_dict() if backend.quantization else None,
            "precision": encoder.precision,
            "bf16_weights": encoder.bf16_weights,
            "auto": encoder.auto_choice.to_dict() if encoder.auto_choice is not None else None,
            "fidelity": fidelity.to_dict() if fidelity is not None else None,
        },
        "data_sha256": digests[0],
        "signature": digests[1],
        "files": {
            "queries": QUERIES_BIN,
            "passages": PASSAGES_BIN,
            "candidates": INDICES_BIN,
            "labels": SELECTED_BIN,
            "query_table": QUERIES_JSONL,
            "passage_table": PASSAGES_JSONL,
            "passage_aliases": ALIASES_TSV,
            **({"qrels": QRELS_TSV} if split.qrels is not None else {}),
        },
        "stats": stats.to_dict(),
        **finite_record(*(np.empty((0, dim), np.float32) if v is None else v for v in vectors)),
        "planned_passage_padding": {
            "padded_tokens": planned_padded[0],
            "real_tokens": planned_padded[1],
        },
        "source_meta": split.meta,
        "created_unix": time.time(),
    }
