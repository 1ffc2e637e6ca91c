"""treerank.encoders: text -> float32 vectors (sentence-transformers, prompts, length bucketing;
backends torch / onnx / onnx-int8)."""

from treerank.encoders.backend import BACKENDS, Backend, Quantization, get_backend
from treerank.encoders.batching import padding_stats, plan_batches
from treerank.encoders.fingerprint import weights_fingerprint
from treerank.encoders.sentence import DEFAULT_MODEL_NAME, BatchResult, SentenceEncoder

__all__ = [
    "BACKENDS",
    "Backend",
    "Quantization",
    "get_backend",
    "DEFAULT_MODEL_NAME",
    "BatchResult",
    "SentenceEncoder",
    "padding_stats",
    "plan_batches",
    "weights_fingerprint",
]
