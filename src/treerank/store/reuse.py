"""Reuse passage vectors already encoded by the same encoder in a sibling split's store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from treerank.store.embedding_store import EmbeddingStore
from treerank.store.format import META_JSON, StoreFormatError


def reusable_stores(
    out_dir: str | Path,
    fingerprint: str,
    passage_prompt: str | None,
    max_seq_length: int,
    precision: str = "fp32",
) -> list[Path]:
    """Complete sibling split stores of ``out_dir`` written by the same encoder settings.

    A sibling qualifies when its ``meta.json`` says complete and records the same weights
    fingerprint, passage prompt, ``max_seq_length`` and vector precision (``fp32``: torch or
    onnx, interchangeable; ``bf16``; ``int8``: exactly equal, so one store holds one precision)
    -- the things a passage vector depends on.
    """
    from treerank.encoders.precision import store_precision

    out = Path(out_dir).resolve()
    found: list[Path] = []
    if not out.parent.is_dir():
        return found
    for meta_path in sorted(out.parent.glob(f"*/{META_JSON}")):
        if meta_path.parent == out:
            continue
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        enc = meta.get("encoder", {})
        if (
            meta.get("complete")
            and enc.get("fingerprint") == fingerprint
            and (enc.get("passage_prompt") or None) == (passage_prompt or None)
            and enc.get("max_seq_length") == max_seq_length
            and _precision(enc, store_precision) == precision
        ):
            found.append(meta_path.parent)
    return found


def _precision(enc: dict, store_precision: Any) -> str | None:
    try:
        return str(store_precision(enc))
    except ValueError:  # an unknown backend name: never reuse
        return None


def match_passages(
    texts: Sequence[str], sources: Sequence[Path]
) -> tuple[np.ndarray, list[EmbeddingStore], np.ndarray, np.ndarray]:
    """Find each text among the sources' passages (exact text match).

    Returns:
        ``(source_index int64 (n,), stores, source_row int64 (n,), matched bool (n,))`` where
        ``source_index[i]`` / ``source_row[i]`` locate text ``i`` (-1 when unmatched).
    """
    stores: list[EmbeddingStore] = []
    where: dict[str, tuple[int, int]] = {}
    for src in sources:
        try:
            store = EmbeddingStore.open(src)
            src_texts = store.passage_texts()
        except StoreFormatError:
            continue
        stores.append(store)
        for row, t in enumerate(src_texts):
            where.setdefault(t, (len(stores) - 1, row))
    n = len(texts)
    src_idx = np.full(n, -1, dtype=np.int64)
    src_row = np.full(n, -1, dtype=np.int64)
    for i, t in enumerate(texts):
        hit = where.get(t)
        if hit is not None:
            src_idx[i], src_row[i] = hit
    return src_idx, stores, src_row, src_idx >= 0
