"""treerank: dense-retrieval research over frozen text embeddings.

Layers (see DESIGN.md): readers -> encoders -> store -> models -> training -> search ->
evaluation -> diagnostics -> pipeline -> cli. A layer imports only from layers before it.
"""

__version__ = "0.1.0"
