"""treerank: dense-retrieval research over frozen text embeddings.

Layers (docs/DESIGN.md; checked by tests/test_layers.py): base -> kernels -> readers -> encoders
-> store -> models -> training -> search -> evaluation -> diagnostics -> pipeline -> cli. A layer
imports only from its own layer and the layers before it.

The main API is importable from here; each name is loaded on first use, so ``import treerank``
stays cheap (torch, bm25s and matplotlib load only when a function needs them)::

    from treerank import EmbeddingStore, EvaluationSettings, compare_systems
    store = EmbeddingStore.open("runs/sample/stores/scifact/test")
    settings = EvaluationSettings(baseline="cosine")
    comp = compare_systems(store, ["cosine", "bm25", "rrf:bm25+cosine"], settings=settings)
    print(comp.markdown())
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it. Loaded by name at first access (no import statement),
# so the package root stays in the base layer of docs/DESIGN.md and imports nothing heavy.
_API = {
    "EmbeddingStore": "treerank.store",
    "embed_split": "treerank.store",
    "read_split": "treerank.readers",
    "SentenceEncoder": "treerank.encoders",
    "compare_systems": "treerank.evaluation.compare",
    "EvaluationSettings": "treerank.evaluation.settings",
    "evaluate_run": "treerank.metrics.metrics",
    "train_model": "treerank.tasks.train",
    "load_experiment": "treerank.pipeline.config",
    "run_experiment": "treerank.pipeline.experiment",
    "run_diagnostics": "treerank.diagnostics.procedure",
}
__all__ = [
    "EmbeddingStore",
    "EvaluationSettings",
    "SentenceEncoder",
    "__version__",
    "compare_systems",
    "embed_split",
    "evaluate_run",
    "load_experiment",
    "read_split",
    "run_diagnostics",
    "run_experiment",
    "train_model",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first access (PEP 562)."""
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'treerank' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
