"""treerank.encoders: text -> float32 vectors (sentence-transformers, prompts, length bucketing)."""

from treerank.encoders.batching import padding_stats, plan_batches
from treerank.encoders.fingerprint import weights_fingerprint
from treerank.encoders.sentence import DEFAULT_MODEL_NAME, BatchResult, SentenceEncoder

__all__ = [
    "DEFAULT_MODEL_NAME",
    "BatchResult",
    "SentenceEncoder",
    "padding_stats",
    "plan_batches",
    "weights_fingerprint",
]
