"""FAISS indexes as retrieval systems: built once from the memory-mapped store, cached, reused.

Kinds (:data:`INDEX_KINDS`, one table feeding spec parsing and ``--help``); every index scores by
inner product (a cosine over the default ``over=cosine`` vectors, which are L2-normalised):

- ``flat``: ``IndexFlatIP``, exact (the reference).
- ``hnsw``: ``IndexHNSWFlat``; build ``M=32, ef_construction=40``; search ``ef_search=128``.
- ``ivfflat``: ``IVF{nlist},Flat``; build ``nlist, train_size``; search ``nprobe=32``.
- ``ivfpq``: ``OPQ{m},IVF{nlist},PQ{m}x{nbits}np`` (``np``: no polysemous training); build
  ``nlist, m=48, nbits=8, opq=20, train_size``, where ``opq`` is the number of OPQ training
  iterations (FAISS's default is 50; each trains ``m`` k-means of ``2**8`` centroids, the slowest
  part of any build here; ``opq=0`` drops the rotation); search ``nprobe=32``.
- ``ivfpqfs``: ``[OPQ{m},]IVF{nlist},PQ{m}x4fs`` (FAISS's ``IndexIVFPQFastScan``: 4-bit codes
  scanned with SIMD lookup tables held in registers, André et al. VLDB 2015); build
  ``nlist, m=48, opq=0, refine=0, train_size``; search ``nprobe=32, k_factor=4``. The
  4-bit codes rank coarsely: either ``rescore=N`` (exact rescoring of a few hundred candidates
  from the store) or ``refine=8`` (FAISS ``IndexRefine`` over ``SQ8`` codes held in RAM, one byte
  per dimension: the fast-scan top ``k * k_factor`` re-ranked by their 8-bit codes; with
  ``k_factor=1`` only the top ``k`` are re-ranked, so the first ranks depend on ``k``).
  Filled by FAISS's own ``add``, :data:`IVF_ADD_CHUNK` rows at a time (fast-scan lists are
  packed in blocks of 32 codes, so they cannot be pre-sized and written in place).
- ``int8``: ``SQ8`` (8 bits per dimension, per-dimension range trained); build ``train_size``.
- ``fp16``: ``SQfp16`` (half-precision storage).
- ``binary``: ``IndexLSH`` with trained thresholds (1 bit per dimension, set when the value
  exceeds the dimension's median; Hamming distance); build ``nbits`` (0 = the dimension),
  ``train_size``; exact rescoring of the top 1000 by default.

The IVF kinds' ``nlist`` (inverted lists, i.e. k-means centroids) defaults to ``0`` = chosen from
the store's passage count ``n`` by :func:`default_nlist`: ``4 * sqrt(n)``, clipped to
``[1, n // 39]`` so that every centroid gets the 39 training points FAISS asks for (5,183
passages: 132 lists; 1M: 4,000). An ``nlist`` given in the spec is used as given (FAISS warns
when it has fewer than ``39 * nlist`` training points).

Common parameters: ``over=cosine`` (default; the stored vectors, L2-normalised) or
``over=ckpt:<dir>`` (a trained dense head's passage-tower output; its query tower encodes the
queries; the checkpoint must match the store's encoder); ``rescore=N`` (0 = off; ``binary``
defaults to 1000): the index's top ``max(k, N)`` are rescored exactly with the same scorer
(:mod:`treerank.search.rescore`); ``resident=1`` keeps the store's file pages that rescoring read
mapped (RSS grows with the rows touched, up to the store's size; repeated searches skip the page
faults, which dominate rescoring from a 1.5 GB memory map; default 0 releases them). Specs:
``faiss:hnsw:M=32,ef_search=128``, ``faiss:ivfpq:nlist=1024,m=48,nprobe=32,rescore=200``,
``faiss:ivfpqfs:nlist=4096,m=192,refine=8,k_factor=4``, ``faiss:int8``, ``faiss:binary``.

**Building** (:func:`build_index`): trained kinds are trained on ``train_size`` passages sampled
uniformly (seed 0; ``0``, the default, means ``max(50 * nlist, 20000)``; at most ``n``; the
number used is recorded as ``meta["build"]["train_size"]``), then passages are added
``chunk_size`` rows at a time from the memory map (pages dropped after each chunk with
:func:`~treerank.kernels.topk.release_pages`), so peak memory is the index plus one chunk plus the
training sample, never the raw corpus on top of a compressed index. The training sample is
gathered in blocks whose file pages are released as it goes. The IVF kinds are filled by
:func:`add_ivf_presized` (every inverted list allocated once at its final length, so the codes
are never held twice by a growing list), :data:`IVF_ADD_CHUNK` rows at a time. Measured on
1M x 384 (``bench/results/index/synthetic-1m/``): IVF-Flat's build peaks below 2 GiB with its
1.44 GiB of codes.

**Caching**: the index is written to ``<store>/indexes/<kind>-<key>/`` (``index.faiss`` +
``meta.json``, written into a temporary directory renamed into place) where ``key`` hashes the
store's signature (:func:`store_signature`), the kind, its build parameters and the scorer
(checkpoint file digests). Search parameters (``nprobe``, ``ef_search``, ``rescore``) are not in
the key: one built index serves them all.

**Parameter ranges** (:data:`PARAM_RANGES`) are checked where a spec is parsed, the range in
the message: ``M >= 2`` (FAISS crashes at 1), ``ef_search, ef_construction, nprobe, m,
k_factor >= 1``, ``ivfpq`` ``nbits`` in ``[1, 16]``, ``nprobe <= nlist`` when both are given.
At search time ``ef_search`` below ``k`` is raised to ``k`` and ``nprobe`` above the built
``nlist`` (an automatic ``nlist`` on a small store) is clipped to it. Each trained kind's
training-size need (:func:`min_train_rows`: ``nlist`` points, ``2**nbits`` for ``ivfpq``'s PQ
codebooks, 16 for ``ivfpqfs``) is checked before a build, so a small store gets a clear error
with a way out instead of a FAISS C++ exception.

**Finiteness**: a build refuses NaN/inf passages (:class:`~treerank.kernels.topk.
NonFiniteVectorError`, naming the store file and row): every stored block is checked as it is
read to be added (and every row of the training sample as it is gathered), in the same pass,
so a ``passages.bin`` damaged after ``embed`` is caught whatever ``meta.json``'s ``finite``
record says; a head's passage-tower output is checked chunk by chunk; every query vector is
checked at search. FAISS itself would drop a NaN passage (``flat``, ``hnsw``) or give it a
finite score (``int8``, ``binary``). The check costs one ``isfinite`` pass over each block
already in memory (``bench/bench_finite_check.py``).

Results are sorted by score descending, ties by ascending passage id (the evaluation contract);
ids FAISS could not fill (an IVF probe that reaches fewer than ``k`` passages) are ``-1`` with
score ``-inf``. ``binary`` scores are negated Hamming distances (in ``[-nbits, 0]``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
from tqdm.auto import tqdm

from treerank.atomic import atomic_write_json
from treerank.encoders.precision import vector_precision
from treerank.kernels.topk import (
    RUN_DEPTH,
    check_finite,
    check_rows_finite,
    release_pages,
    sort_rows,
)
from treerank.kernels.vectors import F32, I64, ROW_CHUNK, Vecs
from treerank.models.base import DenseScorer
from treerank.names import unknown_name
from treerank.search.rescore import RescoreSystem, dense_scorer
from treerank.search.run import Run
from treerank.storelike import StoreLike, meta_object

if TYPE_CHECKING:
    import faiss  # no type information: its objects are opaque to mypy

Params = dict[str, int]
"""An index kind's build or search parameters by name (all integers)."""
MakeIndex = Callable[[int, Params], "faiss.Index"]
"""``make(dim, build parameters) -> an empty FAISS index`` of one kind."""
Transform = Callable[[F32], Vecs]
"""The scorer's passage tower, ``float32 (c, d) -> float (c, d')``."""


