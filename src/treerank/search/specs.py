"""System specs parsed once into a typed tree of frozen nodes, and built with a typed context.

A spec string (``"rrf:bm25+cosine:k=10"``, ``"rescore:faiss:hnsw:depth=50,scorer=ckpt:m"``) is
parsed by :func:`parse_spec` into a tree of :class:`SystemSpec` nodes, once, at the edge (a CLI
option, a YAML field). From there on the library passes nodes: each node renders its canonical
spec (:meth:`SystemSpec.render`, ``parse_spec(node.render()) == node``), builds its
:class:`~treerank.search.systems.System` (:meth:`SystemSpec.build` with a :class:`BuildContext`),
checks its own parameters' ranges when it is made (so a node built in code is checked like a
parsed one), and answers tree queries (:func:`uses_trained_model`). The pipeline builds
checkpoint nodes (:class:`CheckpointSpec`) directly from a trained model's directory, never a
``"ckpt:<dir>"`` string.

Each node class is one kind (``kind``, ``summary``, ``syntax`` and its parameter fields);
:data:`SYSTEM_KINDS` lists them in ``--help`` order and ``docs/systems.md`` is generated from
it. :func:`register_system_kind` adds a node class from outside (a plugin, a test).

A node keeps the text it was parsed from (``text``, not part of equality): the built system's
name is the spec as the user wrote it (``bm25:b=0.75,k1=1.2`` stays that name in every table);
a node made in code is named by its rendering.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar, cast

from treerank.distributed.context import DistContext
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import DEFAULT_CHUNK_SIZE
from treerank.metrics.metrics import parse_metric
from treerank.models.checkpoint import CheckpointMixin
from treerank.models.cosine import CosineScorer
from treerank.models.cross_encoder import CE_PRECISIONS, DEFAULT_SCORE_BATCH, CEPrecision
from treerank.names import unknown_name
from treerank.search.bm25 import BM25_METHODS, DEFAULT_B, DEFAULT_K1, BM25Params
from treerank.search.ce_rescore import CrossEncoderRescoreSystem, pin_problem
from treerank.search.faiss_index import IndexSpec, faiss_system, parse_index_spec, render_index_spec
from treerank.search.fusion import DEFAULT_RRF_K, NORMALISATIONS, FusionMethod, Normalisation
from treerank.search.fusion_tuning import FUSION_METHODS, QUERY_SETS, QuerySet, TunedFusionSystem
from treerank.search.rescore import DEFAULT_DEPTH, RescoreSystem, split_params
from treerank.search.rm3 import (
    DEFAULT_FB_DOCS,
    DEFAULT_FB_TERMS,
    DEFAULT_MAX_DF,
    DEFAULT_ORIG_WEIGHT,
    RM3Params,
    RM3System,
)
from treerank.search.systems import (
    DENSE_CHECKPOINTS,
    BM25System,
    CheckpointLoader,
    CheckpointSystem,
    DenseOptions,
    DenseSystem,
    FusionSystem,
    System,
    checkpoint_problem,
)
from treerank.search.vector_db import DBLocation, build_db_system, exported_head, parse_db_spec

__all__ = [
    "SYSTEM_KINDS",
    "BM25Spec",
    "BuildContext",
    "CheckpointSpec",
    "CosineSpec",
    "CrossEncoderSpec",
    "DBSpec",
    "FaissSpec",
    "LinearFusionSpec",
    "RM3Spec",
    "RRFSpec",
    "RescoreSpec",
    "SpecError",
    "SystemSpec",
    "TunedFusionSpec",
    "AdaptiveFusionSpec",
    "build_system",
    "model_folders",
    "parse_spec",
    "register_system_kind",
    "spec_of",
    "system_uses_trained_model",
    "uses_trained_model",
]

DEFAULT_FUSION_DEPTH = 1000
"""Depth of both sides' runs a fusion reads (at least the asked ``k``)."""


