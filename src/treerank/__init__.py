"""treerank: dense-retrieval research over frozen text embeddings.

Layers (docs/DESIGN.md; checked by tests/test_layers.py): base -> kernels -> readers -> encoders
-> store -> models -> training -> search -> evaluation -> diagnostics -> pipeline -> cli. A layer
imports only from its own layer and the layers before it.
"""

__version__ = "0.1.0"
