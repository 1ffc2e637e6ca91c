"""Encoding precision: the bf16 path, the mixing rule, the fidelity guard and the ``auto`` probe.

An *encoding path* is a backend and a precision (:class:`EncodePath`):

==============  ==================================================================  =========
path            forward pass                                                        vectors
==============  ==================================================================  =========
``torch/fp32``  sentence-transformers' PyTorch modules (the reference)              fp32
``torch/bf16``  the same under ``torch.autocast("cpu", dtype=torch.bfloat16)``      bf16
``onnx/fp32``   ONNX Runtime on the exported graph                                  fp32
``onnx-int8``   ONNX Runtime after dynamic int8 quantisation                        int8
==============  ==================================================================  =========

Every path returns float32, L2-normalised rows; ``bf16`` and ``int8`` only compute in less
precision, so their vectors sit near the fp32 ones. Each reduced precision has a **fidelity
bound**, the least cosine of one of its vectors to the fp32 vector of the same text
(:data:`FIDELITY_BOUNDS`: bf16 0.999, int8 0.99).

**The mixing rule** (:func:`check_mix`, the one function every command calls: ``search`` and
``serve`` for query vectors, and every checkpoint load bound to a store -- ``evaluate``,
``run``, ``diagnose``, ``search``, ``serve``): two precisions may meet (a store's passages and
its query vectors; the vectors a model was trained on and the store it scores) when both lie in
the same *space* (:data:`MIX_SPACE`). fp32 and bf16 share the fp32 space: a bf16 vector's
cosine to its fp32 one is bounded by 0.999 (measured min 0.99997 on 320 SciFact abstracts,
0.99992 with bf16 weights; SciFact nDCG@10 +0.0005: ``docs/encoding.md``), ten times closer
than int8's 0.99 and of the order of the float noise between two batch layouts of the same
text (cosine > 0.9999). int8 vectors (measured min 0.992, nDCG@10 moved by -0.0056 on SciFact
and +0.0099 on CISI) form their own space: int8 meets only int8. Passage reuse between sibling
stores (``embed``) is stricter: the same precision.

**The fidelity guard** (:func:`fidelity_check`): while embedding with a reduced precision, a
seeded sample of items is encoded again in fp32 (the torch modules) and compared; items below
the bound are *replaced by their fp32 vectors* (the per-item fallback) and reported in
``meta.json`` (``encoder.fidelity``) and on stderr.

**``auto``** (:func:`resolve_path`): the first use on a machine encodes a fixed batch
(:data:`PROBE_TEXTS`) with every candidate path at the thread count in use, keeps the fastest
path whose probe vectors meet its bound, and never one the probe measured slower than
``torch/fp32``; the choice is cached in ``kernels.device.cache_dir() / "encode-path.json"``
under a key naming the CPU (model and flags), the thread count, the model's weights
fingerprint and the library versions (:func:`probe_key`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from treerank.encoders.backend import BACKENDS
from treerank.storelike import Split, meta_object

__all__ = [
    "FIDELITY_BOUNDS",
    "MIX_SPACE",
    "PATHS",
    "PRECISIONS",
    "PROBE_TEXTS",
    "Choice",
    "EncodePath",
    "FidelityReport",
    "PrecisionMixError",
    "check_mix",
    "choose_path",
    "cosines",
    "fidelity_check",
    "probe_key",
    "resolve_path",
    "run_probe",
    "store_precision",
    "vector_precision",
]

Precision = Literal["fp32", "bf16", "auto"]
"""The ``precision`` setting of the torch backend."""
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

FIDELITY_BOUNDS: dict[str, float] = {"fp32": 0.9999, "bf16": 0.999, "int8": 0.99}
"""Least per-vector cosine to fp32 each vector precision promises (fp32: another runtime's
float rounding, e.g. ONNX Runtime's fp32 graph)."""

MIX_SPACE: dict[str, str] = {"fp32": "fp32", "bf16": "fp32", "int8": "int8"}
"""The vector space of each precision; two precisions mix only within one space."""

CACHE_FILE = "encode-path.json"
PROBE_VERSION = 1


class PrecisionMixError(ValueError):
    """Vectors of two precisions that the mixing rule keeps apart would meet (the message names
    both sides, their precisions and what to pass instead)."""


@dataclass(frozen=True)
class EncodePath:
    """One way to run the encoder: ``backend`` (``torch`` | ``onnx`` | ``onnx-int8``) and the
    precision its vectors carry (``fp32`` | ``bf16`` | ``int8``)."""

    backend: str
    precision: str

    @property
    def name(self) -> str:
        """``torch/fp32``, ``torch/bf16``, ``onnx/fp32`` or ``onnx-int8``."""
        return "onnx-int8" if self.backend == "onnx-int8" else f"{self.backend}/{self.precision}"

    def to_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "precision": self.precision}


