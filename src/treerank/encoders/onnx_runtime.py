"""The ONNX Runtime forward pass of a sentence-transformers model, exported once and cached.

Only module stacks treerank can reproduce exactly are exported: a ``Transformer`` (a Hugging
Face encoder taking ``input_ids`` / ``attention_mask`` / ``token_type_ids``), a ``Pooling``
with one of the modes ``mean``, ``cls``, ``max``, and optionally ``Normalize``.
Anything else (``Dense``, ``LayerNorm``, ``WordEmbeddings``, custom modules, other pooling modes,
``include_prompt=False`` with a prompt) is refused by :func:`supported_stack` with an
:class:`UnsupportedModelError` naming the module. The graph computes transformer + pooling +
L2 normalisation, so the ONNX output is the unit vector the torch path returns.

Export cache: ``<cache>/<digest>/model.onnx`` where ``<cache>`` is :func:`onnx_cache_dir` (never
beside the model's files: the default model lives inside an installed package) and ``<digest>``
hashes an :class:`ExportKey`: everything that changes the exported graph or the vectors it is
used for: the weights fingerprint, the transformer's configuration (``config.json`` as loaded:
``hidden_act``, layer norms, positions...), the tokenizer (its full serialisation and settings),
the module stack's configuration (pooling settings, ``Normalize``), the encoding settings
(query / passage prompts, ``max_seq_length``), opset, quantisation, the torch, transformers,
sentence-transformers, onnx and onnxruntime versions, and treerank's export format.

An entry is built into a temporary sibling directory and renamed into place, so a reader never
sees half an export and concurrent builders both end with one complete entry. ``key.json``
records the key plus the SHA-256 and size of ``model.onnx``; an entry is used only when both
match (checked on every load, about 0.3 s for MiniLM), so a damaged entry (a half-written or
zero-byte file, garbage, ``model.onnx`` deleted with ``key.json`` kept, an unreadable
``key.json``) is detected, moved aside in one rename and rebuilt atomically, never handed to
ONNX Runtime. ``EXPORTS`` counts the exports this process made (tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treerank.encoders.backend import Backend, Quantization

OPSET = 17
EXPORT_FORMAT = 2  # bump when the exported graph changes for the same key (2: content keys)
MODEL_FILE = "model.onnx"
KEY_FILE = "key.json"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
POOLING_MODES = ("mean", "cls", "max")

EXPORTS: Counter[str] = Counter()
"""Exports made by this process, by kind (``"fp32"``, ``"int8"``): tests assert reuse."""


class MissingDependencyError(ValueError):
    """An onnx backend was asked for without the optional packages installed."""


def require_onnxruntime() -> None:
    """Raise :class:`MissingDependencyError` (naming the extra) unless onnxruntime and onnx
    import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"the onnx encoder backends need onnxruntime and onnx ({exc}); install them with "
            "pip install 'treerank[onnx]'"
        ) from None


class UnsupportedModelError(ValueError):
    """A sentence-transformers module the ONNX backends cannot reproduce; names the module."""


@dataclass(frozen=True)
class PoolingSpec:
    """What the exported graph does after the transformer: ``mode`` in ``mean|cls|max``."""

    mode: str
    normalize: bool


def supported_stack(model: Any, path: str, prompts: bool) -> PoolingSpec:
    """Check that ``model``'s modules are Transformer -> Pooling [-> Normalize].

    Args:
        model: a loaded ``SentenceTransformer``.
        path: the model's name or directory (for messages).
        prompts: whether a query or passage prompt is configured.

    Returns:
        the pooling to reproduce.

    Raises:
        UnsupportedModelError: naming the first module (position, class, setting) that the
            ONNX backends cannot reproduce.
    """
    modules = list(model)
    names = [type(m).__name__ for m in modules]

    def refuse(i: int, why: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{path}: module {i} ({names[i] if i < len(names) else 'missing'}) {why}; the onnx "
            f"backends reproduce Transformer -> Pooling (mean|cls|max) [-> Normalize] only "
            f"(this model: {' -> '.join(names)}); use backend 'torch'"
        )

    if not modules or names[0] != "Transformer" or not hasattr(modules[0], "auto_model"):
        raise refuse(0, "is not a sentence-transformers Transformer")
    if len(modules) < 2 or names[1] != "Pooling":
        raise refuse(1, "is not a Pooling module")
    pooling = modules[1]
    mode = pooling.pooling_mode
    if not isinstance(mode, str) or mode not in POOLING_MODES:
        raise refuse(1, f"has pooling_mode {mode!r}")
    if prompts and not getattr(pooling, "include_prompt", True):
        raise refuse(1, "excludes prompt tokens from pooling (include_prompt=False)")
    normalize = False
    for i in range(2, len(modules)):
        if names[i] == "Normalize" and i == len(modules) - 1:
            normalize = True
        else:
            raise refuse(i, "is not supported")
    return PoolingSpec(mode, normalize)


