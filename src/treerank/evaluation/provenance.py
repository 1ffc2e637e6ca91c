"""Where a trained model's training queries came from, and whether an evaluation reuses them.

A model directory's ``config.json`` records the store split it trained on
(:func:`training_provenance`: path, split, the embed signature, and an 8-byte hash of every
training query's id and of its normalised text). :func:`check_leaks` compares that record with
the split being evaluated, before any retrieval: the same split, or a split whose query ids or
query texts overlap the training queries (one file read under two split names is caught by its
texts), is a *leak*. A leak is not refused: it is printed as a warning and flagged in
``results.json`` (``leaks``) and ``table.md`` (the chosen behaviour; a number measured on the
queries a model trained on is a memorisation number, not an error in the input).

:func:`check_train_store` checks the ``--train-store`` of the seen / unseen breakdown: a train
store sharing no passage id and no passage text with the evaluated split is of another
collection, and is refused (every query would otherwise show as "without a training positive").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from treerank.storelike import StoreLike, Texts, meta_text

__all__ = [
    "Leak",
    "TrainStoreMismatchError",
    "check_leaks",
    "check_train_store",
    "text_key",
    "training_provenance",
]

HASH_BYTES = 8


def _hash(value: str) -> str:
    return hashlib.blake2b(value.encode("utf-8"), digest_size=HASH_BYTES).hexdigest()


def text_key(text: str) -> str:
    """The hash of a query or passage text, case and white space folded (16 hex digits)."""
    return _hash(" ".join(text.casefold().split()))


def _texts(store: Texts, kind: str) -> list[str] | None:
    if not store.has_texts:
        return None
    try:
        return list(store.query_texts() if kind == "query" else store.passage_texts())
    except (OSError, ValueError, KeyError, FileNotFoundError):
        return None


def _digest(hashes: Iterable[str]) -> str:
    return hashlib.sha256("".join(sorted(hashes)).encode()).hexdigest()


def training_provenance(store: StoreLike) -> dict[str, object]:
    """The record a model directory keeps of the store split it trained on.

    Every query of the split counts (the held-out ones steer early stopping, so they were seen
    too).

    Returns:
        ``{"store": str path, "split": str | None, "signature": str | None (meta.json's embed
        signature), "data_sha256": str | None, "n_queries": int, "query_ids_digest": hex
        SHA-256, "query_id_hashes": str, "query_text_hashes": str | None}``; the two
        ``*_hashes`` are 16-hex-digit hashes (:data:`HASH_BYTES` bytes) concatenated, in row
        order (``None``: a store without texts).
    """
    meta = store.meta
    ids = [_hash(q) for q in store.query_ids()]
    texts = _texts(store, "query")
    return {
        "store": str(store.path),
        "split": store.split,
        "signature": meta.get("signature"),
        "data_sha256": meta.get("data_sha256"),
        "n_queries": len(ids),
        "query_ids_digest": _digest(ids),
        "query_id_hashes": "".join(ids),
        "query_text_hashes": None if texts is None else "".join(text_key(t) for t in texts),
    }


def _unpack(joined: str | None) -> set[str]:
    if not joined:
        return set()
    w = 2 * HASH_BYTES
    return {joined[i : i + w] for i in range(0, len(joined), w)}


@dataclass(frozen=True)
class Leak:
    """A trained system evaluated on queries it trained on.

    Attributes:
        system: the system's name. trained_on: the training store path and split.
        same_split: the evaluated split is the training split (same store path, or the same
            embed signature). by_id / by_text: evaluated queries whose id / normalised text is
            a training query's. n_queries: evaluated queries.
    """

    system: str
    trained_on: str
    same_split: bool
    by_id: int
    by_text: int
    n_queries: int

    def message(self) -> str:
        """One line for the console and ``table.md``."""
        what = (
            "the very split it trained on"
            if self.same_split
            else "a split whose queries overlap its training queries"
        )
        return (
            f"{self.system} is evaluated on {what} ({self.trained_on}): {self.by_id} of "
            f"{self.n_queries} evaluated query ids and {self.by_text} query texts are training "
            "queries, so its numbers measure memorisation, not generalisation; evaluate it on "
            "a split it did not train on"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "trained_on": self.trained_on,
            "same_split": self.same_split,
            "queries_by_id": self.by_id,
            "queries_by_text": self.by_text,
            "n_queries": self.n_queries,
            "message": self.message(),
        }


def check_leaks(store: Texts, provenances: Mapping[str, Mapping[str, object] | None]) -> list[Leak]:
    """The systems whose training queries overlap the queries of ``store``.

    Args:
        store: the evaluated split.
        provenances: system name -> its :func:`training_provenance` record (``None``: none
            recorded, e.g. a checkpoint written before the record existed: skipped).

    Returns:
        One :class:`Leak` per system with any overlap, in the given order.
    """
    known = {n: p for n, p in provenances.items() if p}
    if not known:
        return []
    ids = [_hash(q) for q in store.query_ids()]
    texts = _texts(store, "query")
    text_keys = [text_key(t) for t in texts] if texts is not None else []
    meta = store.meta
    here = str(store.path)
    out = []
    for name, prov in known.items():
        train_ids = _unpack(meta_text(prov, "query_id_hashes"))
        train_texts = _unpack(meta_text(prov, "query_text_hashes"))
        by_id = sum(h in train_ids for h in ids)
        by_text = sum(h in train_texts for h in text_keys)
        same = bool(prov.get("store")) and prov.get("store") == here
        sig = meta.get("signature")
        same = same or (sig is not None and sig == prov.get("signature"))
        # ids alone are no evidence when both sides have texts and none matches: two
        # collections that share an id scheme (q1, q2, ...) are not a leak
        texts_known = bool(text_keys) and bool(train_texts)
        if texts_known and not by_text:
            by_id = 0
        if same or by_id or by_text:
            where = f"{prov.get('store')} (split {prov.get('split')})"
            out.append(Leak(name, where, same, by_id, by_text, len(ids)))
    return out


class TrainStoreMismatchError(ValueError):
    """The ``--train-store`` of the seen / unseen breakdown is of another collection."""


def check_train_store(store: Texts, train_store: Texts) -> None:
    """Refuse a train store that shares no passage with the evaluated split.

    Passages are matched by source id, then (stores with texts) by normalised text.

    Raises:
        TrainStoreMismatchError: no passage id and no passage text in common (naming both
            stores).
    """
    ev = set(store.passage_ids())
    if ev & set(train_store.passage_ids()):
        return
    a, b = _texts(store, "passage"), _texts(train_store, "passage")
    if a is not None and b is not None and {text_key(t) for t in a} & {text_key(t) for t in b}:
        return
    raise TrainStoreMismatchError(
        f"--train-store {train_store.path} shares no passage (by id or text) "
        f"with the evaluated split {store.path}: it is a store of another "
        "collection, so the seen / unseen breakdown would call every query unseen; pass the "
        "training split of this collection, or --no-overlap"
    )