class _TransformChain(Protocol):
    """``IndexPreTransform.chain``: a SWIG vector of transforms (FAISS's stubs call it a list)."""

    def at(self, i: int) -> faiss.VectorTransform: ...

    def size(self) -> int: ...


INDEX_FILE = "index.faiss"
INDEX_META = "meta.json"
INDEXES_DIR = "indexes"
DEFAULT_ADD_CHUNK = ROW_CHUNK
IVF_ADD_CHUNK = 16_384
TRAIN_GATHER_BLOCK = 4_096
MIN_TRAIN = 20_000


@dataclass(frozen=True)
class IndexKind:
    """One FAISS index kind: its parameters (name -> (type, default)) and how to make it."""

    name: str
    help: str
    build: dict[str, tuple[type[int], int]]
    search: dict[str, tuple[type[int], int]]
    make: MakeIndex
    trained: bool = True
    default_rescore: int = 0
    presized: bool = True  # IVF kinds: filled by add_ivf_presized (False: faiss add in chunks)


def _ip() -> int:
    import faiss

    return int(faiss.METRIC_INNER_PRODUCT)


def _make_flat(d: int, p: Params) -> faiss.Index:
    import faiss

    return faiss.IndexFlatIP(d)


def _make_hnsw(d: int, p: Params) -> faiss.Index:
    import faiss

    index = faiss.IndexHNSWFlat(d, p["M"], _ip())
    index.hnsw.efConstruction = p["ef_construction"]
    return index


def _make_factory(template: str) -> MakeIndex:
    def make(d: int, p: Params) -> faiss.Index:
        import faiss

        return faiss.index_factory(d, template.format(**p), _ip())

    return make


def _make_ivfpq(d: int, p: Params) -> faiss.Index:
    import faiss

    if d % p["m"]:
        raise ValueError(f"ivfpq: m={p['m']} sub-quantizers must divide the dimension {d}")
    opq = f"OPQ{p['m']}," if p["opq"] else ""
    # "np": no polysemous training. FAISS's factory turns it on for IVF-PQ; it re-orders each
    # sub-quantizer's centroids by simulated annealing so that Hamming distances between codes
    # mimic theirs, which only polysemous filtering (polysemous_ht > 0, never set here) uses. The
    # order leaves every ADC distance unchanged; its cost (an annealing run per sub-quantizer)
    # does not depend on the passages, and a 3,840-d build spent minutes in it (issue 26).
    index = faiss.index_factory(d, f"{opq}IVF{p['nlist']},PQ{p['m']}x{p['nbits']}np", _ip())
    if p["opq"]:  # OPQ alternates PQ training and a rotation fit: opq = its iterations
        _set_opq_iterations(index, p["opq"])
    return index


def _set_opq_iterations(index: faiss.Index, niter: int) -> None:
    """Set the iterations of the OPQ rotation that heads ``index`` (an ``IndexPreTransform``)."""
    import faiss

    # the downcasts return the concrete classes; FAISS's stubs only say Index / VectorTransform
    chain = cast("faiss.IndexPreTransform", faiss.downcast_index(index))
    first = cast(_TransformChain, chain.chain).at(0)
    rotation = cast("faiss.OPQMatrix", faiss.downcast_VectorTransform(first))
    rotation.niter = niter