TORCH_FP32 = EncodePath("torch", "fp32")
TORCH_BF16 = EncodePath("torch", "bf16")
ONNX_FP32 = EncodePath("onnx", "fp32")
ONNX_INT8 = EncodePath("onnx-int8", "int8")
PATHS: tuple[EncodePath, ...] = (TORCH_FP32, TORCH_BF16, ONNX_FP32, ONNX_INT8)


# ----------------------------------------------------------------------------- the mixing rule


def store_precision(encoder_meta: Mapping[str, Any]) -> str:
    """The vector precision a store's (or checkpoint's) ``encoder`` block records: its
    ``precision`` when present, else ``int8`` for backend ``onnx-int8`` and ``fp32`` otherwise
    (stores written before precisions existed).

    Raises:
        ValueError: an unknown recorded precision or backend.
    """
    prec = encoder_meta.get("precision")
    if prec is not None:
        if prec not in MIX_SPACE:
            raise ValueError(f"encoder.precision {prec!r} unknown; known: {', '.join(MIX_SPACE)}")
        return str(prec)
    backend = encoder_meta.get("backend") or "torch"
    if backend not in BACKENDS:
        known = ", ".join(BACKENDS)
        raise ValueError(f"unknown encoder backend {backend!r}; use one of {known}")
    return "int8" if backend == "onnx-int8" else "fp32"


def vector_precision(store: Split) -> str | None:
    """The vector precision of a store split (its ``meta.json`` ``encoder`` block, see
    :func:`store_precision`); ``None`` for an object without ``meta`` (an in-memory array
    store), which no check can bind.

    Raises:
        ValueError: the store records an unknown precision or backend.
    """
    try:
        meta = store.meta
    except (AttributeError, OSError, ValueError):
        return None
    if not isinstance(meta, Mapping):
        return None
    return store_precision(meta_object(meta, "encoder"))


def check_mix(
    where: Any,
    base: str,
    other: str,
    *,
    base_what: str = "the store's vectors",
    other_what: str = "the queries",
    fix: str = "",
) -> None:
    """Refuse vectors of precision ``other`` meeting vectors of precision ``base`` when the
    mixing rule (module docstring) keeps them apart: fp32 and bf16 mix; int8 only with int8.

    Args:
        where: what the message names first (a store path, a checkpoint path).
        base / other: vector precisions (``fp32`` | ``bf16`` | ``int8``).
        base_what / other_what: what each side is, for the message.
        fix: the remedy appended to the message (e.g. ``"use --backend onnx-int8"``).

    Raises:
        PrecisionMixError: the two precisions lie in different spaces, or one is unknown.
    """
    for p in (base, other):
        if p not in MIX_SPACE:
            raise PrecisionMixError(
                f"{where}: unknown vector precision {p!r}; known: {', '.join(MIX_SPACE)}"
            )
    if MIX_SPACE[base] != MIX_SPACE[other]:
        one, two = sorted((base, other), reverse=True)
        raise PrecisionMixError(
            f"{where}: {base_what} ({base}), but {other_what} ({other}); {one} and {two} "
            f"vectors lie in different spaces (fp32 and bf16 mix, int8 only with int8; "
            f"docs/encoding.md)" + (f". {fix}" if fix else "")
        )


# ----------------------------------------------------------------------------- fidelity guard


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two ``float32 (n, d)`` arrays: ``float64 (n,)`` (a zero row: 0)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    num = (a64 * b64).sum(axis=1)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