@dataclass(frozen=True)
class BuildContext:
    """How the systems of a spec tree are built (every field typed; nothing is dropped).

    Attributes:
        chunk_size: passages per exact-search block of a dense system (``None``: one block).
        progress: tqdm bars in dense search and index builds.
        backend: exact-search kernel on the CPU, ``"faiss"`` | ``"torch"`` | ``"auto"``.
        device: where dense search, a family's own search and a cross-encoder compute.
        shard: under ``torchrun``, the process group whose rank's passage shard every dense
            system searches (top-k merged across ranks); ``None``: one process.
        cache: system name -> system already built; one dict shared by several builds makes a
            system named twice (alone and inside a fusion) be built, and run, once.
        checkpoints: how a ``ckpt:`` node loads its checkpoint
            (:class:`~treerank.search.systems.CheckpointLoader`): every layer above the family
            table passes ``treerank.families.CHECKPOINTS`` (every family, the forest too); the
            default knows this layer's dense families only.
    """

    chunk_size: int | None = DEFAULT_CHUNK_SIZE
    progress: bool = False
    backend: str = "faiss"
    device: Device = DEFAULT_DEVICE
    shard: DistContext | None = field(default=None, compare=False)
    cache: dict[str, System] | None = field(default=None, compare=False)
    checkpoints: CheckpointLoader = field(default=DENSE_CHECKPOINTS, compare=False)

    def dense_options(self) -> DenseOptions:
        """The dense systems' part of the context."""
        return DenseOptions(self.chunk_size, self.progress, self.backend, self.device, self.shard)


# --------------------------------------------------------------------------- parameter fields
ParamT = TypeVar("ParamT")


def param(
    default: ParamT,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    choices: tuple[str, ...] = (),
    key: str | None = None,
    help: str = "",
) -> ParamT:
    """A spec parameter field: its default, its range (``low``/``high``, ``open_low``: strict
    ``>``), its allowed words, its key in the spec text when not the field's name, and its
    ``help`` (one line in ``docs/systems.md``)."""
    meta = {
        "low": low,
        "high": high,
        "open_low": open_low,
        "choices": choices,
        "key": key,
        "help": help,
    }
    return field(default=default, metadata={"param": meta})


def _params_of(cls: type[SystemSpec]) -> list[dataclasses.Field[object]]:
    return [f for f in dataclasses.fields(cls) if "param" in f.metadata]


def _key(f: dataclasses.Field[object]) -> str:
    return str(f.metadata["param"]["key"] or f.name)


_CASTS: dict[str, type] = {"int": int, "float": float, "str": str}


def _cast(f: dataclasses.Field[object]) -> type:
    if f.metadata["param"]["choices"]:  # a Literal of words
        return str
    return _CASTS[str(f.type).replace("builtins.", "")]


def _range_text(low: float, high: float | None, open_low: bool) -> str:
    if high is not None:
        return f"in [{low}, {high}]"
    return f"> {low}" if open_low else f">= {low}"


def _fmt(value: object) -> str:
    return str(value)


def _bad(spec: str, problem: str) -> ValueError:
    return ValueError(f"bad system spec {spec!r}: {problem}")


def _params(text: str, spec: str, fields: list[dataclasses.Field[object]]) -> dict[str, object]:
    """``k=v,...`` -> field name -> typed value (keys, types and finiteness checked)."""
    by_key = {_key(f): f for f in fields}
    out: dict[str, object] = {}
    for item in text.split(",") if text else []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in by_key:
            raise _bad(spec, f"{item!r} is not one of {', '.join(k + '=...' for k in by_key)}")
        cast = _cast(by_key[key])
        try:
            parsed = cast(value.strip())
        except ValueError:
            raise _bad(spec, f"{key}={value!r} is not a {cast.__name__}") from None
        if isinstance(parsed, float) and not math.isfinite(parsed):
            raise _bad(spec, f"{key}={value!r} is not a finite number")
        out[by_key[key].name] = parsed
    return out


# ------------------------------------------------------------------------------------ nodes
Node = TypeVar("Node", bound="SystemSpec")