def _make_ivfpqfs(d: int, p: Params) -> faiss.Index:
    import faiss

    if d % p["m"]:
        raise ValueError(f"ivfpqfs: m={p['m']} sub-quantizers must divide the dimension {d}")
    if p["refine"] not in (0, 8):
        raise ValueError(f"ivfpqfs: refine={p['refine']} must be 0 (none) or 8 (SQ8 codes)")
    opq = f"OPQ{p['m']}," if p["opq"] else ""
    refine = ",Refine(SQ8)" if p["refine"] else ""
    index = faiss.index_factory(d, f"{opq}IVF{p['nlist']},PQ{p['m']}x4fs{refine}", _ip())
    if p["opq"]:
        outer = cast("faiss.IndexRefine", faiss.downcast_index(index)) if refine else None
        _set_opq_iterations(index if outer is None else outer.base_index, p["opq"])
    return index


def _make_binary(d: int, p: Params) -> faiss.Index:
    import faiss

    return faiss.IndexLSH(d, p["nbits"] or d, False, True)


_TRAIN = {"train_size": (int, 0)}
_NLIST = {"nlist": (int, 0)}  # 0: default_nlist(n passages), resolved by resolve_build
INDEX_KINDS: dict[str, IndexKind] = {
    k.name: k
    for k in (
        IndexKind("flat", "exact inner product (IndexFlatIP)", {}, {}, _make_flat, trained=False),
        IndexKind(
            "hnsw",
            "HNSW graph; M=32,ef_construction=40,ef_search=128",
            {"M": (int, 32), "ef_construction": (int, 40)},
            {"ef_search": (int, 128)},
            _make_hnsw,
            trained=False,
        ),
        IndexKind(
            "ivfflat",
            "inverted file, raw vectors; nlist=0 (auto),nprobe=32",
            {**_NLIST, **_TRAIN},
            {"nprobe": (int, 32)},
            _make_factory("IVF{nlist},Flat"),
        ),
        IndexKind(
            "ivfpq",
            "OPQ + inverted file + product quantisation; "
            "nlist=0 (auto),m=48,nbits=8,opq=20,nprobe=32",
            {**_NLIST, "m": (int, 48), "nbits": (int, 8), "opq": (int, 20), **_TRAIN},
            {"nprobe": (int, 32)},
            _make_ivfpq,
        ),
        IndexKind(
            "ivfpqfs",
            "inverted file + 4-bit fast-scan PQ (IndexIVFPQFastScan), optional OPQ; "
            "nlist=0 (auto),m=48,opq=0,refine=0,nprobe=32,k_factor=4",
            {**_NLIST, "m": (int, 48), "opq": (int, 0), "refine": (int, 0), **_TRAIN},
            {"nprobe": (int, 32), "k_factor": (int, 4)},
            _make_ivfpqfs,
            presized=False,  # fast-scan lists are packed in blocks of 32: no in-place writes
        ),
        IndexKind(
            "int8", "8-bit scalar quantisation (SQ8)", dict(_TRAIN), {}, _make_factory("SQ8")
        ),
        IndexKind(
            "fp16", "16-bit float storage (SQfp16)", {}, {}, _make_factory("SQfp16"), trained=False
        ),
        IndexKind(
            "binary",
            "1-bit codes (median thresholds), Hamming search + exact rescoring; rescore=1000",
            {"nbits": (int, 0), **_TRAIN},
            {},
            _make_binary,
            default_rescore=1000,
        ),
    )
}
_COMMON: dict[str, tuple[type[int], int] | tuple[type[str], str]] = {
    "rescore": (int, -1),
    "over": (str, "cosine"),
    "resident": (int, 0),
}


#: The allowed range of every integer parameter, ``name -> (low, high or None)``, checked where a
#: spec is parsed (:func:`parse_index_spec`) with the range in the message. ``M=1`` crashes
#: FAISS's HNSW (its level multiplier is ``1 / log M``); PQ codebooks beyond 16 bits need more
#: than 65,536 training passages per sub-quantiser; ``nlist=0`` and ``train_size=0`` mean
#: "automatic", ``nbits=0`` of ``binary`` means "the dimension".
PARAM_RANGES: dict[str, tuple[int, int | None]] = {
    "M": (2, None),
    "ef_construction": (1, None),
    "ef_search": (1, None),
    "nlist": (0, None),
    "nprobe": (1, None),
    "m": (1, None),
    "opq": (0, None),
    "train_size": (0, None),
    "k_factor": (1, None),
    "refine": (0, 8),
    "rescore": (0, None),
    "resident": (0, 1),
}
_KIND_RANGES: dict[tuple[str, str], tuple[int, int | None]] = {
    ("ivfpq", "nbits"): (1, 16),
    ("binary", "nbits"): (0, None),
}


def _range_text(low: int, high: int | None) -> str:
    return f">= {low}" if high is None else f"in [{low}, {high}]"


@dataclass(frozen=True)
class IndexSpec:
    """A parsed ``faiss:<kind>:<params>`` spec.

    Attributes:
        kind: a key of :data:`INDEX_KINDS`.
        build: build parameters with defaults filled in (they key the cache).
        search: search parameters with defaults filled in.
        rescore: exact rescoring depth (0 = off).
        over: ``"cosine"`` or ``"ckpt:<dir>"``.
        resident: rescoring keeps the store's file pages it read mapped (see
            :func:`~treerank.search.rescore.rescore`'s ``release``).
    """

    kind: str
    build: Params = field(default_factory=dict)
    search: Params = field(default_factory=dict)
    rescore: int = 0
    over: str = "cosine"
    resident: bool = False

    def first_stage(self) -> IndexSpec:
        """The same index without rescoring."""
        return IndexSpec(self.kind, dict(self.build), dict(self.search), 0, self.over)


