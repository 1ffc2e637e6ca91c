"""treerank.store: the binary embedding store (docs/DESIGN.md), memory-mapped, resumable."""

from treerank.store.embed import EmbedStats, StoreExistsError, embed_split, split_digest
from treerank.store.embedding_store import EmbeddingStore
from treerank.store.format import IncompleteStoreError, StoreFormatError, StoreRootError
from treerank.store.source_qrels import add_source_qrels

__all__ = [
    "EmbedStats",
    "EmbeddingStore",
    "IncompleteStoreError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreRootError",
    "add_source_qrels",
    "embed_split",
    "split_digest",
]
