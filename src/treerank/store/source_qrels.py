"""`add_source_qrels`: give a store written before stores kept the source's judgments its
``qrels.tsv``, without re-embedding.

Such a store is scored against its candidate tables (judged ids absent from the corpus dropped,
a judgment on a de-duplicated source id moved to the passage's first id), so its metrics can
differ from ``trec_eval`` on the source's qrels file. Reading the same source again gives the
judgments; the vectors are unchanged, so they are only checked to belong to the same split.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from treerank.atomic import atomic_write_bytes, atomic_write_json
from treerank.lock import writer_lock
from treerank.readers.split import RetrievalSplit
from treerank.store.embedding_store import EmbeddingStore
from treerank.store.format import META_JSON, QRELS_TSV, StoreFormatError


def add_source_qrels(split: RetrievalSplit, store_dir: str | Path) -> Path:
    """Write ``split.qrels`` as ``qrels.tsv`` into the finished store ``store_dir``.

    Args:
        split: the split the store was embedded from, read again from its source.
        store_dir: the store split directory.

    Returns:
        The ``qrels.tsv`` path. ``meta.json`` records it (``files.qrels``) and the reader's
        counts (``source_meta``).

    Raises:
        ValueError: the split has no source qrels (MS MARCO: its candidates are the judgments).
        StoreFormatError: the store's query ids, passage ids, aliases or candidate tables differ
            from the split's (it was embedded from other data).
        LockHeldError: another process is writing the store.
    """
    if split.qrels is None:
        raise ValueError(f"{split.name}: the split has no source qrels (its candidates are them)")
    d = Path(store_dir)
    with writer_lock(d, "add qrels"):
        store = EmbeddingStore.open(d)
        same = (
            store.query_ids() == split.query_ids
            and store.passage_ids() == split.passage_ids
            and store.passage_aliases() == split.passage_aliases
            and np.array_equal(store.candidates, split.candidates)
            and np.array_equal(store.labels, split.labels)
        )
        if not same:
            raise StoreFormatError(
                f"{d}: the store was not embedded from this split (query ids, passage ids, "
                "aliases or candidate tables differ); re-embed it instead"
            )
        text = "".join(f"{q}\t{doc}\t{g}\n" for q, doc, g in split.qrels)
        path = atomic_write_bytes(d / QRELS_TSV, text.encode("utf-8"))
        meta = json.loads((d / META_JSON).read_text(encoding="utf-8"))
        meta.setdefault("files", {})["qrels"] = QRELS_TSV
        meta["source_meta"] = {**meta.get("source_meta", {}), **split.meta}
        atomic_write_json(d / META_JSON, meta)
    return path