@dataclass
class FidelityReport:
    """The fidelity guard's record (``meta.json`` ``encoder.fidelity``).

    Attributes:
        precision: the checked vector precision.
        bound: the least cosine to fp32 promised (:data:`FIDELITY_BOUNDS`).
        checked: items encoded again in fp32 and compared.
        min_cosine: the least cosine among them (1.0 when none were checked).
        breaches: ``{"kind", "row", "cosine"}`` of each checked item below ``bound``; each was
            replaced by its fp32 vector (``action``).
        seed: the sample's seed.
    """

    precision: str
    bound: float
    checked: int = 0
    min_cosine: float = 1.0
    breaches: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 0
    action: str = "fp32-fallback"

    def add(self, kind: str, rows: np.ndarray, cos: np.ndarray) -> np.ndarray:
        """Record the cosines of ``rows`` (of ``kind``); returns the positions below the bound."""
        self.checked += len(rows)
        if len(cos):
            self.min_cosine = min(self.min_cosine, float(cos.min()))
        bad = np.flatnonzero(cos < self.bound)
        self.breaches += [
            {"kind": kind, "row": int(rows[i]), "cosine": round(float(cos[i]), 6)} for i in bad
        ]
        return bad

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "bound": self.bound,
            "checked": self.checked,
            "min_cosine": round(self.min_cosine, 6),
            "breaches": self.breaches,
            "seed": self.seed,
            "action": self.action,
        }

    def message(self, where: Any) -> str:
        """One line for stderr: the check and, on a breach, what was done."""
        head = (
            f"{where}: fidelity guard ({self.precision}): {self.checked} items re-encoded in fp32, "
            f"min cosine {self.min_cosine:.5f} (bound {self.bound})"
        )
        if not self.breaches:
            return head
        return (
            f"{head}; BREACH: {len(self.breaches)} item(s) below the bound were replaced by their "
            "fp32 vectors (meta.json encoder.fidelity.breaches); unchecked items may breach too: "
            "re-embed with --precision fp32 to be sure"
        )