def parse_index_spec(text: str, spec: str | None = None, what: str = "system spec") -> IndexSpec:
    """Parse ``"<kind>[:k=v,...]"`` (the part after ``faiss:``).

    Args:
        text: the part after ``faiss:``.
        spec: the whole spec, as the messages quote it (default ``faiss:<text>``).
        what: what the messages call the spec (``"bad <what> '<spec>': ..."``), e.g.
            ``"index spec"`` where an index rather than a system is asked for.

    Raises:
        ValueError: unknown kind (the message suggests the closest kind, e.g. ``hnsw`` for
            ``hnws``, and lists the kinds), unknown key (it lists the kind's keys), a value of
            the wrong type, or a negative value.
    """
    spec = spec or f"faiss:{text}"
    kind_name, _, body = text.partition(":")
    if kind_name not in INDEX_KINDS:
        raise ValueError(
            f"bad {what} {spec!r}: "
            + unknown_name(
                "index kind",
                kind_name,
                INDEX_KINDS,
                "`treerank index build --help` gives each kind's parameters",
            )
        )
    kind = INDEX_KINDS[kind_name]
    allowed: dict[str, tuple[type[int], int] | tuple[type[str], str]] = {
        **kind.build,
        **kind.search,
        **_COMMON,
    }
    values: dict[str, int | str] = {key: default for key, (_, default) in allowed.items()}
    given: set[str] = set()
    for item in body.split(",") if body else []:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in allowed:
            raise ValueError(
                f"bad {what} {spec!r}: {item!r} is not one of "
                + ", ".join(f"{k}=..." for k in allowed)
            )
        typ = allowed[key][0]
        try:
            parsed = typ(value)
        except ValueError:
            raise ValueError(
                f"bad {what} {spec!r}: {key}={value!r} is not a {typ.__name__}"
            ) from None
        values[key] = parsed
        given.add(key)
        if isinstance(parsed, int):  # typ is int
            low, high = _KIND_RANGES.get((kind_name, key), PARAM_RANGES.get(key, (0, None)))
            if parsed < low or (high is not None and parsed > high):
                raise ValueError(
                    f"bad {what} {spec!r}: {key} must be {_range_text(low, high)}, got {parsed}"
                )
    ints = {key: v for key, v in values.items() if isinstance(v, int)}  # all but over
    if {"nprobe", "nlist"} <= given and ints["nlist"] and ints["nprobe"] > ints["nlist"]:
        raise ValueError(
            f"bad {what} {spec!r}: nprobe must be <= nlist (it probes that many of the "
            f"{ints['nlist']} inverted lists), got nprobe={ints['nprobe']}"
        )
    if "train_size" in given and ints["train_size"]:
        need = min_train_rows(kind_name, ints)
        if ints["train_size"] < need:
            raise ValueError(
                f"bad {what} {spec!r}: train_size must be >= {need} for these parameters "
                f"({_train_needs(kind_name, ints)}), got {ints['train_size']}"
            )
    rescore = ints["rescore"]
    return IndexSpec(
        kind=kind_name,
        build={k: ints[k] for k in kind.build},
        search={k: ints[k] for k in kind.search},
        rescore=kind.default_rescore if rescore < 0 else int(rescore),
        over=str(values["over"]),
        resident=bool(ints["resident"]),
    )


def min_train_rows(kind: str, build: Params) -> int:
    """The fewest training passages the index kind ``kind`` with ``build`` parameters can train
    on: ``nlist`` for the IVF kinds' coarse k-means (one point per centroid; FAISS warns below
    39), ``2**nbits`` for ``ivfpq``'s PQ codebooks and ``16`` for ``ivfpqfs``'s 4-bit ones
    (each sub-quantiser is a k-means of that many centroids), 1 otherwise."""
    need = 1
    if kind in ("ivfflat", "ivfpq", "ivfpqfs"):
        need = max(need, int(build.get("nlist", 0)))
    if kind == "ivfpq":
        need = max(need, 2 ** int(build.get("nbits", 8)))
    if kind == "ivfpqfs":
        need = max(need, 16)
    return need


def _train_needs(kind: str, build: Params) -> str:
    parts = []
    if kind in ("ivfflat", "ivfpq", "ivfpqfs") and int(build.get("nlist", 0)):
        parts.append(f"nlist={build['nlist']} centroids need one point each")
    if kind == "ivfpq":
        nbits = int(build.get("nbits", 8))
        parts.append(f"PQ codebooks of nbits={nbits} need 2**{nbits} = {2**nbits} points")
    if kind == "ivfpqfs":
        parts.append("4-bit fast-scan PQ codebooks need 16 points")
    return "; ".join(parts) or "at least one point"


def check_trainable(spec: IndexSpec, n_passages: int, where: str) -> None:
    """Refuse, before any work, an index the store's passages cannot train.

    ``spec`` has its automatic parameters resolved (:func:`resolve_build`).

    Raises:
        ValueError: the training sample (``train_size``, at most ``n_passages``) is smaller than
            :func:`min_train_rows`; the message names the need and the way out (for ``ivfpq``
            on a small store: a smaller ``nbits``, or ``faiss:ivfflat`` / ``faiss:flat``).
    """
    if not INDEX_KINDS[spec.kind].trained:
        return
    rows = min(int(spec.build.get("train_size", 0)) or n_passages, n_passages)
    need = min_train_rows(spec.kind, spec.build)
    if rows >= need:
        return
    advice = ""
    if spec.kind == "ivfpq":
        fit = max(1, min(16, int(np.log2(max(rows, 2)))))
        advice = f"; use nbits<={fit} ({2**fit} centroids), or faiss:ivfflat / faiss:flat"
    elif spec.kind == "ivfpqfs":
        advice = "; use faiss:ivfflat or faiss:flat"
    elif "nlist" in spec.build:
        advice = f"; use nlist<={rows}, or leave nlist out"
    raise ValueError(
        f"{where}: faiss:{spec.kind} cannot be trained on {rows} passages: "
        f"{_train_needs(spec.kind, spec.build)}{advice}"
    )


