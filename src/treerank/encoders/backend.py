"""Encoder backends: which runtime computes a `SentenceEncoder`'s forward pass.

=============  ===========================================================  =========
backend        runtime                                                      precision
=============  ===========================================================  =========
``torch``      sentence-transformers' PyTorch modules (the reference)       fp32
``onnx``       ONNX Runtime on the model exported with ``torch.onnx``       fp32
``onnx-int8``  ONNX Runtime on that export after dynamic int8 quantisation  int8
=============  ===========================================================  =========

``torch`` and ``onnx`` compute the same function in fp32 (vectors agree to ~1e-6), so stores and
queries of the two are interchangeable; ``onnx-int8`` vectors lie in a slightly different space
(cosine ~0.99 to fp32), so a store records its backend's *precision*; which precisions may meet
is the one rule of `treerank.encoders.precision.check_mix` (the torch backend's bf16 path is
there too).

Quantisation is ONNX Runtime's dynamic quantisation (``quantize_dynamic``): weights of every
MatMul/Gemm are int8 per output channel, activations are quantised per tensor at run time
(Jacob et al., 2018, "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference", arXiv:1712.05877), except the first transformer layer,
which stays fp32 (see `Quantization.fp32_first_layers`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

BackendName = Literal["torch", "onnx", "onnx-int8"]
BACKENDS: tuple[BackendName, ...] = ("torch", "onnx", "onnx-int8")


@dataclass(frozen=True)
class Quantization:
    """Settings of ONNX Runtime's dynamic quantisation (``quantize_dynamic``).

    Attributes:
        method: ``"dynamic"`` (weights int8 offline, activations quantised per batch).
        weight_type: ``"QInt8"`` (signed int8 weights).
        per_channel: one scale per output channel of each weight matrix.
        op_types: the ONNX op types quantised (MatMuls with a constant weight only: ONNX
            Runtime's dynamic default).
        fp32_first_layers: the weight MatMuls of this many first transformer layers stay fp32.
            Measured on SciFact (300 queries, 150 passages): quantising all six layers of
            all-MiniLM-L6-v2 gives min cosine 0.986 on queries (1.3 % below 0.99); keeping
            layer 0 in fp32 gives 0.993, at 1/6 of the matmul work left in fp32.
    """

    method: str = "dynamic"
    weight_type: str = "QInt8"
    per_channel: bool = True
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    fp32_first_layers: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["op_types"] = list(self.op_types)
        return d


INT8 = Quantization()


@dataclass(frozen=True)
class Backend:
    """A named backend (see the module table); ``quantization`` is ``None`` for fp32 ones."""

    name: BackendName
    runtime: Literal["torch", "onnxruntime"]
    quantization: Quantization | None

    @property
    def precision(self) -> str:
        """``"fp32"`` or ``"int8"``: what a store's and its queries' backends must share."""
        return "fp32" if self.quantization is None else "int8"

    def __str__(self) -> str:
        return self.name


_BACKENDS = {
    "torch": Backend("torch", "torch", None),
    "onnx": Backend("onnx", "onnxruntime", None),
    "onnx-int8": Backend("onnx-int8", "onnxruntime", INT8),
}


def get_backend(name: str | Backend | None) -> Backend:
    """The backend called ``name`` (``None``: ``torch``).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if isinstance(name, Backend):
        return name
    if name is None:
        return _BACKENDS["torch"]
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown encoder backend {name!r}; use one of {', '.join(BACKENDS)}"
        ) from None


def store_backend(encoder_meta: dict[str, Any]) -> Backend:
    """The backend a store's ``meta.json`` ``encoder`` block records (``torch`` when it records
    none: stores written before backends existed).

    Raises:
        ValueError: the recorded name is unknown.
    """
    return get_backend(encoder_meta.get("backend") or "torch")
