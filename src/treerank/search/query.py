"""Searching a store with new query texts: the store's own encoder, pinned by its fingerprint.

:func:`load_store_encoder` loads the sentence-transformers model a store was embedded with and
refuses it when its weights fingerprint differs from the one in the store's ``meta.json`` (a
query encoded by another model lands in another vector space: the ranking would be garbage with
no error). :class:`QueryView` is the store split with its queries replaced by the encoded texts,
so that **every** system (exact, FAISS, BM25 on the texts, fusion, rescoring, checkpoints)
answers new queries through its ordinary ``retrieve(store, k)``. :func:`search_texts` ties the
two together and returns the hits with passage ids, source ids, texts and scores.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import check_run_depth
from treerank.kernels.vectors import Vecs
from treerank.search.run import Run
from treerank.search.systems import System
from treerank.storelike import Split, StoreLike, meta_object, meta_text

if TYPE_CHECKING:
    from treerank.encoders.backend import Backend
    from treerank.encoders.sentence import SentenceEncoder


class QueryBackend(Protocol):
    """What :func:`check_query_backend` reads of a query encoder: its ``backend`` (and, when
    it has one, ``precision``: the vectors' precision when it differs from the backend's)."""

    @property
    def backend(self) -> Backend: ...


class EncoderMismatchError(ValueError):
    """Two of store, index and encoder were made with different encoders or data; the message
    names both sides."""


def check_query_backend(store: Split, encoder: QueryBackend) -> None:
    """Refuse a query encoder whose vector precision the mixing rule keeps apart from the
    store's (`treerank.encoders.precision.check_mix`: fp32 and bf16 mix, int8 only with int8).

    The store's precision is the one its ``meta.json`` records (``encoder.precision``; else
    from ``encoder.backend``, ``torch`` for stores written before backends existed).

    Raises:
        EncoderMismatchError: naming the store, both precisions and the flag to pass.
    """
    from treerank.encoders.precision import PrecisionMixError, check_mix, store_precision

    enc_meta = meta_object(store.meta, "encoder")
    try:
        base = store_precision(enc_meta)
    except ValueError as exc:  # an unknown backend or precision recorded in meta.json
        raise EncoderMismatchError(f"{store.path}/meta.json: encoder: {exc}") from None
    other = getattr(encoder, "precision", None) or encoder.backend.precision
    try:
        check_mix(
            store.path,
            base,
            other,
            base_what="the store's passages were encoded with backend "
            f"{enc_meta.get('backend') or 'torch'!r}",
            other_what=f"the queries would be encoded with {encoder.backend.name!r}",
            fix=f"Use --backend {enc_meta.get('backend') or 'torch'} (or re-embed the store "
            f"with {encoder.backend.name!r})",
        )
    except PrecisionMixError as exc:
        raise EncoderMismatchError(str(exc)) from None


def load_store_encoder(
    store: StoreLike,
    model: str | Path | None = None,
    backend: str | None = None,
    *,
    progress: bool = False,
    device: Device = DEFAULT_DEVICE,
    precision: str | None = None,
) -> SentenceEncoder:
    """The :class:`~treerank.encoders.SentenceEncoder` a store was embedded with.

    Args:
        store: an :class:`~treerank.store.EmbeddingStore` split with ``meta.json``.
        model: model name or directory to load instead of the one named in the store (its
            fingerprint must still match).
        backend: encoder backend for the queries (``torch``, ``onnx``, ``onnx-int8``,
            ``auto``); ``None``: the one the store records (``torch`` when it records none).
        precision: the torch backend's precision for the queries (``fp32``, ``bf16``,
            ``auto``); ``None``: the store's when its backend is torch, else ``fp32``. With
            ``auto`` the probe chooses among the paths the mixing rule allows with the store
            (:func:`check_query_backend`, checked before the model is loaded).
        device: torch device of the query encoder (``cpu``, ``cuda``, ``cuda:n``; the onnx
            backends run on the CPU only).

    Raises:
        EncoderMismatchError: the store records no fingerprint (a Go-tool store), the query
            precision cannot mix with the store's, or the loaded weights' fingerprint differs
            from the store's (both are named).
    """
    from types import SimpleNamespace

    from treerank.encoders import DEFAULT_MODEL_NAME, SentenceEncoder
    from treerank.encoders.backend import Backend, get_backend, store_backend
    from treerank.encoders.precision import MIX_SPACE, PRECISIONS, store_precision

    enc_meta = meta_object(store.meta, "encoder")
    try:
        base = store_precision(enc_meta)
        chosen: Backend | str = store_backend(enc_meta) if backend is None else backend
        if precision is None:
            precision = base if base == "bf16" and str(chosen) in ("torch", "auto") else "fp32"
            if chosen == "auto":
                precision = "auto"
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
        if chosen != "auto":
            chosen = get_backend(chosen)
    except ValueError as exc:
        raise EncoderMismatchError(f"{store.path}: {exc}") from None
    if isinstance(chosen, Backend) and precision != "auto":
        vec = "bf16" if precision == "bf16" else chosen.precision
        check_query_backend(store, SimpleNamespace(backend=chosen, precision=vec))
    want = meta_text(enc_meta, "fingerprint")
    name = meta_text(enc_meta, "name")
    if not want:
        raise EncoderMismatchError(
            f"{store.path}: the store records no encoder fingerprint, so query vectors cannot be "
            "matched to it"
        )
    if model is None and name not in (None, DEFAULT_MODEL_NAME):
        model = name
    try:
        encoder = SentenceEncoder(
            model,
            query_prompt=meta_text(enc_meta, "query_prompt"),
            passage_prompt=meta_text(enc_meta, "passage_prompt"),
            max_seq_length=_int_or_none(enc_meta.get("max_seq_length")),
            name=name,
            progress=progress,
            backend=chosen,
            precision=precision,
            device=device,
            allowed_precisions=[p for p, sp in MIX_SPACE.items() if sp == MIX_SPACE[base]],
        )
    except ValueError as exc:
        raise EncoderMismatchError(f"{store.path}: {exc}") from None
    if encoder.fingerprint != want:
        raise EncoderMismatchError(
            f"encoder {model or DEFAULT_MODEL_NAME!r} has weights fingerprint "
            f"{encoder.fingerprint}, but the store {store.path} was embedded with {name!r} "
            f"fingerprint {want}"
        )
    check_query_backend(store, encoder)
    return encoder


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int) else None


class QueryView:
    """A store split whose queries are replaced by new query vectors (and texts).

    Everything else (passages, texts, meta, path, encoder fingerprint) is the base store's.
    ``memo_key`` is unique per view, so systems that memoise runs per store never confuse two
    views.

    Args:
        base: the store split.
        queries: ``float32 (nq, dim)`` query vectors in the store's space.
        texts: the ``nq`` query texts (BM25 tokenises them).
    """

    def __init__(self, base: StoreLike, queries: Vecs, texts: Sequence[str]) -> None:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != base.passages.shape[1] or q.shape[0] != len(texts):
            raise ValueError(
                f"query vectors {q.shape} do not fit {len(texts)} texts x the store's "
                f"dimension {base.passages.shape[1]}"
            )
        self.base = base
        self.queries = q
        self._texts = list(texts)
        self.memo_key = f"query-view:{uuid.uuid4().hex}"

    def __getattr__(self, name: str) -> Any:  # every other store member is the base's
        return getattr(self.base, name)

    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    def query_texts(self) -> list[str]:
        return list(self._texts)

    def query_ids(self) -> list[str]:
        return [str(i) for i in range(self.n_queries)]


@dataclass(frozen=True)
class Hit:
    """One result: ``passage_id`` is the store row, ``source_id`` the dataset's id."""

    rank: int
    passage_id: int
    source_id: str
    score: float
    text: str

    def to_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "passage_id": self.passage_id,
            "source_id": self.source_id,
            "score": self.score,
            "text": self.text,
        }