def onnx_cache_dir() -> Path:
    """Where exports are cached: ``$TREERANK_CACHE/onnx``, else ``$XDG_CACHE_HOME/treerank/onnx``,
    else ``~/.cache/treerank/onnx``."""
    if os.environ.get("TREERANK_CACHE"):
        return Path(os.environ["TREERANK_CACHE"]).expanduser() / "onnx"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "treerank" / "onnx"


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import sentence_transformers
    import torch
    import transformers

    return {
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
    }


def _sha256_json(doc: Any) -> str:
    text = json.dumps(doc, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_LOCATION_KWARGS = frozenset({"name_or_path", "is_local", "local_files_only", "cache_dir"})


def model_parts(model: Any) -> dict[str, str]:
    """Content digests (hex SHA-256) of what besides the weights defines a loaded model's
    computation: ``config`` (the transformer's configuration, ``config.to_dict()``: activation,
    layer sizes, position table, ...), ``tokenizer`` (its full serialisation, vocabulary and
    settings, without the paths it was loaded from: a moved copy of a model keeps its key) and
    ``modules`` (each module's class and ``get_config_dict()``: pooling mode and flags,
    normalisation)."""
    transformer = model[0]
    config = transformer.auto_model.config.to_dict()
    tok = getattr(transformer, "tokenizer", None)
    backend = getattr(tok, "backend_tokenizer", None)
    tok_doc: dict[str, Any] = {"class": type(tok).__name__}
    if backend is not None and hasattr(backend, "to_str"):
        doc = json.loads(backend.to_str())
        # truncation / padding are per-call state (every tokenizer call may set them), not the
        # tokenizer: truncation is keyed as the encoding's max_seq_length
        tok_doc["serialised"] = {k: v for k, v in doc.items() if k not in ("truncation", "padding")}
    elif tok is not None:
        tok_doc["vocab"] = sorted(tok.get_vocab().items())
    if tok is not None:
        tok_doc["init_kwargs"] = {  # settings, not where the files were found
            k: v
            for k, v in getattr(tok, "init_kwargs", {}).items()
            if k not in _LOCATION_KWARGS and not k.endswith("_file")
        }
        tok_doc["model_max_length"] = getattr(tok, "model_max_length", None)
    mods = []
    for m in model:
        get = getattr(m, "get_config_dict", None)
        mods.append({"class": type(m).__name__, "config": get() if callable(get) else None})
    return {
        "config": _sha256_json({k: v for k, v in config.items() if k != "_name_or_path"}),
        "tokenizer": _sha256_json(tok_doc),
        "modules": _sha256_json(mods),
    }


@dataclass(frozen=True)
class ExportKey:
    """Everything an exported file depends on; its digest names the cache entry."""

    fingerprint: str
    pooling: PoolingSpec
    inputs: tuple[str, ...]
    opset: int
    quantization: Quantization | None
    onnxruntime: str
    onnx: str
    torch: str
    transformers: str = ""
    sentence_transformers: str = ""
    parts: tuple[tuple[str, str], ...] = ()
    """:func:`model_parts` (config, tokenizer, modules digests), as sorted pairs."""
    encoding: tuple[tuple[str, Any], ...] = ()
    """The encoding settings (``query_prompt``, ``passage_prompt``, ``max_seq_length``)."""
    export_format: int = EXPORT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        d["parts"] = dict(self.parts)
        d["encoding"] = dict(self.encoding)
        d["quantization"] = self.quantization.to_dict() if self.quantization else None
        return d

    @property
    def digest(self) -> str:
        """Hex SHA-256 of the key (the cache directory's name)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def export_key(
    fingerprint: str,
    pooling: PoolingSpec,
    inputs: tuple[str, ...],
    quantization: Quantization | None,
    opset: int = OPSET,
    *,
    parts: dict[str, str] | None = None,
    encoding: dict[str, Any] | None = None,
) -> ExportKey:
    """The key of an export with the installed onnxruntime / onnx / torch / transformers /
    sentence-transformers versions.

    Args:
        parts: :func:`model_parts` of the model (config, tokenizer, modules digests).
        encoding: the encoder's settings (``query_prompt``, ``passage_prompt``,
            ``max_seq_length``).
    """
    v = _versions()
    return ExportKey(
        fingerprint=fingerprint,
        pooling=pooling,
        inputs=tuple(inputs),
        opset=opset,
        quantization=quantization,
        onnxruntime=v["onnxruntime"],
        onnx=v["onnx"],
        torch=v["torch"],
        transformers=v.get("transformers", ""),
        sentence_transformers=v.get("sentence_transformers", ""),
        parts=tuple(sorted((parts or {}).items())),
        encoding=tuple(sorted((encoding or {}).items())),
    )


def _graph_module(model: Any, pooling: PoolingSpec, inputs: tuple[str, ...]) -> Any:
    """A torch module ``(input_ids, attention_mask[, token_type_ids]) -> float32 (n, dim)``
    unit vectors: the transformer, the pooling of sentence-transformers' ``Pooling`` (mean over
    the attention mask; first attended token; max over attended tokens) and L2 normalisation."""
    import torch

    auto_model = model[0].auto_model

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.auto_model = auto_model

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            feats = dict(zip(inputs, args, strict=True))
            mask = feats["attention_mask"]
            tok = self.auto_model(**feats, return_dict=True).last_hidden_state
            if pooling.mode == "mean":
                m = mask.unsqueeze(-1).to(tok.dtype)
                emb = (tok * m).sum(dim=1) / torch.clamp(m.sum(dim=1), min=1e-9)
            elif pooling.mode == "cls":
                first = mask.to(torch.int32).argmax(dim=1)
                idx = first.view(-1, 1, 1).expand(-1, 1, tok.shape[-1])
                emb = torch.gather(tok, 1, idx).squeeze(1)
            else:  # max
                m = mask.unsqueeze(-1).expand_as(tok)
                emb = tok.masked_fill(m == 0, float("-inf")).max(dim=1).values
            return torch.nn.functional.normalize(emb, p=2.0, dim=1)

    return Graph().eval()


def _export_fp32(model: Any, key: ExportKey, dest: Path) -> None:
    import torch

    graph = _graph_module(model, key.pooling, key.inputs)
    example = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in key.inputs)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in key.inputs}
    dynamic["sentence_embedding"] = {0: "batch"}
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # the tracer warns about shape-dependent Python branches of transformers' masking code;
        # they are constant for an encoder (the parity tests cover padded batches)
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            example,
            str(dest),
            input_names=list(key.inputs),
            output_names=["sentence_embedding"],
            dynamic_axes=dynamic,
            opset_version=key.opset,
            do_constant_folding=True,
            dynamo=False,
        )


def weight_matmuls(path: Path) -> list[str]:
    """Names of the MatMul/Gemm nodes of an ONNX graph whose second input is a constant
    (initializer), in graph (topological) order."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    consts = {t.name for t in graph.initializer}
    return [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in consts]