def fidelity_check(
    reduced: np.ndarray, reference: np.ndarray, bound: float
) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of reduced-precision rows to their fp32 rows and the positions below ``bound``.

    Returns:
        ``(cosine float64 (n,), breaching positions int64 (m,))``.
    """
    cos = cosines(reduced, reference)
    return cos, np.flatnonzero(cos < bound)


def guard_sample(n: int, size: int, seed: int) -> np.ndarray:
    """The rows the fidelity guard re-encodes: ``min(n, size)`` distinct rows of ``range(n)``
    drawn with ``numpy.random.default_rng(seed)``, sorted (``int64``)."""
    if n <= 0 or size <= 0:
        return np.empty(0, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(n, size), replace=False)).astype(np.int64)


# ----------------------------------------------------------------------------- auto probe

PROBE_TEXTS: tuple[str, ...] = tuple(
    f"{head} {tail}"
    for head in (
        "Vitamin D supplementation and bone mineral density in older adults.",
        "The mitochondrial genome encodes thirteen proteins of the respiratory chain",
        "What is the capital city of Australia and when was it founded?",
        "Aerodynamic heating of a blunt body in hypersonic flow at high altitude",
    )
    for tail in (
        "",
        "A randomised trial followed 2,000 participants for five years.",
        "Results were consistent across subgroups defined by age, sex and baseline levels, "
        "and no serious adverse events were attributed to the intervention.",
        "Short text.",
        "Measurements of heat transfer, pressure distribution and boundary-layer transition "
        "are compared with theory; the agreement is good except near the stagnation point, "
        "where the measured heating exceeds the predicted value by about twenty percent.",
        "Protein folding",
        "Several cohorts report conflicting findings, which we reconcile by a meta-analysis of "
        "individual participant data from eleven studies.",
        "Why?",
    )
)
"""The fixed probe batch: 32 texts of mixed length (scientific, question-like, very short)."""


def _cpu_identity() -> tuple[str, str]:
    model = platform.processor() or platform.machine()
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for ln in f:
                if ln.startswith("model name") and model in ("", platform.machine()):
                    model = ln.split(":", 1)[1].strip()
                elif ln.startswith("flags"):
                    flags = " ".join(sorted(ln.split(":", 1)[1].split()))
                if flags and model:
                    break
    except OSError:
        pass
    return model, flags


def library_versions() -> dict[str, str]:
    """Versions of what the paths run on: torch, sentence-transformers, transformers,
    onnxruntime and onnx (``"none"`` when not installed)."""
    from importlib import metadata

    out = {}
    for dist in ("torch", "sentence-transformers", "transformers", "onnxruntime", "onnx"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "none"
    return out


def probe_key(fingerprint: str, threads: int, versions: Mapping[str, str] | None = None) -> str:
    """The cache key of a probe: CPU model + SHA-256 of its flags, thread count, the model's
    weights fingerprint, the library versions (:func:`library_versions`) and the probe's
    version."""
    model, flags = _cpu_identity()
    vers = dict(library_versions() if versions is None else versions)
    flag_digest = hashlib.sha256(flags.encode()).hexdigest()[:16]
    return json.dumps(
        {
            "cpu": model,
            "cpu_flags": flag_digest,
            "threads": int(threads),
            "weights": fingerprint,
            "versions": vers,
            "probe": PROBE_VERSION,
        },
        sort_keys=True,
    )


@dataclass
class Choice:
    """What ``auto`` chose: the path, its measured ratio to ``torch/fp32`` (fp32 seconds / its
    seconds, > 1 is faster), the probe's seconds and min cosines per path, and whether it came
    from the cache."""

    path: EncodePath
    ratio: float
    seconds: dict[str, float]
    min_cosine: dict[str, float]
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path.name,
            **self.path.to_dict(),
            "ratio_to_fp32": round(self.ratio, 4),
            "seconds": {k: round(v, 5) for k, v in self.seconds.items()},
            "min_cosine": {k: round(v, 6) for k, v in self.min_cosine.items()},
            "cached": self.cached,
            "probe_texts": len(PROBE_TEXTS),
        }

    def message(self) -> str:
        if not self.seconds:
            return (
                f"encoder auto: {self.path.name} (the only path the settings allow; not measured)"
            )
        src = "cached probe" if self.cached else "probe"
        times = ", ".join(f"{k} {v:.3f}s" for k, v in self.seconds.items())
        return f"encoder auto: {self.path.name} ({self.ratio:.2f}x torch/fp32; {src}: {times})"


def choose_path(seconds: Mapping[str, float], min_cosine: Mapping[str, float]) -> Choice:
    """The fastest path that meets its fidelity bound and is strictly faster than
    ``torch/fp32``; ``torch/fp32`` when none is.

    Args:
        seconds: probe seconds per path name (must hold ``torch/fp32``).
        min_cosine: the probe's least cosine to fp32 per path name.

    Raises:
        KeyError: ``seconds`` has no ``torch/fp32``.
    """
    ref = float(seconds[TORCH_FP32.name])
    by_name = {p.name: p for p in PATHS}
    best = TORCH_FP32
    for name, s in seconds.items():
        path = by_name[name]
        bound = FIDELITY_BOUNDS[path.precision]
        if path == TORCH_FP32 or min_cosine.get(name, 0.0) < bound or not s < ref:
            continue
        if s < float(seconds[best.name]):
            best = path
    return Choice(
        path=best,
        ratio=ref / float(seconds[best.name]) if seconds[best.name] > 0 else 1.0,
        seconds={k: float(v) for k, v in seconds.items()},
        min_cosine={k: float(v) for k, v in min_cosine.items()},
    )


Timer = Callable[[EncodePath, Callable[[], np.ndarray]], float]


def _best_of(repeats: int) -> Timer:
    def timer(path: EncodePath, fn: Callable[[], np.ndarray]) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    return timer


def run_probe(
    forwards: Mapping[EncodePath, Callable[[], np.ndarray]],
    *,
    timer: Timer | None = None,
    repeats: int = 2,
) -> Choice:
    """Measure every path of ``forwards`` (each a callable encoding the probe batch into
    ``float32 (n, d)``) and choose (:func:`choose_path`).

    Each path runs once untimed (warm-up, and its vectors for the fidelity check), then is
    timed by ``timer(path, fn) -> seconds`` (default: best of ``repeats`` wall-clock runs), paths
    interleaved in the order given. ``torch/fp32`` must be among them (the reference).
    """
    if TORCH_FP32 not in forwards:
        raise ValueError("the probe needs the torch/fp32 path as its reference")
    vectors = {p: np.asarray(fn(), dtype=np.float32) for p, fn in forwards.items()}
    ref = vectors[TORCH_FP32]
    min_cos = {p.name: float(cosines(v, ref).min()) for p, v in vectors.items()}
    clock = timer or _best_of(repeats)
    seconds = {p.name: float(clock(p, fn)) for p, fn in forwards.items()}
    return choose_path(seconds, min_cos)


def candidate_paths(
    backend: str, precision: str, allowed: Iterable[str] | None = None
) -> list[EncodePath]:
    """The paths a ``backend`` / ``precision`` setting may run (``auto`` matches any), keeping
    only vector precisions in ``allowed`` when given; ``torch/fp32`` is always first when
    allowed (the probe's reference)."""
    keep = set(allowed) if allowed is not None else None
    out = []
    for p in PATHS:
        if backend != "auto" and p.backend != backend:
            continue
        if precision != "auto" and backend != "onnx-int8" and p.precision != precision:
            continue
        if keep is not None and p.precision not in keep:
            continue
        out.append(p)
    return out


def _onnx_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_path(
    encoder: Any,
    backend: str,
    precision: str,
    *,
    allowed: Iterable[str] | None = None,
    refresh: bool = False,
    timer: Timer | None = None,
    versions: Mapping[str, str] | None = None,
) -> Choice:
    """Resolve ``auto`` in a backend / precision setting for ``encoder`` (a loaded torch
    :class:`~treerank.encoders.SentenceEncoder`) on this machine.

    The candidates are :func:`candidate_paths` (ONNX ones only when onnxruntime and onnx are
    installed); with one candidate nothing is measured. Otherwise the cached choice for
    :func:`probe_key` is used, or the probe runs (:func:`run_probe`, the encoder's
    ``probe_forward(path)``) and its choice is cached. The cache is advisory: an unreadable or
    unwritable cache file only means measuring again.

    Args:
        allowed: vector precisions the result may have (the mixing rule's space of a store).
        refresh: measure even when a cached choice exists.
        timer: injected clock (tests), see :func:`run_probe`.
        versions: library versions for the key (default: :func:`library_versions`).

    Raises:
        ValueError: no path fits the setting and ``allowed``.
    """
    import torch

    from treerank.kernels.device import cache_dir, read_probe_cache, write_probe_cache

    cands = candidate_paths(backend, precision, allowed)
    if not _onnx_available():
        cands = [p for p in cands if p.backend == "torch"]
    if not cands:
        raise ValueError(
            f"no encoding path fits backend {backend!r} / precision {precision!r}"
            + (f" with vector precisions {sorted(set(allowed))}" if allowed is not None else "")
        )
    if len(cands) == 1 or TORCH_FP32 not in cands:
        return Choice(path=cands[0], ratio=1.0, seconds={}, min_cosine={})
    key = probe_key(encoder.fingerprint, torch.get_num_threads(), versions)
    names = sorted(p.name for p in cands)
    cache = cache_dir() / CACHE_FILE
    doc = read_probe_cache(cache)
    entry = doc.get(key)
    hit = entry.get(json.dumps(names)) if isinstance(entry, dict) else None
    by_name = {p.name: p for p in PATHS}
    if not refresh and isinstance(hit, dict) and hit.get("path") in by_name:
        return Choice(
            path=by_name[hit["path"]],
            ratio=float(hit.get("ratio_to_fp32", 1.0)),
            seconds=dict(hit.get("seconds", {})),
            min_cosine=dict(hit.get("min_cosine", {})),
            cached=True,
        )
    choice = run_probe({p: encoder.probe_forward(p) for p in cands}, timer=timer)
    entry = entry if isinstance(entry, dict) else {}
    entry[json.dumps(names)] = {**choice.to_dict(), "measured_unix": time.time()}
    doc[key] = entry
    write_probe_cache(cache, doc)
    return choice
