"""`SearchService`: a store, its encoder and its systems, loaded once and checked to agree.

The service refuses to start (raises :class:`~treerank.search.query.EncoderMismatchError`, whose
message names both sides) when

- the encoder's weights fingerprint differs from the one recorded in the store's ``meta.json``;
- the query encoder's vector precision cannot mix with the store's (int8 meets only int8);
- a prebuilt index (``index=DIR``) was built on other passage vectors (its store signature
  differs from the store's) or with another encoder (its fingerprint differs from the store's);
- a checkpoint system was trained on another encoder's vectors;
- a cross-encoder reranker (``rescore:...,scorer=ce:<dir>,fingerprint=sha256:<hex>``) pins
  weights other than its folder's
  (:class:`~treerank.search.ce_rescore.CrossEncoderMismatchError`, a subclass; checked when
  its folder loads, before the warm-up query is scored).

``info()`` records every served reranker's cross-encoder folder and weights fingerprint.

Every configured system is warmed up at start (indexes built or loaded, checkpoints loaded), so
the first request pays nothing extra.

**Batch invariance** (``batch_invariant``, the default; ``serve --no-batch-invariant`` turns it
off). :meth:`SearchService.search` answers each text as a batch of one: its own
``encode_queries`` call (no padding to other queries' lengths, no batch-shaped kernel) and its
own ``retrieve`` (FAISS's flat search, for one, switches from a SIMD loop to BLAS at 20 queries),
so a query's vector, ids, order and scores are bit for bit the ones it gets alone, whichever
requests share its micro-batch; ties are broken by ascending passage id everywhere. Encoding a
query inside a padded batch of others moves its vector by ~1e-7, enough to swap near-tied
passages (issue 36). The cost is the encoder's batching gain,
measured by ``bench/bench_serve_invariance.py`` (``docs/serving.md``).

:meth:`SearchService.search` runs one search at a time under a lock (the systems keep small
per-store caches that are not thread-safe, and FAISS and torch already use every core inside
one search); the HTTP app does not queue requests on that lock one by one but batches
concurrent ones into one worker round (:class:`~treerank.serve.batching.QueryBatcher`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device
from treerank.search.query import (
    EncoderMismatchError,
    Hit,
    check_query_backend,
    load_store_encoder,
    search_texts,
)
from treerank.storelike import meta_object


@dataclass(frozen=True)
class ServiceConfig:
    """What the service serves.

    Attributes:
        store: the store split directory.
        systems: system specs a request may name; the first is the default.
        index: a prebuilt index directory (``treerank index build``) served as the system
            ``faiss:<kind>...`` it was built for (added first, so it becomes the default).
        encoder: model name or directory to load instead of the store's (fingerprint checked).
        max_k: largest ``k`` a request may ask for.
        max_batch: most queries in one request.
        max_body_bytes: largest request body (bytes); a larger one gets 413.
        max_query_chars: longest query text (characters); a longer one gets 422. The encoder
            reads at most its ``max_seq_length`` tokens (256 for MiniLM, about 1,000 characters
            of English), so the default 4,096 loses nothing.
        request_timeout_s: a request not answered within this many seconds gets 504.
        batch_window_s: how long the micro-batcher waits for more requests after the first of a
            round (:class:`~treerank.serve.batching.QueryBatcher`).
        batch_queries: most query texts per encoder + search call (larger requests are split).
        batch_invariant: answer each text alone (its own encode and retrieve), so a ranking
            never depends on the batch (default); ``False``: one ``encode_queries`` and one
            ``retrieve`` per batch (more throughput; a query's vector then moves by ~1e-7 with
            its batch and near-ties may swap).
        device: where queries are encoded (the torch backend) and where exact search and a
            family's own search run (a parsed :class:`~treerank.kernels.device.Device`; checked
            when the service starts).
        backend: encoder backend for the queries (``None``: the store's; its precision must
            mix with the store's, see `check_query_backend`).
        precision: the query encoder's torch precision (``fp32`` | ``bf16`` | ``auto``;
            ``None``: the store's, see `load_store_encoder`).
    """

    store: Path
    systems: tuple[str, ...] = ("cosine",)
    index: Path | None = None
    encoder: str | None = None
    max_k: int = 1000
    max_batch: int = 256
    max_body_bytes: int = 1 << 20
    max_query_chars: int = 4096
    request_timeout_s: float = 30.0
    batch_window_s: float = 0.002
    batch_queries: int = 64
    batch_invariant: bool = True
    device: Device = DEFAULT_DEVICE
    backend: str | None = None
    precision: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_k", "max_batch", "max_body_bytes", "max_query_chars", "batch_queries"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if not 0 <= self.batch_window_s <= 1:
            raise ValueError(f"batch_window_s must be in [0, 1] seconds, got {self.batch_window_s}")


@dataclass
class _Stats:
    requests: int = 0
    queries: int = 0
    started_unix: float = field(default_factory=time.time)


def index_system_spec(meta: dict[str, Any]) -> str:
    """The ``faiss:<kind>:<build params>[,over=...]`` spec that rebuilds an index's meta."""
    params = [f"{k}={v}" for k, v in (meta.get("build") or {}).items()]
    if meta.get("over", "cosine") != "cosine":
        params.append(f"over={meta['over']}")
    return f"faiss:{meta['kind']}" + (":" + ",".join(params) if params else "")


def faiss_index_info(system: Any) -> dict[str, Any] | None:
    """Kind, build and search parameters, rescoring depth, directory and size of the FAISS index
    behind a served system (a ``faiss:`` system, rescored or not); ``None`` for other systems or
    an index not loaded yet."""
    from treerank.search.faiss_index import FaissSystem

    inner = getattr(system, "first", system)
    if not isinstance(inner, FaissSystem) or inner._index is None:
        return None
    index = inner._index[1]
    return {
        "kind": index.kind,
        "build": index.meta.get("build"),
        "search": dict(inner.spec.search),
        "rescore": int(getattr(system, "depth", 0)) if system is not inner else 0,
        "over": index.meta.get("over", "cosine"),
        "path": None if index.path is None else str(index.path),
        "n_passages": index.ntotal,
        "index_bytes": index.meta.get("index_bytes"),
    }


class SearchService:
    """Loads and checks everything at construction; :meth:`search` answers queries.

    Args:
        config: the :class:`ServiceConfig`.
        encoder: an already loaded encoder (tests); its fingerprint is checked like a loaded one.

    Raises:
        EncoderMismatchError: see the module docstring.
        StoreFormatError, FileNotFoundError, ValueError: a bad store, index or system spec.
    """

    def __init__(self, config: ServiceConfig, encoder: Any = None) -> None:
        from treerank.families import CHECKPOINTS
        from treerank.search.specs import BuildContext, build_system
        from treerank.store import EmbeddingStore

        self.config = config
        resolve_device(config.device)  # a bad device fails before the store is opened
        self.store = EmbeddingStore.open(config.store)
        want = self.store.encoder_fingerprint
        if encoder is None:
            encoder = load_store_encoder(
                self.store,
                config.encoder,
                config.backend,
                device=config.device.concrete(),  # the query encoder's device, as `search`'s
                precision=config.precision,
            )
        elif encoder.fingerprint != want:
            raise EncoderMismatchError(
                f"encoder {encoder.name!r} has weights fingerprint {encoder.fingerprint}, but the "
                f"store {self.store.path} was embedded with {self.store.encoder_name!r} "
                f"fingerprint {want}"
            )
        check_query_backend(self.store, encoder)  # the mixing rule: int8 meets only int8
        self.encoder = encoder
        self.systems: dict[str, Any] = {}
        self.index_meta: dict[str, Any] | None = None
        if config.index is not None:
            spec, system = self._index_system(Path(config.index))
            self.systems[spec] = system
        for spec in config.systems:
            if spec not in self.systems:
                ctx = BuildContext(device=config.device, checkpoints=CHECKPOINTS)
                self.systems[spec] = build_system(spec, ctx)
        if not self.systems:
            raise ValueError("no system to serve")
        from treerank.search.ce_rescore import cross_encoders

        # every reranker's cross-encoder loaded and its pin checked before any query is scored
        self.cross_encoders = {
            name: [ce.identity() for ce in cross_encoders(system)]
            for name, system in self.systems.items()
        }
        self.default_system = next(iter(self.systems))
        self._lock = threading.Lock()
        self.stats = _Stats()
        for name in self.systems:  # build / load indexes and checkpoints now, not on a request
            self.search(["warm-up"], k=1, system=name, count=False)

    def _index_system(self, path: Path) -> tuple[str, Any]:
        from treerank.search.faiss_index import (
            FaissSystem,
            open_index,
            parse_index_spec,
            store_signature,
        )

        index = open_index(path)
        meta = index.meta
        sig = store_signature(self.store)
        if meta.get("store_signature") != sig:
            raise EncoderMismatchError(
                f"index {path} was built on store {meta.get('store')} (vectors digest "
                f"{meta.get('store_signature')}), but the served store {self.store.path} has "
                f"vectors digest {sig}"
            )
        fp = meta_object(meta, "encoder").get("fingerprint")
        if fp != self.store.encoder_fingerprint:
            raise EncoderMismatchError(
                f"index {path} was built with encoder fingerprint {fp}, but the store "
                f"{self.store.path} was embedded with fingerprint {self.store.encoder_fingerprint}"
            )
        spec = index_system_spec(meta)
        parsed = parse_index_spec(spec.removeprefix("faiss:"), spec)
        system = FaissSystem(parsed, spec)
        system._index = (sig, index)  # serve exactly this index directory
        self.index_meta = {"path": str(path), **meta}
        return spec, system

    def info(self) -> dict[str, Any]:
        """Encoder name + fingerprint, store path + vectors digest + embed signature + counts,
        systems, the ``--index`` directory's meta, per FAISS system its index
        (:func:`faiss_index_info`), and per reranking system its cross-encoders
        (``cross_encoders``: system -> list of folder, fingerprint and pin)."""
        from treerank.search.faiss_index import store_signature

        return {
            "encoder": {
                "name": self.encoder.name,
                "fingerprint": self.encoder.fingerprint,
                "backend": str(getattr(self.encoder, "backend", "torch")),
                "precision": str(getattr(self.encoder, "precision", "fp32")),
            },
            "store": {
                "path": str(self.store.path),
                # a digest of the passage vectors (FAISS indexes record it), not meta.json's
                # embed signature (the plan of the embed run), given too under its own name
                "vectors_digest": store_signature(self.store),
                "embed_signature": (self.store.meta or {}).get("signature"),
                "n_passages": self.store.n_passages,
                "dim": self.store.dim,
                "split": self.store.split,
            },
            "systems": list(self.systems),
            "default_system": self.default_system,
            "index": self.index_meta,
            "indexes": {
                name: info
                for name, system in self.systems.items()
                if (info := faiss_index_info(system)) is not None
            },
            "cross_encoders": {
                name: [ce.to_dict() for ce in ces]
                for name, ces in self.cross_encoders.items()
                if ces
            },
            "limits": {
                "max_k": self.config.max_k,
                "max_batch": self.config.max_batch,
                "max_body_bytes": self.config.max_body_bytes,
                "max_query_chars": self.config.max_query_chars,
                "request_timeout_s": self.config.request_timeout_s,
            },
            "batching": {
                "window_s": self.config.batch_window_s,
                "max_queries": self.config.batch_queries,
                "invariant": self.config.batch_invariant,
            },
            "served": {"requests": self.stats.requests, "queries": self.stats.queries},
        }

    def search(
        self, texts: list[str], k: int = 10, system: str | None = None, count: bool = True
    ) -> list[list[Hit]]:
        """Hits for each text (at most ``k``), from ``system`` (default: the first configured);
        each text is encoded and searched alone unless ``batch_invariant`` is off (module
        docstring: batch invariance).

        Returns:
            one list of :class:`~treerank.search.query.Hit` per text (rank, passage id, source
            id, score: the system's float32 score, text), at most ``k`` each.

        Raises:
            KeyError: a system that is not served (the message lists the served ones).
            ValueError: bad ``k`` or no texts.
        """
        name = system or self.default_system
        if name not in self.systems:
            raise KeyError(f"system {name!r} is not served; served: {', '.join(self.systems)}")
        if not texts:
            raise ValueError("no query texts")
        system_ = self.systems[name]
        with self._lock:
            if self.config.batch_invariant:
                hits = [
                    search_texts(self.store, system_, self.encoder, [text], k)[1][0]
                    for text in texts
                ]
            else:
                hits = search_texts(self.store, system_, self.encoder, texts, k)[1]
            if count:
                self.stats.requests += 1
                self.stats.queries += len(texts)
        return hits
