"""Retrieval systems over a store split, and ``build_system(spec)`` from strings.

A :class:`System` returns a :class:`~treerank.search.run.Run` of the top ``k`` passages of the
split for every query of the split (the evaluation contract: candidates are all passages of the
split). Specs (one table, :data:`SYSTEM_KINDS`, feeds parsing and ``--help``):

==========================================  ==================================================
``cosine``                                  exact search on the stored vectors, L2-normalised
``bm25`` / ``bm25:k1=0.9,b=0.4,method=...``  BM25 over the passage texts (:mod:`.bm25`)
``bm25+rm3[:fb_docs=10,fb_terms=10,...]``   BM25 + RM3 pseudo-relevance feedback (:mod:`.rm3`)
``rrf:<A>+<B>[:k=60]``                      Reciprocal Rank Fusion of two systems
``linear-fusion:<A>+<B>[:w=0.5,norm=...]``  normalised linear fusion (w weighs ``A``)
``ckpt:<dir>``                              any checkpoint (dense head, DRT, forest)
``faiss:<kind>[:k=v,...]``                  a cached FAISS index (:mod:`.faiss_index`)
``rescore:<A>[:depth=100,scorer=...]``      exact dense rescoring of ``A``'s top ``depth``
                                            (:mod:`.rescore`)
==========================================  ==================================================

``ckpt:`` loads through :func:`treerank.models.registry.load_model` with the store's encoder
fingerprint (a checkpoint trained on another encoder's vectors is refused); the model's family
(``treerank.models.families``) says how it searches: its ``system`` hook (the forest's inverted
lists), or, for a dense family, :class:`DenseSystem` over its two towers.

Every built-in kind is one row of the static table ``_BUILT_IN`` (a heavy kind as a lazy
``"module:attr"`` builder), so which kinds exist never depends on import order;
:func:`register_system_kind` adds a kind from outside (a plugin, a test):
``register_system_kind("xxx", build, "help text")`` where ``build(body, spec, cache=None,
**options) -> System`` gets the text after the first ``:``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from treerank.encoders.precision import vector_precision
from treerank.kernels.device import takes_device
from treerank.kernels.topk import DEFAULT_CHUNK_SIZE, exact_search
from treerank.models.base import DenseScorer
from treerank.models.checkpoint import CheckpointMixin
from treerank.models.cosine import CosineScorer
from treerank.models.families import FAMILIES
from treerank.search.bm25 import BM25_METHODS, BM25Index, BM25Params
from treerank.search.fusion import DEFAULT_RRF_K, NORMALISATIONS, linear_fusion, rrf
from treerank.search.run import Run, store_key
from treerank.storelike import StoreLike


@runtime_checkable
class System(Protocol):
    """Anything that ranks all passages of a store split for each of its queries."""

    name: str

    def retrieve(self, store: StoreLike, k: int = 1000) -> Run:
        """Top-``k`` passages of the split for each of its queries (row ``i`` = query ``i``)."""
        ...


def uses_trained_model(system: Any, _depth: int = 0) -> bool:
    """Whether a system is, or is built on, a trained model.

    True for a :class:`CheckpointSystem`, a loaded model of a trainable family, or a
    ``ckpt:`` spec string held by a system (``rescore:...:scorer=ckpt:<dir>``,
    ``faiss:...:over=ckpt:<dir>``), found by walking the attributes of treerank objects (a
    fusion's two sides, a rescore's first stage, a FAISS system's spec). Reports use it to print
    the memorisation caveat only where a trained model is involved.
    """
    if isinstance(system, CheckpointSystem):
        return True
    if isinstance(system, CheckpointMixin):  # a loaded model: trained unless its family is not
        fam = FAMILIES.get(system.model_type)
        return fam is None or fam.trainable
    if isinstance(system, str):
        return system.strip().startswith(("ckpt:", "ce:"))
    if isinstance(system, (tuple, list)):
        return any(uses_trained_model(v, _depth + 1) for v in system)
    if _depth > 6 or not type(system).__module__.startswith("treerank."):
        return False
    return any(uses_trained_model(v, _depth + 1) for v in getattr(system, "__dict__", {}).values())


class _RunMemo:
    """Keeps the deepest run computed for the last store, so that a system shared by several
    fusions (``rrf:bm25+cosine`` next to ``bm25`` and ``cosine``) runs once."""

    def __init__(self) -> None:
        self._memo: tuple[str, Run] | None = None

    def get(self, store: StoreLike, k: int) -> Run | None:
        if self._memo and self._memo[0] == store_key(store) and self._memo[1].k >= k:
            run = self._memo[1]
            return run if run.k == k else run.truncate(min(k, run.k))
        return None

    def put(self, store: StoreLike, run: Run) -> Run:
        self._memo = (store_key(store), run)
        return run


class DenseSystem:
    """Exact inner-product search with a :class:`DenseScorer`'s two towers.

    Queries go through ``scorer.encode_queries`` once; passages through ``scorer.encode_passages``
    chunk by chunk while streaming the memory-mapped store (:func:`exact_search`).
    """

    def __init__(
        self,
        scorer: DenseScorer,
        name: str | None = None,
        chunk_size: int | None = DEFAULT_CHUNK_SIZE,
        progress: bool = False,
        backend: str = "faiss",
        device: Any = None,
    ) -> None:
        self.scorer = scorer
        self.name: str = name or str(getattr(scorer, "name", "dense"))
        self.chunk_size = chunk_size
        self.progress = progress
        self.backend = backend
        self.device = device  # exact_search's device (auto | cpu | cuda[:n]; None: the CPU)
        self._memo = _RunMemo()

    def retrieve(self, store: StoreLike, k: int = 1000) -> Run:
        k = min(k, int(store.n_passages))
        if (hit := self._memo.get(store, k)) is not None:
            return hit
        q = np.asarray(self.scorer.encode_queries(np.asarray(store.queries, dtype=np.float32)))
        ids, scores = exact_search(
            q,
            store.passages,
            k=k,
            chunk_size=self.chunk_size,
            passage_transform=self.scorer.encode_passages,
            progress=self.progress,
            backend=self.backend,
            source=str(getattr(store, "path", "vectors")),
            device=self.device,
        )
        return self._memo.put(store, Run(self.name, ids, scores))


class BM25System:
    """BM25 over the split's passage texts, queries tokenised the same way (:mod:`.bm25`).

    The index is built on first use per store path and kept for later calls.
    """

    def __init__(self, params: BM25Params | None = None, name: str = "bm25") -> None:
        self.params = params or BM25Params()
        self.name = name
        self._cache: tuple[str, BM25Index] | None = None
        self._memo = _RunMemo()

    def index_for(self, store: StoreLike) -> BM25Index:
        key = store_key(getattr(store, "base", store))  # a query view shares its index
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, BM25Index(store.passage_texts(), self.params))
        return self._cache[1]

    def retrieve(self, store: StoreLike, k: int = 1000) -> Run:
        k = min(k, int(store.n_passages))
        if (hit := self._memo.get(store, k)) is not None:
            return hit
        ids, scores = self.index_for(store).search(store.query_texts(), k)
        return self._memo.put(store, Run(self.name, ids, scores))


class FusionSystem:
    """Fusion of two systems' runs: ``method="rrf"`` (``rrf_k``) or ``"linear"`` (``weight``,
    ``norm``); both runs are retrieved at depth ``max(k, depth)``."""

    def __init__(
        self,
        a: System,
        b: System,
        method: str = "rrf",
        rrf_k: int = DEFAULT_RRF_K,
        weight: float = 0.5,
        norm: str = "minmax",
        depth: int = 1000,
        name: str | None = None,
    ) -> None:
        if method not in ("rrf", "linear"):
            raise ValueError(f"unknown fusion method {method!r}; known: rrf, linear")
        if norm not in NORMALISATIONS:
            raise ValueError(f"unknown normalisation {norm!r}; known: {', '.join(NORMALISATIONS)}")
        self.a, self.b = a, b
        self.method, self.rrf_k, self.weight, self.norm, self.depth = (
            method,
            rrf_k,
            weight,
            norm,
            depth,
        )
        self.name = name or (
            f"rrf:{a.name}+{b.name}"
            if method == "rrf"
            else f"linear-fusion:{a.name}+{b.name}:w={weight}"
        )

    def retrieve(self, store: StoreLike, k: int = 1000) -> Run:
        d = max(k, self.depth)
        ra, rb = self.a.retrieve(store, d), self.b.retrieve(store, d)
        if self.method == "rrf":
            return rrf(ra, rb, k=k, rrf_k=self.rrf_k, name=self.name)
        return linear_fusion(ra, rb, k=k, weight=self.weight, norm=self.norm, name=self.name)


class CheckpointSystem:
    """A checkpoint directory, loaded for the store it is asked to rank (fingerprint-checked)."""

    def __init__(self, path: str | Path, name: str | None = None, **options: Any) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self.options = options
        self._loaded: tuple[str | None, System] | None = None
        self._family: Any = None

    def system_for(self, store: StoreLike) -> System:
        """The loaded model's system for ``store`` (loaded once per encoder fingerprint).

        Raises:
            EncoderMismatchError: the checkpoint was trained on another encoder's vectors.
            TypeError: a dense family's model lacks ``encode_queries`` / ``encode_passages``.
        """
        from treerank.models.families import family, resolve
        from treerank.models.registry import load_model

        fp = getattr(store, "encoder_fingerprint", None)
        if self._loaded is None or self._loaded[0] != fp:
            model = load_model(
                self.path, expected_fingerprint=fp, expected_precision=vector_precision(store)
            )
            fam = family(model.model_type)
            system: System
            if fam.system is not None:
                make = resolve(fam.system)
                dev = self.options.get("device")
                on = {"device": dev} if dev is not None and takes_device(make) else {}
                system = make(model, name=self.name, **on)
            elif isinstance(model, DenseScorer):
                system = DenseSystem(model, name=self.name, **self.options)
            else:
                raise TypeError(
                    f"{self.path}: {type(model).__name__} (family {fam.name!r}) has no system hook "
                    "and is not a dense scorer (encode_queries / encode_passages)"
                )
            self._loaded = (fp, system)
            self._family = fam
        return self._loaded[1]

    def check_store(self, store: StoreLike) -> None:
        """Refuse ``store`` before any work when the checkpoint is bound to another encoder or
        to vectors of a precision the mixing rule keeps apart (reads ``config.json`` only).

        Raises:
            EncoderMismatchError / PrecisionMixError: see
                `treerank.models.checkpoint.check_binding`.
        """
        from treerank.models.checkpoint import check_checkpoint_store

        check_checkpoint_store(
            self.path, getattr(store, "encoder_fingerprint", None), vector_precision(store)
        )

    def _extra(self) -> dict[str, Any] | None:
        """The ``extra`` record of the checkpoint's ``config.json`` (of ``<dir>`` or of a run's
        ``<dir>/checkpoint``), read without loading the weights; ``None``: unreadable."""
        import json

        for cfg in (self.path / "config.json", self.path / "checkpoint" / "config.json"):
            try:
                doc = json.loads(cfg.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            extra = doc.get("extra") if isinstance(doc, dict) else None
            return extra if isinstance(extra, dict) else {}
        return None

    def kept_initialisation(self) -> bool:
        """Whether the checkpoint's training kept its initialisation (training summary
        ``kept_initialisation``: early-stopped at step 0), read from its ``config.json``
        without loading the weights; ``False`` when the file cannot say."""
        training = (self._extra() or {}).get("training") or {}
        return bool(isinstance(training, dict) and training.get("kept_initialisation"))

    def training_provenance(self) -> dict[str, Any] | None:
        """The checkpoint's record of its training store (``extra.train_provenance`` of its
        ``config.json``, :func:`treerank.evaluation.provenance.training_provenance`), read
        without loading the weights; ``None`` when it has none (an older checkpoint)."""
        prov = (self._extra() or {}).get("train_provenance")
        return prov if isinstance(prov, dict) else None

    def family_for(self, store: StoreLike) -> Any:
        """The :class:`~treerank.models.families.ModelFamily` of the loaded checkpoint."""
        self.system_for(store)
        return self._family

    def retrieve(self, store: StoreLike, k: int = 1000) -> Run:
        run = self.system_for(store).retrieve(store, k)
        return Run(self.name, run.ids, run.scores)


# ----------------------------------------------------------------------------- spec parsing
def _params(text: str, spec: str, allowed: dict[str, type]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not text:
        return out
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            raise ValueError(
                f"bad system spec {spec!r}: {item!r} is not one of "
                f"{', '.join(k + '=...' for k in allowed)}"
            )
        try:
            out[key] = allowed[key](value.strip())
        except ValueError:
            raise ValueError(
                f"bad system spec {spec!r}: {key}={value!r} is not a {allowed[key].__name__}"
            ) from None
        if isinstance(out[key], float) and not math.isfinite(out[key]):
            raise ValueError(f"bad system spec {spec!r}: {key}={value!r} is not a finite number")
    return out


def _in_range(
    spec: str, key: str, value: float, low: float, high: float | None = None, open_low: bool = False
) -> None:
    """Refuse a parsed spec parameter outside its range; the message gives the range."""
    below = value <= low if open_low else value < low
    if below or (high is not None and value > high):
        rng = f"> {low}" if open_low else f">= {low}"
        rng = rng if high is None else f"in [{low}, {high}]"
        raise ValueError(f"bad system spec {spec!r}: {key} must be {rng}, got {value}")


_BM25_KEYS: dict[str, type] = {"k1": float, "b": float, "method": str}
_RRF_KEYS: dict[str, type] = {"k": int, "depth": int}
_LIN_KEYS: dict[str, type] = {"w": float, "norm": str, "depth": int}


def _split_fusion(body: str, spec: str, keys: dict[str, type]) -> tuple[str, str, dict[str, Any]]:
    # the first '+' whose both sides start with a known kind ('bm25+rm3' holds a '+' itself)
    cuts = [i for i, c in enumerate(body) if c == "+"]
    known = [
        i
        for i in cuts
        if body[:i].partition(":")[0] in SYSTEM_KINDS
        and body[i + 1 :].partition(":")[0] in SYSTEM_KINDS
    ]
    cut = known[0] if known else (cuts[0] if cuts else -1)
    left, right = (body[:cut], body[cut + 1 :]) if cut >= 0 else (body, "")
    if not left or not right:
        raise ValueError(f"bad system spec {spec!r}: fusion needs two systems, '<A>+<B>'")
    params: dict[str, Any] = {}
    head, colon, tail = right.rpartition(":")
    if colon and tail and all(p.partition("=")[0].strip() in keys for p in tail.split(",")):
        params, right = _params(tail, spec, keys), head
    return left, right, params


def _build_cosine(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
    if body:
        raise ValueError(f"bad system spec {spec!r}: cosine takes no parameters")
    return DenseSystem(CosineScorer(), name="cosine", **opts)


def _build_bm25(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
    p = _params(body, spec, _BM25_KEYS)
    if p.get("method", "lucene") not in BM25_METHODS:
        raise ValueError(
            f"bad system spec {spec!r}: method must be one of {', '.join(BM25_METHODS)}"
        )
    _in_range(spec, "k1", p.get("k1", 0.0), 0.0)
    _in_range(spec, "b", p.get("b", 0.0), 0.0, 1.0)
    return BM25System(BM25Params(**p), name=spec)


def _build_rrf(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
    a, b, p = _split_fusion(body, spec, _RRF_KEYS)
    _in_range(spec, "k", p.get("k", DEFAULT_RRF_K), 0, open_low=True)  # 1 / (k + rank)
    _in_range(spec, "depth", p.get("depth", 1000), 1)
    return FusionSystem(
        build_system(a, cache, **opts),
        build_system(b, cache, **opts),
        "rrf",
        rrf_k=p.get("k", DEFAULT_RRF_K),
        depth=p.get("depth", 1000),
        name=spec,
    )


def _build_linear(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
    a, b, p = _split_fusion(body, spec, _LIN_KEYS)
    _in_range(spec, "w", p.get("w", 0.5), 0.0, 1.0)
    _in_range(spec, "depth", p.get("depth", 1000), 1)
    if p.get("norm", "minmax") not in NORMALISATIONS:
        raise ValueError(
            f"bad system spec {spec!r}: norm must be one of {', '.join(NORMALISATIONS)}"
        )
    return FusionSystem(
        build_system(a, cache, **opts),
        build_system(b, cache, **opts),
        "linear",
        weight=p.get("w", 0.5),
        norm=p.get("norm", "minmax"),
        depth=p.get("depth", 1000),
        name=spec,
    )


def _build_rm3(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
    from treerank.search.rm3 import RM3_KEYS, build_rm3

    try:
        return build_rm3(_params(body, spec, RM3_KEYS), name=spec)
    except ValueError as exc:  # RM3Params / BM25Params range checks
        if str(exc).startswith("bad system spec"):
            raise
        raise ValueError(f"bad system spec {spec!r}: {exc}") from None


def _build_ckpt(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
    if not body:
        raise ValueError(f"bad system spec {spec!r}: expected ckpt:<checkpoint dir>")
    # refused when the spec is built, before any system is scored (a missing checkpoint is bad
    # input, not a failure of one system halfway through a comparison)
    config = Path(body) / "config.json"
    if not config.is_file() and not (Path(body) / "checkpoint" / "config.json").is_file():
        what = "no such directory" if not Path(body).exists() else "not a treerank checkpoint"
        found = _checkpoints_below(Path(body)) if Path(body).is_dir() else []
        if found:
            what += "; checkpoints below it: " + ", ".join(f"ckpt:{f}" for f in found[:3])
            what += " ..." if len(found) > 3 else ""
        raise ValueError(f"bad system spec {spec!r}: {config}: missing ({what})")
    return CheckpointSystem(body, name=spec, **opts)


def _checkpoints_below(folder: Path, depth: int = 3) -> list[Path]:
    """Checkpoint directories (holding ``config.json`` + ``weights.safetensors``) up to
    ``depth`` levels below ``folder`` (a run's output or ``models/`` folder), sorted."""
    found: list[Path] = []
    for level in range(1, depth + 1):
        pattern = "/".join(["*"] * level) + "/weights.safetensors"
        found += [w.parent for w in folder.glob(pattern) if (w.parent / "config.json").is_file()]
    return sorted(found)


SystemBuilder = Callable[..., System]
"""``build(body, spec, cache=None, **options) -> System``: ``body`` is the spec after ``kind:``."""

SYSTEM_KINDS: dict[str, tuple[SystemBuilder, str]] = {}
"""The one table of ``--system`` spec kinds: kind -> (builder, help text)."""


def register_system_kind(
    kind: str, build: SystemBuilder, help: str, *, replace: bool = False
) -> None:
    """Add a ``--system`` spec kind (``<kind>`` or ``<kind>:<body>``).

    Args:
        kind: the prefix before the first ``:`` (no ``:`` in it).
        build: ``build(body, spec, cache=None, **options) -> System``; raise ``ValueError``
            naming ``spec`` on a malformed body. ``options`` are ``chunk_size``, ``progress``,
            ``backend``; nested specs are built with ``build_system(sub, cache, **options)``.
        help: one line for ``--help`` and error messages.
        replace: allow replacing an existing kind.

    Raises:
        ValueError: the kind is taken (without ``replace``) or malformed.
    """
    if not kind or ":" in kind:
        raise ValueError(f"bad system kind {kind!r}")
    if kind in SYSTEM_KINDS and not replace:
        raise ValueError(f"system kind {kind!r} is already registered")
    SYSTEM_KINDS[kind] = (build, help)


def _lazy(ref: str) -> SystemBuilder:
    """A builder named ``"module:attr"``, imported only when a spec of its kind is built.

    ``tests/test_layers.py`` checks the named module against this module's layer like an
    ``import`` statement.
    """
    module, _, name = ref.partition(":")

    def build(body: str, spec: str, cache: Any = None, **opts: Any) -> System:
        built: System = getattr(importlib.import_module(module), name)(
            body, spec, cache=cache, **opts
        )
        return built

    build.__qualname__ = build.__name__ = f"lazy[{ref}]"
    return build


_BUILT_IN: tuple[tuple[str, SystemBuilder, str], ...] = (
    ("cosine", _build_cosine, "cosine of the stored vectors (exact search)"),
    ("bm25", _build_bm25, "BM25 over passage texts; bm25:k1=0.9,b=0.4,method=lucene"),
    (
        "bm25+rm3",
        _build_rm3,
        "BM25 + RM3 feedback; bm25+rm3:fb_docs=10,fb_terms=10,orig_weight=0.5[,max_df=0.1,k1,b]",
    ),
    ("rrf", _build_rrf, "reciprocal rank fusion; rrf:<A>+<B>[:k=60]"),
    (
        "linear-fusion",
        _build_linear,
        "normalised linear fusion; linear-fusion:<A>+<B>[:w=0.5,norm=minmax|zscore]",
    ),
    ("ckpt", _build_ckpt, "a trained model directory (any family); ckpt:<dir>"),
    (
        "faiss",
        _lazy("treerank.search.faiss_index:build_faiss_system"),
        "a cached FAISS index; faiss:<flat|hnsw|ivfflat|ivfpq|ivfpqfs|int8|fp16|binary>[:k=v,...]",
    ),
    (
        "rescore",
        _lazy("treerank.search.rescore:build_rescore_system"),
        "exact dense rescoring (or cross-encoder reranking) of a first stage; "
        "rescore:<A>[:depth=100,scorer=cosine|ckpt:<dir>|ce:<dir>]",
    ),
    (
        "tuned-fusion",
        _lazy("treerank.evaluation.fusion_tuning:build_tuned_fusion"),
        "fusion with a weight tuned on another split; tuned-fusion:<A>+<B>"
        "[:method=linear|rrf,norm=zscore,on=train|cv,queries=heldout|all,metric=ndcg@10,grid=11]",
    ),
    (
        "adaptive-fusion",
        _lazy("treerank.evaluation.fusion_tuning:build_adaptive_fusion"),
        "query-adaptive fusion (ridge on query vector + score statistics, trained on another "
        "split); adaptive-fusion:<A>+<B>[:same keys as tuned-fusion]",
    ),
    (
        "db",
        _lazy("treerank.search.vector_db:build_db_system"),
        "a split exported to Qdrant (`treerank export`); db:<folder or http(s) url>[:collection]",
    ),
)
"""Every built-in kind, in ``--help`` order: one static table, filled when this module loads,
so that no kind depends on which other module was imported first. A kind whose module is heavy
or sits in a module of its own is named ``"module:attr"`` (:func:`_lazy`); ``tuned-fusion`` and
``adaptive-fusion`` live in ``evaluation/fusion_tuning.py``, a search-layer module (it needs
only the pure metric layer, see docs/DESIGN.md)."""

for _kind, _build, _help in _BUILT_IN:
    register_system_kind(_kind, _build, _help)


def build_system(spec: str, cache: dict[str, System] | None = None, **options: Any) -> System:
    """Parse a system spec (see module docstring) into a :class:`System`.

    Args:
        spec: e.g. ``"cosine"``, ``"bm25:k1=1.2,b=0.75"``, ``"rrf:bm25+cosine"``,
            ``"linear-fusion:bm25+cosine:w=0.3,norm=zscore"``, ``"ckpt:runs/linear"``.
        cache: spec -> system already built; pass one dict to several calls so that a system
            named twice (alone and inside a fusion) is built, and run, once.
        options: passed to dense systems (``chunk_size``, ``progress``, ``backend``, ``device``:
            where exact search runs, ``auto | cpu | cuda[:n]``; fusions and tuned fusions pass
            them to both sides).

    Raises:
        ValueError: an unknown system type or malformed parameters (the message lists the
            known types).
    """
    spec = spec.strip()
    if cache is not None and spec in cache:
        return cache[spec]
    kind, _, body = spec.partition(":")
    if kind not in SYSTEM_KINDS:
        from treerank.names import unknown_name

        msg = unknown_name(
            "system kind", kind, SYSTEM_KINDS, "`treerank evaluate --help` describes each kind"
        )
        raise ValueError(msg if spec == kind else f"system spec {spec!r}: {msg}")
    opts = {
        k: v for k, v in options.items() if k in ("chunk_size", "progress", "backend", "device")
    }
    system = SYSTEM_KINDS[kind][0](body, spec, cache=cache, **opts)
    if cache is not None:
        cache[spec] = system
    return system