def fp32_nodes(path: Path, q: Quantization, n_layers: int) -> list[str]:
    """The weight MatMuls left in fp32: those of the first ``q.fp32_first_layers`` of
    ``n_layers`` transformer layers (the graph's weight MatMuls, in order, split evenly).

    Raises:
        UnsupportedModelError: the weight MatMuls do not split evenly into ``n_layers``.
    """
    nodes = weight_matmuls(path)
    if not q.fp32_first_layers:
        return []
    if n_layers < 1 or len(nodes) % n_layers:
        raise UnsupportedModelError(
            f"{path}: {len(nodes)} weight MatMuls do not split into {n_layers} layers; cannot "
            "keep the first layers in fp32"
        )
    return nodes[: q.fp32_first_layers * (len(nodes) // n_layers)]


def _quantize(src: Path, dest: Path, q: Quantization, n_layers: int) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(dest),
        per_channel=q.per_channel,
        weight_type=getattr(QuantType, q.weight_type),
        op_types_to_quantize=list(q.op_types),
        nodes_to_exclude=fp32_nodes(src, q, n_layers),
    )


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def entry_problem(entry: Path, key: ExportKey) -> str | None:
    """Why the cache entry directory ``entry`` cannot be used for ``key``, or None when it can.

    Checked: ``key.json`` reads as JSON and holds ``key`` and the file's digest; ``model.onnx``
    exists, has the recorded size and SHA-256 (so a half-written, zero-byte, truncated or
    overwritten file is caught before ONNX Runtime sees it).
    """
    try:
        doc = json.loads((entry / KEY_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{KEY_FILE} is missing"
    except (OSError, ValueError) as exc:
        return f"{KEY_FILE} is unreadable ({exc})"
    if not isinstance(doc, dict):
        return f"{KEY_FILE} is not a JSON object"
    recorded = {k: v for k, v in doc.items() if k not in ("model_sha256", "model_bytes")}
    if json.loads(json.dumps(key.to_dict())) != recorded:
        return f"{KEY_FILE} holds another key"
    model = entry / MODEL_FILE
    try:
        size = model.stat().st_size
    except OSError:
        return f"{MODEL_FILE} is missing"
    if size != doc.get("model_bytes"):
        return f"{MODEL_FILE} has {size} bytes, {doc.get('model_bytes')} were written"
    if _file_sha256(model) != doc.get("model_sha256"):
        return f"{MODEL_FILE} does not match the SHA-256 recorded when it was written"
    return None


REBUILT: list[tuple[Path, str]] = []
"""Damaged entries this process found and rebuilt: ``(entry, problem)`` (tests, messages)."""


def _build(root: Path, key: ExportKey, make: Any) -> Path:
    """Return ``root/<digest>/model.onnx``, building it with ``make(path)`` when absent or
    damaged (:func:`entry_problem`), in a temporary sibling directory renamed into place; a
    damaged entry is first renamed aside (one atomic rename), then removed."""
    final = root / key.digest
    if final.exists():
        why = entry_problem(final, key)
        if why is None:
            return final / MODEL_FILE
        warnings.warn(
            f"{final}: damaged ONNX export cache entry ({why}); rebuilding it", stacklevel=3
        )
        REBUILT.append((final, why))
        trash = root / f".{key.digest[:12]}-damaged-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.replace(final, trash)
        except FileNotFoundError:
            pass  # another process moved it first
        shutil.rmtree(trash, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key.digest[:12]}-", dir=root))
    try:
        make(tmp / MODEL_FILE)
        doc = key.to_dict()
        doc["model_bytes"] = (tmp / MODEL_FILE).stat().st_size
        doc["model_sha256"] = _file_sha256(tmp / MODEL_FILE)
        (tmp / KEY_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
        try:
            os.replace(tmp, final)
        except OSError:
            # a concurrent builder's finished entry is there: use it when it is whole
            if entry_problem(final, key) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / MODEL_FILE


def cached_export(
    model: Any,
    fingerprint: str,
    pooling: PoolingSpec,
    inputs: tuple[str, ...],
    backend: Backend,
    cache_dir: str | Path | None = None,
    encoding: dict[str, Any] | None = None,
) -> Path:
    """The ONNX file of ``model`` for ``backend``, exported (and quantised) at most once.

    An int8 entry is quantised from the fp32 entry of the same model (built first if absent).
    The key holds :func:`model_parts` of ``model`` and ``encoding``; a damaged entry is rebuilt
    (:func:`entry_problem`).

    Args:
        encoding: the encoder's settings (``query_prompt``, ``passage_prompt``,
            ``max_seq_length``), part of the key.

    Returns:
        path of ``model.onnx`` inside the cache entry.
    """
    root = Path(cache_dir) if cache_dir is not None else onnx_cache_dir()
    parts = model_parts(model)
    fp32_key = export_key(fingerprint, pooling, inputs, None, parts=parts, encoding=encoding)

    def make_fp32(path: Path) -> None:
        _export_fp32(model, fp32_key, path)
        EXPORTS["fp32"] += 1

    fp32 = _build(root, fp32_key, make_fp32)
    if backend.quantization is None:
        return fp32
    q = backend.quantization

    n_layers = int(getattr(model[0].auto_model.config, "num_hidden_layers", 0) or 0)

    def make_int8(path: Path) -> None:
        _quantize(fp32, path, q, n_layers)
        EXPORTS["int8"] += 1

    int8_key = export_key(fingerprint, pooling, inputs, q, parts=parts, encoding=encoding)
    return _build(root, int8_key, make_int8)


class OnnxForward:
    """An ONNX Runtime session on an exported encoder graph.

    Args:
        path: the ``.onnx`` file.
        inputs: its input names, in order.
        threads: intra-op threads (the torch thread count of the caller, so every backend runs
            with the same number).
    """

    def __init__(self, path: Path, inputs: tuple[str, ...], threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, int(threads))
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = path
        self.inputs = inputs
        self.threads = opts.intra_op_num_threads
        self.session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def __call__(self, features: dict[str, Any]) -> np.ndarray:
        """``features``: the tokenizer's tensors (torch or numpy, ``(n, length)``).

        Returns:
            ``float32 (n, dim)`` unit vectors.
        """
        feed = {name: np.asarray(features[name], dtype=np.int64) for name in self.inputs}
        (out,) = self.session.run(["sentence_embedding"], feed)
        return np.asarray(out, dtype=np.float32)