@dataclass(frozen=True)
class SystemSpec:
    """One node of a parsed system spec (a kind with its typed parameters and sub-systems).

    Class attributes: ``kind`` (the prefix before the first ``:``), ``summary`` (one line),
    ``syntax`` (the spec's shape, for ``--help`` and ``docs/systems.md``). Parameter fields are
    made with :func:`param`; their ranges are checked in ``__post_init__``.

    Attributes:
        text: the spec text it was parsed from (not part of equality); ``""`` for a node made
            in code.
    """

    kind: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    syntax: ClassVar[str] = ""

    text: str = field(default="", compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        for f in _params_of(type(self)):
            meta, value = f.metadata["param"], getattr(self, f.name)
            if meta["choices"] and value not in meta["choices"]:
                raise _bad(self.name, f"{_key(f)} must be one of {', '.join(meta['choices'])}")
            if isinstance(value, int | float) and meta["low"] is not None:
                if isinstance(value, float) and not math.isfinite(value):
                    raise _bad(self.name, f"{_key(f)}={value!r} is not a finite number")
                low, high, open_low = meta["low"], meta["high"], meta["open_low"]
                below = value <= low if open_low else value < low
                if below or (high is not None and value > high):
                    rng = _range_text(low, high, open_low)
                    raise _bad(self.name, f"{_key(f)} must be {rng}, got {value}")

    # -- parsing and rendering
    @classmethod
    def parse_body(cls: type[Node], body: str, spec: str) -> Node:
        """The node of ``<kind>:<body>`` (``spec`` is the whole text, for messages); the
        default reads ``k=v,...`` parameters into the node's :func:`param` fields.

        Raises:
            ValueError: an unknown key, a value of the wrong type or out of range.
        """
        return cls(**_params(body, spec, _params_of(cls)), text=spec)  # type: ignore[arg-type]

    def param_text(self) -> str:
        """``k=v,...`` of the parameters that differ from their defaults (``""``: none)."""
        return ",".join(
            f"{_key(f)}={_fmt(getattr(self, f.name))}"
            for f in _params_of(type(self))
            if getattr(self, f.name) != f.default
        )

    def render(self) -> str:
        """The canonical spec text (defaults left out); ``parse_spec(render()) == self``."""
        p = self.param_text()
        return f"{self.kind}:{p}" if p else self.kind

    @property
    def name(self) -> str:
        """The built system's name: the text it was parsed from, else its rendering."""
        return self.text or self.render()

    # -- the tree
    def children(self) -> tuple[SystemSpec, ...]:
        """The nodes directly below (a fusion's two sides, a rescore's first stage and scorer)."""
        return ()

    def walk(self) -> Iterator[SystemSpec]:
        """This node and every node below it, depth first."""
        yield self
        for child in self.children():
            yield from child.walk()

    def is_trained_model(self) -> bool:
        """Whether this node itself is a trained model (a checkpoint, a cross-encoder)."""
        return False

    # -- building
    def make(self, ctx: BuildContext) -> System:
        """The system of this node alone (sub-systems through :func:`build_system`)."""
        raise NotImplementedError(f"{type(self).__name__}.make")

    def build(self, ctx: BuildContext | None = None) -> System:
        """The :class:`~treerank.search.systems.System` of this tree (``ctx.cache``: a system
        of the same name already built is reused)."""
        return build_system(self, ctx)


@dataclass(frozen=True)
class CosineSpec(SystemSpec):
    """``cosine``: exact search on the stored vectors, L2-normalised."""

    kind: ClassVar[str] = "cosine"
    summary: ClassVar[str] = "cosine of the stored vectors (exact search)"
    syntax: ClassVar[str] = "cosine"

    @classmethod
    def parse_body(cls, body: str, spec: str) -> CosineSpec:
        if body:
            raise _bad(spec, "cosine takes no parameters")
        return cls(text=spec)

    def make(self, ctx: BuildContext) -> System:
        return DenseSystem.with_options(CosineScorer(), "cosine", ctx.dense_options())


@dataclass(frozen=True)
class BM25Spec(SystemSpec):
    """``bm25[:k1=..,b=..,method=..]``: BM25 over the passage texts (:mod:`.bm25`)."""

    kind: ClassVar[str] = "bm25"
    summary: ClassVar[str] = "BM25 over passage texts"
    syntax: ClassVar[str] = "bm25:k1=0.9,b=0.4,method=lucene"

    k1: float = param(DEFAULT_K1, low=0.0)
    b: float = param(DEFAULT_B, low=0.0, high=1.0)
    method: str = param("lucene", choices=BM25_METHODS)

    def make(self, ctx: BuildContext) -> System:
        return BM25System(BM25Params(self.k1, self.b, self.method), name=self.name)


@dataclass(frozen=True)
class RM3Spec(SystemSpec):
    """``bm25+rm3[:...]``: BM25 + RM3 pseudo-relevance feedback (:mod:`.rm3`)."""

    kind: ClassVar[str] = "bm25+rm3"
    summary: ClassVar[str] = "BM25 + RM3 feedback"
    syntax: ClassVar[str] = "bm25+rm3:fb_docs=10,fb_terms=10,orig_weight=0.5[,max_df=0.1,k1,b]"

    fb_docs: int = param(DEFAULT_FB_DOCS)
    fb_terms: int = param(DEFAULT_FB_TERMS)
    orig_weight: float = param(DEFAULT_ORIG_WEIGHT)
    max_df: float = param(DEFAULT_MAX_DF)
    k1: float = param(DEFAULT_K1)
    b: float = param(DEFAULT_B)

    def __post_init__(self) -> None:
        super().__post_init__()
        try:  # the ranges live in the two parameter records
            self.rm3_params(), self.bm25_params()
        except ValueError as exc:
            raise _bad(self.name, str(exc)) from None

    def rm3_params(self) -> RM3Params:
        return RM3Params(self.fb_docs, self.fb_terms, self.orig_weight, self.max_df)

    def bm25_params(self) -> BM25Params:
        return BM25Params(self.k1, self.b)

    def make(self, ctx: BuildContext) -> System:
        return RM3System(self.rm3_params(), self.bm25_params(), name=self.name)


def _fusion_cuts(body: str, keys: set[str]) -> Iterator[tuple[str, str, str]]:
    """The readings ``(A, B, params)`` of ``"<A>+<B>[:k=v,...]"``, most likely first: at each
    ``+`` whose both sides start with a known kind (``bm25+rm3`` holds a ``+`` itself), else at
    the first ``+``; the parameters are the text after B's last ``:`` when every key in it is a
    fusion key."""
    cuts = [i for i, c in enumerate(body) if c == "+"]
    known = [
        i
        for i in cuts
        if body[:i].partition(":")[0] in SYSTEM_KINDS
        and body[i + 1 :].partition(":")[0] in SYSTEM_KINDS
    ]
    for cut in known or cuts[:1]:
        left, right = body[:cut], body[cut + 1 :]
        head, colon, tail = right.rpartition(":")
        if colon and tail and all(p.partition("=")[0].strip() in keys for p in tail.split(",")):
            yield left, head, tail
        else:
            yield left, right, ""


def _parse_fusion(body: str, spec: str, keys: set[str]) -> tuple[SystemSpec, SystemSpec, str]:
    """The two sides (parsed) and the parameter text of a fusion body: the first reading whose
    both sides parse (:func:`_fusion_cuts`).

    Raises:
        ValueError: no two sides, or the first reading's error when none parses.
    """
    first: ValueError | None = None
    for left, right, tail in _fusion_cuts(body, keys):
        if not left or not right:
            continue
        try:
            return parse_spec(left), parse_spec(right), tail
        except ValueError as exc:
            first = first or exc
    raise first or _bad(spec, "fusion needs two systems, '<A>+<B>'")


@dataclass(frozen=True)
class FusionSpec(SystemSpec):
    """A fusion of two systems ``<A>+<B>[:params]`` (the shared shape of the fusion kinds)."""

    a: SystemSpec = field(default_factory=CosineSpec)
    b: SystemSpec = field(default_factory=CosineSpec)

    @classmethod
    def parse_body(cls: type[Node], body: str, spec: str) -> Node:
        fields = _params_of(cls)
        a, b, tail = _parse_fusion(body, spec, {_key(f) for f in fields})
        params = _params(tail, spec, fields)
        return cls(a=a, b=b, **params, text=spec)  # type: ignore[call-arg, arg-type]

    def render(self) -> str:
        p = self.param_text()
        right = self.b.render()
        keys = {_key(f) for f in _params_of(type(self))}
        if not p and next(_fusion_cuts(f"x+{right}", keys))[2]:  # B's own tail would be
            p = f"depth={getattr(self, 'depth', DEFAULT_FUSION_DEPTH)}"  # read as the fusion's
        return f"{self.kind}:{self.a.render()}+{right}" + (f":{p}" if p else "")

    def children(self) -> tuple[SystemSpec, ...]:
        return (self.a, self.b)


@dataclass(frozen=True)
class RRFSpec(FusionSpec):
    """``rrf:<A>+<B>[:k=60,depth=1000]``: Reciprocal Rank Fusion of two systems."""

    kind: ClassVar[str] = "rrf"
    summary: ClassVar[str] = "reciprocal rank fusion"
    syntax: ClassVar[str] = "rrf:<A>+<B>[:k=60]"

    k: int = param(DEFAULT_RRF_K, low=0, open_low=True)  # 1 / (k + rank)
    depth: int = param(DEFAULT_FUSION_DEPTH, low=1)

    def make(self, ctx: BuildContext) -> System:
        return FusionSystem(
            build_system(self.a, ctx),
            build_system(self.b, ctx),
            "rrf",
            rrf_k=self.k,
            depth=self.depth,
            name=self.name,
        )


@dataclass(frozen=True)
class LinearFusionSpec(FusionSpec):
    """``linear-fusion:<A>+<B>[:w=0.5,norm=minmax,depth=1000]`` (``w`` weighs ``A``)."""

    kind: ClassVar[str] = "linear-fusion"
    summary: ClassVar[str] = "normalised linear fusion"
    syntax: ClassVar[str] = "linear-fusion:<A>+<B>[:w=0.5,norm=minmax|zscore]"

    w: float = param(0.5, low=0.0, high=1.0)
    norm: Normalisation = param("minmax", choices=tuple(NORMALISATIONS))
    depth: int = param(DEFAULT_FUSION_DEPTH, low=1)

    def make(self, ctx: BuildContext) -> System:
        return FusionSystem(
            build_system(self.a, ctx),
            build_system(self.b, ctx),
            "linear",
            weight=self.w,
            norm=self.norm,
            depth=self.depth,
            name=self.name,
        )


@dataclass(frozen=True)
class TunedFusionSpec(FusionSpec):
    """``tuned-fusion:<A>+<B>[:...]``: fusion with a weight tuned on another split
    (:mod:`treerank.search.fusion_tuning`)."""

    kind: ClassVar[str] = "tuned-fusion"
    summary: ClassVar[str] = "fusion with a weight tuned on another split"
    syntax: ClassVar[str] = (
        "tuned-fusion:<A>+<B>[:method=linear|rrf,norm=zscore,on=train|cv,queries=heldout|all,"
        "metric=ndcg@10,grid=11]"
    )
    adaptive: ClassVar[bool] = False

    method: FusionMethod = param("linear", choices=FUSION_METHODS)
    norm: Normalisation = param("zscore", choices=tuple(NORMALISATIONS))
    k: int = param(DEFAULT_RRF_K, low=0, open_low=True)
    on: str = param("train")
    queries: QuerySet = param("heldout", choices=QUERY_SETS)
    metric: str = param("ndcg@10")
    grid: int = param(11, low=2)
    max_queries: int = param(2000, low=1)
    seed: int = param(0)
    depth: int = param(DEFAULT_FUSION_DEPTH, low=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            parse_metric(self.metric)
        except ValueError as exc:
            raise _bad(self.name, str(exc)) from None

    def make(self, ctx: BuildContext) -> System:
        return TunedFusionSystem(
            build_system(self.a, ctx),
            build_system(self.b, ctx),
            adaptive=self.adaptive,
            method=self.method,
            norm=self.norm,
            rrf_k=self.k,
            on=self.on,
            queries=self.queries,
            metric=self.metric,
            grid=self.grid,
            max_queries=self.max_queries,
            seed=self.seed,
            depth=self.depth,
            name=self.name,
        )


@dataclass(frozen=True)
class AdaptiveFusionSpec(TunedFusionSpec):
    """``adaptive-fusion:<A>+<B>[:...]``: a per-query weight (ridge on the query vector and
    score statistics) trained on another split."""

    kind: ClassVar[str] = "adaptive-fusion"
    summary: ClassVar[str] = (
        "query-adaptive fusion (ridge on query vector + score statistics, trained on another split)"
    )
    syntax: ClassVar[str] = "adaptive-fusion:<A>+<B>[:same keys as tuned-fusion]"
    adaptive: ClassVar[bool] = True


@dataclass(frozen=True)
class CheckpointSpec(SystemSpec):
    """``ckpt:<dir>``: any trained checkpoint (dense head, DRT, forest); its family says how it
    searches (:class:`~treerank.search.systems.CheckpointSystem`)."""

    kind: ClassVar[str] = "ckpt"
    summary: ClassVar[str] = "a trained model directory (any family)"
    syntax: ClassVar[str] = "ckpt:<dir>"

    path: Path = Path()

    @classmethod
    def parse_body(cls, body: str, spec: str) -> CheckpointSpec:
        """Refused here, before any system is scored, when ``body`` holds no checkpoint (a
        missing checkpoint is bad input, not a failure of one system halfway through)."""
        if not body:
            raise _bad(spec, "expected ckpt:<checkpoint dir>")
        problem = checkpoint_problem(Path(body))
        if problem:
            raise _bad(spec, problem)
        return cls(Path(body), text=spec)

    def render(self) -> str:
        return f"ckpt:{self.path}"

    def is_trained_model(self) -> bool:
        return True

    def make(self, ctx: BuildContext) -> System:
        return CheckpointSystem(self.path, self.name, ctx.dense_options(), ctx.checkpoints)


@dataclass(frozen=True)
class CrossEncoderSpec(SystemSpec):
    """``ce:<dir>``: a cross-encoder checkpoint; only a rescoring scorer, never a first stage."""

    kind: ClassVar[str] = "ce"
    summary: ClassVar[str] = "a cross-encoder directory (rescore scorer only)"
    syntax: ClassVar[str] = "ce:<dir>"

    path: Path = Path()

    def render(self) -> str:
        return f"ce:{self.path}"

    def is_trained_model(self) -> bool:
        return True


Scorer = CosineSpec | CheckpointSpec | CrossEncoderSpec


def _scorer(text: str, spec: str, key: str = "scorer") -> Scorer:
    text = text.strip()
    kind, _, path = text.partition(":")
    if text == "cosine":
        return CosineSpec(text=text)
    if kind in (CheckpointSpec.kind, CrossEncoderSpec.kind):
        if not path.strip():
            raise _bad(spec, f"{key}={text!r}: expected {kind}:<dir>")
        cls = CheckpointSpec if kind == CheckpointSpec.kind else CrossEncoderSpec
        return cls(Path(path.strip()), text=text)
    raise _bad(spec, f"{key} must be cosine, ckpt:<dir> or ce:<dir>, got {text!r}")


@dataclass(frozen=True)
class RescoreSpec(SystemSpec):
    """``rescore:<A>[:depth=100,scorer=...]``: exact dense rescoring of ``A``'s top ``depth``
    (:mod:`.rescore`), or cross-encoder reranking with ``scorer=ce:<dir>``, whose pairs are
    scored ``batch`` at a time in ``precision`` (``fp32`` / ``bf16`` / ``auto``: the measured
    probe, :class:`~treerank.models.cross_encoder.CrossEncoderScorer`), its weights pinned by
    ``fingerprint=sha256:<hex>`` (the whole fingerprint or a prefix of >= 8 hex digits: loaded
    weights of another fingerprint are refused before any pair is scored,
    :class:`~treerank.search.ce_rescore.CrossEncoderMismatchError`); ``batch``, ``precision``
    and ``fingerprint`` are refused with any other scorer."""

    kind: ClassVar[str] = "rescore"
    summary: ClassVar[str] = "exact dense rescoring (or cross-encoder reranking) of a first stage"
    syntax: ClassVar[str] = (
        "rescore:<A>[:depth=100,scorer=cosine|ckpt:<dir>|ce:<dir>"
        "[,batch=32,precision=fp32|bf16|auto,fingerprint=sha256:<hex>]]"
    )

    first: SystemSpec = field(default_factory=CosineSpec)
    depth: int = param(DEFAULT_DEPTH, low=1)
    scorer: Scorer = field(default_factory=CosineSpec)
    batch: int = param(DEFAULT_SCORE_BATCH, low=1)
    precision: str = param("fp32", choices=CE_PRECISIONS)
    fingerprint: str = param(
        "",
        help="scorer=ce: only: pins the cross-encoder, whose loaded weights' fingerprint "
        "(cross_encoder.json's) must start with this sha256:<hex> (whole, or >= 8 hex digits), "
        "else it is refused before any pair is scored; empty: not pinned",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        ce = isinstance(self.scorer, CrossEncoderSpec)
        options = self.batch != DEFAULT_SCORE_BATCH or self.precision != "fp32"
        if not ce and (options or self.fingerprint):
            raise _bad(
                self.name, "batch=, precision= and fingerprint= apply to scorer=ce:<dir> only"
            )
        problem = pin_problem(self.fingerprint) if self.fingerprint else None
        if problem:
            raise _bad(self.name, problem)

    @classmethod
    def parse_body(cls, body: str, spec: str) -> RescoreSpec:
        keys = ("depth", "scorer", "batch", "precision", "fingerprint")
        inner, tail = split_params(body, keys)
        if not inner:
            raise _bad(spec, "expected rescore:<first stage>[:depth=N,scorer=SPEC]")
        scorer: Scorer = CosineSpec()
        numbers = []
        for item in tail.split(",") if tail else []:
            key, _, value = item.partition("=")
            if key.strip() == "scorer":
                scorer = _scorer(value, spec)
            else:
                numbers.append(item)
        params = _params(",".join(numbers), spec, _params_of(cls))
        return cls(parse_spec(inner), scorer=scorer, **params, text=spec)  # type: ignore[arg-type]

    def render(self) -> str:
        p = [f"depth={self.depth}"] if self.depth != DEFAULT_DEPTH else []
        p += [] if isinstance(self.scorer, CosineSpec) else [f"scorer={self.scorer.render()}"]
        p += [f"batch={self.batch}"] if self.batch != DEFAULT_SCORE_BATCH else []
        p += [f"precision={self.precision}"] if self.precision != "fp32" else []
        p += [f"fingerprint={self.fingerprint}"] if self.fingerprint else []
        return f"rescore:{self.first.render()}" + (":" + ",".join(p) if p else "")

    def children(self) -> tuple[SystemSpec, ...]:
        return (self.first, self.scorer)

    def make(self, ctx: BuildContext) -> System:
        first = build_system(self.first, ctx)
        if isinstance(self.scorer, CrossEncoderSpec):  # reads texts: it reranks, no towers
            return CrossEncoderRescoreSystem(
                first,
                self.scorer.render(),
                self.depth,
                self.name,
                batch_size=self.batch,
                precision=cast(CEPrecision, self.precision),
                device=ctx.device,
                fingerprint=self.fingerprint or None,
            )
        return RescoreSystem(first, self.scorer.render(), self.depth, name=self.name)


@dataclass(frozen=True)
class FaissSpec(SystemSpec):
    """``faiss:<kind>[:k=v,...]``: a cached FAISS index (:mod:`.faiss_index`); the kind's
    parameters and ranges are those of :data:`~treerank.search.faiss_index.INDEX_KINDS`."""

    kind: ClassVar[str] = "faiss"
    summary: ClassVar[str] = "a cached FAISS index"
    syntax: ClassVar[str] = "faiss:<flat|hnsw|ivfflat|ivfpq|ivfpqfs|int8|fp16|binary>[:k=v,...]"

    index: IndexSpec = field(default_factory=lambda: IndexSpec("flat"))
    over: CosineSpec | CheckpointSpec = field(default_factory=CosineSpec)

    @classmethod
    def parse_body(cls, body: str, spec: str) -> FaissSpec:
        index = parse_index_spec(body, spec)
        over = _scorer(index.over, spec, "over")
        if isinstance(over, CrossEncoderSpec):
            raise _bad(spec, f"over must be cosine or ckpt:<dir>, got {index.over!r}")
        return cls(index, over, text=spec)

    def render(self) -> str:
        return f"faiss:{render_index_spec(self.index)}"

    def children(self) -> tuple[SystemSpec, ...]:
        return (self.over,)

    def make(self, ctx: BuildContext) -> System:
        return faiss_system(self.index, self.name, progress=ctx.progress)


@dataclass(frozen=True)
class DBSpec(SystemSpec):
    """``db:<folder or url>[:collection]``: a split exported to Qdrant (``treerank export``)."""

    kind: ClassVar[str] = "db"
    summary: ClassVar[str] = "a split exported to Qdrant (`treerank export`)"
    syntax: ClassVar[str] = "db:<folder or http(s) url>[:collection]"

    location: DBLocation = field(default_factory=lambda: DBLocation(path=Path(".")))
    collection: str | None = None

    @classmethod
    def parse_body(cls, body: str, spec: str) -> DBSpec:
        loc, collection = parse_db_spec(body, spec)
        return cls(loc, collection, text=spec)

    def render(self) -> str:
        return f"db:{self.location}" + (f":{self.collection}" if self.collection else "")

    def is_trained_model(self) -> bool:
        """Whether the exported collection holds a trained head's towers (read from the
        collection's metadata; ``False`` when it cannot be read)."""
        return exported_head(self.location, self.collection, self.name) is not None

    def make(self, ctx: BuildContext) -> System:
        return build_db_system(self.location, self.collection, self.name)


# ------------------------------------------------------------------------------- the table
SYSTEM_KINDS: dict[str, type[SystemSpec]] = {}
"""The one table of ``--system`` spec kinds: kind -> node class (``summary``, ``syntax``)."""


def register_system_kind(node: type[SystemSpec], *, replace: bool = False) -> None:
    """Add a ``--system`` spec kind: a :class:`SystemSpec` subclass with ``kind``,
    ``summary``, ``syntax``, ``make(ctx)`` and (for a body other than ``k=v,...``)
    ``parse_body``.

    Raises:
        ValueError: the kind is taken (without ``replace``) or malformed.
    """
    kind = node.kind
    if not kind or ":" in kind:
        raise ValueError(f"bad system kind {kind!r}")
    if kind in SYSTEM_KINDS and not replace:
        raise ValueError(f"system kind {kind!r} is already registered")
    SYSTEM_KINDS[kind] = node


for _node in (
    CosineSpec,
    BM25Spec,
    RM3Spec,
    RRFSpec,
    LinearFusionSpec,
    CheckpointSpec,
    FaissSpec,
    RescoreSpec,
    TunedFusionSpec,
    AdaptiveFusionSpec,
    DBSpec,
):
    register_system_kind(_node)


def spec_parameters(node: type[SystemSpec]) -> list[tuple[str, str, str]]:
    """``(key, default, range or choices)`` of a node class's spec parameters, in spec order
    (``docs/systems.md``); the range text is ``""`` when the value is not range-checked, and
    a field's ``help`` follows it (after ``; `` when both are there)."""
    out = []
    for f in _params_of(node):
        meta = f.metadata["param"]
        if meta["choices"]:
            rng = " \\| ".join(meta["choices"])
        elif meta["low"] is not None:
            rng = _range_text(meta["low"], meta["high"], meta["open_low"])
        else:
            rng = ""
        rng = "; ".join(t for t in (rng, meta["help"]) if t)
        out.append((_key(f), _fmt(f.default), rng))
    return out


def kind_help() -> list[tuple[str, str]]:
    """``(kind, "summary; syntax")`` of every kind, in table order (``--help``, the docs)."""
    return [
        (k, f"{n.summary}; {n.syntax}" if n.syntax != k else n.summary)
        for k, n in SYSTEM_KINDS.items()
    ]


class SpecError(ValueError):
    """A spec that does not parse; ``kind`` is the (outermost) kind whose body is bad, ``None``
    when the kind itself is unknown (the text may be no spec at all, e.g. a path)."""

    def __init__(self, message: str, kind: str | None) -> None:
        super().__init__(message)
        self.kind = kind


def parse_spec(spec: str) -> SystemSpec:
    """Parse a system spec (``kind`` or ``kind:body``) into its node tree, once.

    Raises:
        SpecError: an unknown kind (the message suggests the closest one and lists them) or
            malformed / out-of-range parameters (the message quotes the spec and names the
            problem).
    """
    spec = spec.strip()
    kind, _, body = spec.partition(":")
    if kind not in SYSTEM_KINDS:
        msg = unknown_name(
            "system kind", kind, SYSTEM_KINDS, "`treerank evaluate --help` describes each kind"
        )
        raise SpecError(msg if spec == kind else f"system spec {spec!r}: {msg}", None)
    try:
        return SYSTEM_KINDS[kind].parse_body(body, spec)
    except ValueError as exc:
        raise SpecError(str(exc), kind) from None


_SPEC_OF: weakref.WeakKeyDictionary[object, SystemSpec] = weakref.WeakKeyDictionary()


def build_system(spec: SystemSpec | str, ctx: BuildContext | None = None) -> System:
    """The :class:`~treerank.search.systems.System` of a spec (a node, or text parsed here).

    Args:
        spec: a node tree, or a spec string (``"cosine"``, ``"bm25:k1=1.2,b=0.75"``,
            ``"rrf:bm25+cosine"``, ``"ckpt:runs/linear"``; see ``docs/systems.md``).
        ctx: how to build (:class:`BuildContext`; default: its defaults). ``ctx.cache`` maps
            system names to systems already built.

    Raises:
        ValueError: a spec string that does not parse (see :func:`parse_spec`).
    """
    node = parse_spec(spec) if isinstance(spec, str) else spec
    ctx = ctx or BuildContext()
    if ctx.cache is not None and node.name in ctx.cache:
        return ctx.cache[node.name]
    system = node.make(ctx)
    if ctx.cache is not None:
        ctx.cache[node.name] = system
    try:
        _SPEC_OF[system] = node
    except TypeError:  # not weak-referenceable: the tree query falls back to the type
        pass
    return system


def spec_of(system: System) -> SystemSpec | None:
    """The node a system was built from by :func:`build_system` (``None``: built in code)."""
    try:
        return _SPEC_OF.get(system)
    except TypeError:
        return None


def uses_trained_model(spec: SystemSpec) -> bool:
    """Whether a spec tree is, or is built on, a trained model: any node below it is a
    checkpoint, a cross-encoder, or a collection exported with a trained head. Reports use
    it to print the memorisation caveat only where a trained model is involved."""
    return any(node.is_trained_model() for node in spec.walk())


def model_folders(spec: str) -> list[str]:
    """The model folders a system spec reads (``ckpt:<dir>`` and ``ce:<dir>`` nodes anywhere in
    its tree), sorted, each once: what a stage key must digest besides the spec's text.

    Raises:
        SpecError: ``spec`` does not parse (as :func:`parse_spec`).
    """
    nodes = parse_spec(spec).walk()
    return sorted({str(n.path) for n in nodes if isinstance(n, CheckpointSpec | CrossEncoderSpec)})


def system_uses_trained_model(system: System) -> bool:
    """:func:`uses_trained_model` of the node ``system`` was built from; a system made in
    code: a :class:`CheckpointSystem`, or a loaded model of a trainable family."""
    node = spec_of(system)
    if node is not None:
        return uses_trained_model(node)
    if isinstance(system, CheckpointSystem):
        return True
    if isinstance(system, CheckpointMixin):
        return bool(type(system).trained)  # a loaded model: trained unless its family is not
    return False