def default_nlist(n_passages: int) -> int:
    """The IVF kinds' default number of inverted lists for ``n_passages`` passages.

    ``round(4 * sqrt(n))`` (the low end of FAISS's guideline of 4-16 * sqrt(n) lists), clipped
    to ``[1, n // 39]``: FAISS's k-means wants at least 39 training points per centroid and
    warns below that, and at most ``n`` passages are there to train on. E.g. 5,183 -> 132,
    20,958 -> 537, 1,000,000 -> 4,000.
    """
    return max(1, min(round(4 * float(np.sqrt(n_passages))), n_passages // 39))


def resolve_build(spec: IndexSpec, n_passages: int) -> IndexSpec:
    """``spec`` with its automatic build parameters filled in for a store of ``n_passages``:
    ``nlist=0`` becomes :func:`default_nlist`, and ``train_size`` (trained kinds) becomes the
    number of passages the training sample will hold: ``max(50 * nlist, 20000)`` for ``0``,
    at most ``n_passages``. The result keys the cache and is recorded in the index's
    ``meta["build"]``, so automatic and equal explicit values share one index."""
    build = dict(spec.build)
    if "nlist" in build and int(build["nlist"]) == 0:
        build["nlist"] = default_nlist(n_passages)
    if "train_size" in build:
        size = int(build["train_size"]) or max(50 * int(build.get("nlist", 0)), MIN_TRAIN)
        build["train_size"] = min(size, n_passages)
    return replace(spec, build=build)


def store_signature(store: StoreLike) -> str:
    """Hex SHA-256 identifying a store split's passage vectors: shown to people as the store's
    *vectors digest* (``index info``, ``/info``), since ``meta.json``'s ``signature`` is another
    hash (the embed run's plan) that this one includes.

    From ``meta.json``: the embed signature (data digest, encoder fingerprint, prompts, batching)
    and the data digest, counts and dimension; for Go-tool stores without them, the passage
    file's size and modification time.
    """
    meta = store.meta
    parts: dict[str, object] = {
        "signature": meta.get("signature"),
        "data": meta.get("data_sha256"),
        "n_passages": int(store.n_passages),
        "dim": int(store.passages.shape[1]),
        "fingerprint": meta_object(meta, "encoder").get("fingerprint"),
    }
    if not meta.get("signature"):
        p = Path(store.path) / "passages.bin"
        st = p.stat() if p.is_file() else None
        parts["file"] = [
            str(p.resolve()),
            st.st_size if st else None,
            st.st_mtime_ns if st else None,
        ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def scorer_key(over: str) -> str:
    """``"cosine"``, or a digest of the checkpoint's files for ``ckpt:<dir>``."""
    if over == "cosine":
        return "cosine"
    path = Path(over.partition(":")[2])
    h = hashlib.sha256()
    for name in ("config.json", "weights.safetensors"):
        p = path / name
        if p.is_file():
            with open(p, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
    return "ckpt:" + h.hexdigest()


def index_key(store: StoreLike, spec: IndexSpec) -> str:
    """Cache key of the index ``spec`` builds on ``store`` (hex SHA-256)."""
    doc = {
        "store": store_signature(store),
        "kind": spec.kind,
        "build": spec.build,
        "scorer": scorer_key(spec.over),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def peak_rss_mib() -> float:
    """Peak resident set of this process so far (``VmHWM``), MiB; 0 where unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class FaissIndex:
    """A built FAISS index and its ``meta.json`` (kind, parameters, store signature, sizes)."""

    def __init__(
        self, index: faiss.Index, meta: dict[str, object], path: Path | None = None
    ) -> None:
        self.index = index
        self.meta = meta
        self.path = path

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: Vecs, k: int, params: Params | None = None) -> tuple[I64, F32]:
        """Top-``k`` passages for each query vector.

        Args:
            queries: ``float32 (nq, d)`` query search vectors (through the scorer's query tower).
            k: results per query, clipped to the index size.
            params: search parameters (``nprobe``, ``ef_search``); defaults from the kind.

        Returns:
            ``(ids int64 (nq, k'), scores float32 (nq, k'))`` sorted by score descending, ties by
            ascending id; ``-1`` / ``-inf`` where the index returned fewer than ``k``.

        ``ef_search`` below ``k`` is raised to ``k`` (HNSW keeps only ``ef_search`` candidates, so
        a smaller value returns fewer than ``k`` hits); ``nprobe`` above the index's ``nlist``
        is clipped to ``nlist`` (every list probed).

        Raises:
            ValueError: a query dimension that differs from the index's.
            NonFiniteVectorError: a query vector holds NaN or inf.
        """
        import faiss

        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.index.d:
            raise ValueError(f"queries {q.shape} do not match the index dimension {self.index.d}")
        check_finite(q, "query", str(self.path or "queries"))
        k = min(int(k), self.ntotal)
        if k <= 0 or q.shape[0] == 0:
            return np.empty((q.shape[0], 0), np.int64), np.empty((q.shape[0], 0), np.float32)
        p = {**{key: d for key, (_, d) in INDEX_KINDS[self.kind].search.items()}, **(params or {})}
        ps = faiss.ParameterSpace()
        if "nprobe" in p:
            ivf = faiss.try_extract_index_ivf(self.index)
            nlist = int(ivf.nlist) if ivf is not None else int(p["nprobe"])
            ps.set_index_parameter(self.index, "nprobe", max(1, min(int(p["nprobe"]), nlist)))
        if "ef_search" in p:
            ps.set_index_parameter(self.index, "efSearch", max(int(p["ef_search"]), k))
        if "k_factor" in p and isinstance(self.index, faiss.IndexRefine):
            ps.set_index_parameter(self.index, "k_factor_rf", max(1, int(p["k_factor"])))
        dist, ids = self.index.search(q, k)
        ids = ids.astype(np.int64, copy=False)
        scores = -dist if self.kind == "binary" else dist
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
        return sort_rows(ids, scores)


def _train_sample(
    passages: Vecs,
    size: int,
    transform: Transform,
    seed: int,
    source: str | None = None,
) -> F32:
    """``size`` passages drawn uniformly (sorted ids), through ``transform``, ``float32``.

    With ``source`` every gathered stored row is checked finite as it is read
    (:class:`~treerank.kernels.topk.NonFiniteVectorError` naming ``source`` and the store row).

    Read :data:`TRAIN_GATHER_BLOCK` sampled rows at a time with each block's file pages released
    after it: a uniform sample touches pages all over the file, and the kernel maps neighbouring
    cached pages with every fault, so one gather of 100K rows from a 1.5 GB memmap leaves most
    of the file in the resident set.
    """
    n = passages.shape[0]
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(size, n), replace=False))
    parts = []
    for start in range(0, len(rows), TRAIN_GATHER_BLOCK):
        block = rows[start : start + TRAIN_GATHER_BLOCK]
        part = np.asarray(passages[block], dtype=np.float32)
        if source is not None:
            check_rows_finite(part, block, "passage", source)
        parts.append(part)
        release_pages(passages, int(block[0]), int(block[-1]) + 1)
    sample = np.concatenate(parts) if parts else np.empty((0, passages.shape[1]), np.float32)
    return np.ascontiguousarray(transform(sample), dtype=np.float32)


def _is_ivf(index: faiss.Index) -> bool:
    import faiss

    return faiss.try_extract_index_ivf(index) is not None


def add_ivf_presized(
    index: faiss.Index,
    passages: Vecs,
    transform: Transform,
    chunk_size: int = DEFAULT_ADD_CHUNK,
    on_chunk: Callable[[int], object] | None = None,
    check: Callable[[F32, F32, int], None] | None = None,
) -> None:
    """Add every passage to a trained, empty FAISS IVF index, each inverted list allocated once.

    ``index.add`` appends to growing ``std::vector`` lists, whose capacity doubling can hold up
    to twice the codes' size at the peak (an IVF-Flat index of 1M x 384 is 1.5 GB of codes). Two
    passes over the memory map instead: (1) assign every passage to its list with the coarse
    quantizer (8 bytes per passage kept); (2) size each list to its final length, then encode
    each chunk (``IndexIVF.encode_vectors``: raw vectors, or PQ codes of the residual) and write
    the codes in place (``update_entries``). Passages keep ascending ids within each list, as
    ``index.add`` leaves them, so the index is the same one. Peak memory: the codes, the
    assignments and one chunk.

    Args:
        index: a trained ``IndexIVF`` or an ``IndexPreTransform`` over one (OPQ), with
            ``ntotal == 0``.
        passages: ``(n, d)`` stored vectors (array or read-only memmap), read ``chunk_size`` rows
            at a time; their pages are released after each chunk.
        transform: the scorer's passage tower, ``float32 (c, d) -> float32 (c, d')``.
        chunk_size: rows per chunk.
        on_chunk: called with each chunk's row count during the second pass (a progress bar).
        check: called as ``check(stored_block, transformed_block, first_row)`` on every chunk
            before it is used (the build's finiteness check); it raises to stop.

    Raises:
        ValueError: an index that is not IVF, untrained or not empty.
    """
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None or not index.is_trained or index.ntotal:
        raise ValueError("add_ivf_presized needs a trained, empty IVF index")
    chain = faiss.downcast_index(index)
    transforms: list[faiss.VectorTransform] = []
    if isinstance(chain, faiss.IndexPreTransform):
        steps = cast(_TransformChain, chain.chain)
        transforms = [steps.at(i) for i in range(steps.size())]
    n = int(passages.shape[0])

    def vectors(start: int) -> F32:
        stop = min(start + chunk_size, n)
        block = np.asarray(passages[start:stop], dtype=np.float32)
        x = np.ascontiguousarray(transform(block), dtype=np.float32)
        if check is not None:
            check(block, x, start)
        for t in transforms:
            x = np.ascontiguousarray(t.apply(x), dtype=np.float32)
        release_pages(passages, start, stop)
        return x

    lists = np.empty(n, dtype=np.int64)
    for start in range(0, n, chunk_size):
        lists[start : start + chunk_size] = ivf.quantizer.assign(vectors(start), 1)[:, 0]
    counts = np.bincount(lists, minlength=ivf.nlist)
    invlists = ivf.invlists
    assert invlists is not None  # a trained IVF index has its lists
    for lst in np.flatnonzero(counts):
        invlists.resize(int(lst), int(counts[lst]))
    filled = np.zeros(ivf.nlist, dtype=np.int64)
    code_size = int(invlists.code_size)
    for start in range(0, n, chunk_size):
        x = vectors(start)
        m = x.shape[0]
        assigned = np.ascontiguousarray(lists[start : start + m])
        codes = np.empty((m, code_size), dtype=np.uint8)
        ivf.encode_vectors(
            m, faiss.swig_ptr(x), faiss.swig_ptr(assigned), faiss.swig_ptr(codes), False
        )
        del x
        order = np.argsort(assigned, kind="stable")
        ids = np.ascontiguousarray(start + order, dtype=np.int64)
        codes = np.ascontiguousarray(codes[order])
        sorted_lists = assigned[order]
        bounds = np.flatnonzero(np.diff(sorted_lists)) + 1
        for a, b in zip(np.r_[0, bounds], np.r_[bounds, m], strict=True):
            target = int(sorted_lists[a])
            invlists.update_entries(
                target,
                int(filled[target]),
                int(b - a),
                faiss.swig_ptr(ids[a:b]),
                faiss.swig_ptr(codes[a:b]),
            )
            filled[target] += b - a
        if on_chunk is not None:
            on_chunk(m)
    ivf.ntotal = n
    index.ntotal = n


def build_index(
    store: StoreLike,
    spec: IndexSpec | str,
    index_dir: str | Path | None = None,
    scorer: DenseScorer | None = None,
    chunk_size: int = DEFAULT_ADD_CHUNK,
    progress: bool = False,
    force: bool = False,
    seed: int = 0,
) -> FaissIndex:
    """Build (or load from the cache) the index ``spec`` over a store split's passages.

    Args:
        store: an :class:`~treerank.store.EmbeddingStore` split (passages memory-mapped).
        spec: an :class:`IndexSpec` or the text after ``faiss:`` (``"hnsw:M=16"``); automatic
            parameters (``nlist=0``) are set for the store by :func:`resolve_build`.
        index_dir: cache directory (default ``<store>/indexes``).
        scorer: the dense scorer whose passage tower feeds the index; default loaded from
            ``spec.over`` against the store's encoder fingerprint.
        chunk_size: passages added per step.
        progress: show a tqdm bar over passages.
        force: rebuild even when a cached index exists.
        seed: training-sample seed.

    Returns:
        the index; ``meta`` holds kind, parameters, key, store signature, counts, training rows,
        build seconds, index bytes and the process's peak RSS (MiB) after the build.

    Raises:
        ValueError: a store with fewer passages than ``nlist`` (IVF) or than the kind's training
            needs (:func:`check_trainable`: ``ivfpq`` needs ``2**nbits``), a bad ``m``, a cache
            directory that cannot be written; all before any training.
        NonFiniteVectorError: a stored passage vector (checked as it is read, whatever
            ``meta.json`` records) or a passage-tower output holds NaN or inf.
    """
    import faiss

    spec = parse_index_spec(spec) if isinstance(spec, str) else spec
    n = int(store.n_passages)
    spec = resolve_build(spec, n)
    kind = INDEX_KINDS[spec.kind]
    key = index_key(store, spec)
    root = Path(index_dir) if index_dir is not None else Path(store.path) / INDEXES_DIR
    dest = root / f"{spec.kind}-{key[:16]}"
    if not force and (dest / INDEX_META).is_file() and (dest / INDEX_FILE).is_file():
        cached = open_index(dest)
        if cached.meta.get("key") == key:
            return cached
    if scorer is None:
        scorer = dense_scorer(spec.over, store.encoder_fingerprint, vector_precision(store))
    _check_buildable(spec, n, str(store.path))
    # the stored vectors are checked block by block as they are read (training sample, then
    # every added chunk), never by trusting meta.json; a tower's output (over=ckpt:...) too
    check_tower = spec.over != "cosine"
    source = str(Path(store.path) / "passages.bin")
    t0 = time.perf_counter()
    first = np.asarray(store.passages[:1], dtype=np.float32)
    check_finite(first, "passage", source)  # before the tower and FAISS see it
    probe = np.asarray(scorer.encode_passages(first))
    d = int(probe.shape[1])
    index = kind.make(d, spec.build)
    n_train = 0
    if kind.trained:
        n_train = int(spec.build.get("train_size", min(n, MIN_TRAIN)))
        sample = _train_sample(store.passages, n_train, scorer.encode_passages, seed, source)
        if check_tower:
            check_finite(sample, "passage-tower output (training sample)", source)
        index.train(sample)
        del sample
    bar = tqdm(total=n, unit="passage", disable=not progress, desc=f"index {spec.kind}")

    def check(block: F32, out: F32, start: int) -> None:
        check_finite(block, "passage", source, start)
        if check_tower:
            check_finite(out, "passage-tower output", source, start)

    _add_passages(index, kind.presized, store.passages, scorer, chunk_size, bar.update, check)
    bar.close()
    build_seconds = time.perf_counter() - t0
    meta = {
        "kind": spec.kind,
        "build": spec.build,
        "over": spec.over,
        "key": key,
        "store": str(store.path),
        "store_signature": store_signature(store),
        "encoder": {"name": store.encoder_name, "fingerprint": store.encoder_fingerprint},
        "n_passages": n,
        "dim": d,
        "finite": True,  # every added vector was checked as it was read
        "train_rows": n_train,
        "build_seconds": build_seconds,
        "peak_rss_mib": peak_rss_mib(),
        "faiss_version": faiss.__version__,
        "created_unix": time.time(),
    }
    _write_index(index, meta, dest)
    return FaissIndex(index, meta, dest)


def _check_buildable(spec: IndexSpec, n: int, where: str) -> None:
    """Refuse, before any training, an IVF ``nlist`` above the passage count and a kind whose
    training needs more passages (:func:`check_trainable`). Raises ValueError."""
    nlist = int(spec.build.get("nlist", 0))
    if nlist and n < nlist:
        raise ValueError(
            f"{where}: {n} passages cannot train nlist={nlist} inverted lists; "
            f"use nlist <= {n}, or leave nlist out (the default for {n} passages is "
            f"{default_nlist(n)})"
        )
    check_trainable(spec, n, where)


def _add_passages(
    index: faiss.Index,
    presized: bool,
    passages: Vecs,
    scorer: DenseScorer,
    chunk_size: int,
    advance: Callable[[int], object],
    check: Callable[[F32, F32, int], None],
) -> None:
    """Add every passage's tower output to ``index``, ``chunk_size`` rows at a time (IVF: at
    most ``IVF_ADD_CHUNK``, a chunk costing 3 copies of its codes; a pre-sized IVF kind through
    :func:`add_ivf_presized`), each block ``check``-ed as it is read and its pages released."""
    if presized and _is_ivf(index):
        ivf_chunk = min(chunk_size, IVF_ADD_CHUNK)
        add_ivf_presized(index, passages, scorer.encode_passages, ivf_chunk, advance, check)
        return
    n = int(passages.shape[0])
    step = min(chunk_size, IVF_ADD_CHUNK) if _is_ivf(index) else chunk_size
    for start in range(0, n, step):
        block = np.asarray(passages[start : start + step], dtype=np.float32)
        out = np.ascontiguousarray(scorer.encode_passages(block), dtype=np.float32)
        check(block, out, start)
        index.add(out)
        advance(block.shape[0])
        del block
        release_pages(passages, start, min(start + step, n))


def _write_index(index: faiss.Index, meta: dict[str, object], dest: Path) -> None:
    """Write ``index`` and its ``meta`` (gaining ``index_bytes``) into a temporary sibling of
    ``dest``, then swap it in: a crash leaves the earlier cache entry or none, never half of
    one. Raises ValueError when the cache directory cannot be written."""
    import faiss

    root = dest.parent
    tmp = root / f".{dest.name}.{os.getpid()}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise ValueError(
            f"{root}: cannot write the index cache ({exc.strerror}); give another index_dir "
            "(--index-dir)"
        ) from None
    try:
        faiss.write_index(index, str(tmp / INDEX_FILE))
        meta["index_bytes"] = (tmp / INDEX_FILE).stat().st_size
        atomic_write_json(tmp / INDEX_META, meta)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def open_index(path: str | Path) -> FaissIndex:
    """Open a cached index directory (``index.faiss`` + ``meta.json``).

    Raises:
        FileNotFoundError: either file is missing (the message names it).
        ValueError: ``meta.json`` is not valid JSON or lacks ``kind``.
    """
    import faiss

    p = Path(path)
    for name in (INDEX_META, INDEX_FILE):
        if not (p / name).is_file():
            raise FileNotFoundError(f"{p / name}: file not found (not a treerank index directory)")
    try:
        meta = json.loads((p / INDEX_META).read_text(encoding="utf-8"))
        meta["kind"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{p / INDEX_META}: not a treerank index meta file ({exc})") from None
    return FaissIndex(faiss.read_index(str(p / INDEX_FILE)), meta, p)


class FaissSystem:
    """A FAISS index as a retrieval system (first stage only; see :func:`faiss_system`).

    The index is built or loaded from the cache on first use for a store (by its signature);
    queries go through the scorer's query tower.
    """

    def __init__(
        self,
        spec: IndexSpec,
        name: str,
        index_dir: str | Path | None = None,
        progress: bool = False,
    ) -> None:
        self.spec = spec
        self.name = name
        self.index_dir = index_dir
        self.progress = progress
        self._scorer: tuple[str | None, DenseScorer] | None = None
        self._index: tuple[str, FaissIndex] | None = None

    def scorer_for(self, store: StoreLike) -> DenseScorer:
        fp = store.encoder_fingerprint
        if self._scorer is None or self._scorer[0] != fp:
            self._scorer = (fp, dense_scorer(self.spec.over, fp, vector_precision(store)))
        return self._scorer[1]

    def index_for(self, store: StoreLike) -> FaissIndex:
        sig = store_signature(store)
        if self._index is None or self._index[0] != sig:
            idx = build_index(
                store,
                self.spec,
                index_dir=self.index_dir,
                scorer=self.scorer_for(store),
                progress=self.progress,
            )
            self._index = (sig, idx)
        return self._index[1]

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        index = self.index_for(store)
        q = self.scorer_for(store).encode_queries(np.asarray(store.queries, dtype=np.float32))
        ids, scores = index.search(np.asarray(q), k, self.spec.search)
        return Run(self.name, ids, scores)


def render_index_spec(index: IndexSpec) -> str:
    """``"<kind>[:k=v,...]"`` of a parsed index spec, parameters at their defaults left out:
    ``parse_index_spec(render_index_spec(x)) == x``."""
    kind = INDEX_KINDS[index.kind]
    items = [
        f"{k}={v}"
        for table, values in ((kind.build, index.build), (kind.search, index.search))
        for k, v in values.items()
        if v != table[k][1]
    ]
    if index.rescore != kind.default_rescore:
        items.append(f"rescore={index.rescore}")
    if index.over != _COMMON["over"][1]:
        items.append(f"over={index.over}")
    if index.resident:
        items.append("resident=1")
    return index.kind + (":" + ",".join(items) if items else "")


def faiss_system(
    index: IndexSpec,
    name: str | None = None,
    index_dir: str | Path | None = None,
    progress: bool = False,
) -> FaissSystem | RescoreSystem:
    """The system of a parsed ``faiss:`` spec (:func:`parse_index_spec`): a
    :class:`FaissSystem`, wrapped in a :class:`~treerank.search.rescore.RescoreSystem` (same
    scorer) when ``rescore > 0``."""
    name = name or f"faiss:{render_index_spec(index)}"
    if index.rescore <= 0:
        return FaissSystem(index, name, index_dir=index_dir, progress=progress)
    first = FaissSystem(index.first_stage(), f"{name}#first", index_dir, progress)
    return RescoreSystem(
        first, scorer=index.over, depth=index.rescore, name=name, release=not index.resident
    )


def read_index_meta(path: str | Path) -> dict[str, object]:
    """The ``meta.json`` of an index directory (without loading the index).

    Raises:
        FileNotFoundError: no ``meta.json``; ValueError: not valid JSON.
    """
    p = Path(path) / INDEX_META
    if not p.is_file():
        raise FileNotFoundError(f"{p}: file not found (not a treerank index directory)")
    try:
        return dict(json.loads(p.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None


def list_indexes(store_dir: str | Path) -> list[tuple[Path, dict[str, object]]]:
    """Every cached index under ``<store_dir>/indexes`` as ``(directory, meta)``, sorted."""
    root = Path(store_dir) / INDEXES_DIR
    if not Path(store_dir).is_dir():
        raise FileNotFoundError(f"{store_dir}: directory not found")
    if not root.is_dir():
        return []
    return [
        (d, read_index_meta(d))
        for d in sorted(root.iterdir())
        if (d / INDEX_META).is_file() and not d.name.startswith(".")
    ]