def run_hits(store: StoreLike, run: Run) -> list[list[Hit]]:
    """The hits of every query of ``run`` (padding dropped), with source ids and texts."""
    try:
        sources = store.passage_ids()
        texts = store.passage_texts()
    except (OSError, ValueError):  # a store without text tables (Go tool, synthetic)
        sources, texts = None, None
    out: list[list[Hit]] = []
    for ids, scores in zip(run.ids, run.scores, strict=True):
        row = []
        for r, (pid, s) in enumerate(zip(ids, scores, strict=True), start=1):
            if pid < 0:
                break
            row.append(
                Hit(
                    rank=r,
                    passage_id=int(pid),
                    source_id=sources[pid] if sources else str(int(pid)),
                    score=float(s),
                    text=texts[pid] if texts else "",
                )
            )
        out.append(row)
    return out


def search_texts(
    store: StoreLike, system: System, encoder: SentenceEncoder, texts: Sequence[str], k: int = 10
) -> tuple[Run, list[list[Hit]]]:
    """Encode ``texts`` with ``encoder`` (query prompt included) and rank the store's passages.

    Args:
        store: the store split.
        system: any system (``retrieve(store, k) -> Run``).
        encoder: the store's encoder (:func:`load_store_encoder`).
        texts: query texts.
        k: hits per query (>= 1).

    Returns:
        ``(run, hits)``: the run over the ``len(texts)`` queries and their hits.

    Raises:
        ValueError: ``k < 1`` or no texts.
    """
    check_run_depth(k)
    if not texts:
        raise ValueError("no query texts")
    q = encoder.encode_queries(list(texts))
    view = QueryView(store, q, texts)
    run = system.retrieve(view, k)
    return run, run_hits(store, run)
