"""The range of an encoder's ``max_seq_length``, read from the model's files before loading it.

A truncation length must lie in ``1..limit`` where ``limit`` is what the model can embed: its
position table (``max_position_embeddings`` of the transformer's ``config.json``; 512 for
all-MiniLM-L6-v2) and the tokenizer's ``model_max_length`` (``tokenizer_config.json``) when that
is smaller (RoBERTa-style models keep two positions for padding: 514 positions, 512 tokens).
A larger value would index past the position table (an IndexError deep in torch), so
:func:`check_max_seq_length` refuses it, with the range, before any work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["check_max_seq_length", "seq_length_limit"]

_NO_LIMIT = 1_000_000  # tokenizers without a limit say model_max_length = 1e30


def _model_dir(model: str | Path | None) -> Path | None:
    if model is None:
        from treerank.encoders.model_path import default_model_path

        return Path(default_model_path())
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:  # a hub name: the cached snapshot, offline
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(str(model), "config.json")
    except Exception:  # noqa: BLE001 - an unknown name is the loader's error, not ours
        return None
    return Path(hit).parent if isinstance(hit, str) else None


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read(path: Path) -> dict[str, Any]:
    doc = _load(path)
    return doc if isinstance(doc, dict) else {}


def seq_length_limit(model: str | Path | None) -> int | None:
    """The largest ``max_seq_length`` the model can take, from its files (nothing is loaded).

    Args:
        model: a sentence-transformers model directory or cached hub name; ``None``: the
            default all-MiniLM-L6-v2.

    Returns:
        ``min(max_position_embeddings, model_max_length)`` of the transformer module (its
        folder from ``modules.json``, else the model's root); ``None`` when neither is known.
    """
    root = _model_dir(model)
    if root is None:
        return None
    sub = ""
    modules = _load(root / "modules.json")
    for mod in modules if isinstance(modules, list) else []:
        if isinstance(mod, dict) and str(mod.get("type", "")).endswith("Transformer"):
            sub = str(mod.get("path") or "")
            break
    folder = root / sub if sub and (root / sub / "config.json").is_file() else root
    limits = []
    positions = _read(folder / "config.json").get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    tok = _read(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok, (int, float)) and 0 < tok < _NO_LIMIT:
        limits.append(int(tok))
    return min(limits) if limits else None


def check_max_seq_length(value: int | None, model: str | Path | None, where: str) -> None:
    """Refuse a truncation length outside ``1..seq_length_limit(model)``.

    Args:
        value: the requested ``max_seq_length`` (``None``: the model's default, accepted).
        model: as for :func:`seq_length_limit`.
        where: what to name in the message (``"--max-seq-length"``).

    Raises:
        ValueError: ``value < 1``, or above the model's limit (the message gives the range and
            where the limit comes from).
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected a whole number of tokens, got {value!r}")
    limit = seq_length_limit(model)
    name = "all-MiniLM-L6-v2" if model is None else str(model)
    if value < 1 or (limit is not None and value > limit):
        rng = f"1..{limit}" if limit is not None else ">= 1"
        why = (
            f" ({name} has {limit} positions: max_position_embeddings / model_max_length)"
            if limit is not None
            else ""
        )
        raise ValueError(f"{where} {value}: out of range; expected {rng} tokens{why}")
