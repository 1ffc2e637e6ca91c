"""A store split in a vector database (Qdrant), and the ``db:`` system kind that searches it.

Qdrant (``qdrant-client``) runs the same client code embedded in the process
(``QdrantClient(path=...)``: local mode, brute-force exact search, for tests and one machine)
and against a server or a sharded cluster (``QdrantClient(url=...)``, HNSW). A location is a
:class:`DBLocation`: a URL (``http://`` / ``https://``) or a local folder.

What :func:`export_to_db` writes, one point per passage row of the split:

* id: the passage's store row number (so a hit is a store passage id, as every treerank run);
* vector: the L2-normalised stored vector (``cosine``), or the passage tower of a head
  (``ckpt:<dir>``: ``encode_passages``, normalised under cosine scoring), scored by inner
  product (``Distance.DOT``), so the score equals treerank's exact-search score;
* payload: ``source_id`` (the corpus's own id), ``row`` and, unless left out, ``text``.

**Crash consistency.** Points go into a *physical* collection named after the content
(``<collection>--<digest>``, the digest of the store's identity and the head); its metadata says
``complete: false`` until the last batch is acknowledged (``wait=True``). Only then is the
*alias* ``<collection>`` switched to it (one atomic alias operation) and the collection it named
before dropped. A crash half-way leaves the alias on the old, complete collection (or on
nothing); the re-export finds the incomplete physical collection, drops it and writes it again.
Searches go through the alias, so they never see a half-written collection.

The ``db:`` system (``db:<path or url>[:collection]``) ranks every passage of the exported split
for the store's queries: the stored query vectors, L2-normalised, or the head's query tower when
the collection holds a head's passage tower (the head is read from the checkpoint recorded in
the collection's metadata, fingerprint-checked against the store). The store it is asked to rank
must be the split that was exported (same signature and passage count), or it is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from treerank.encoders.precision import vector_precision
from treerank.kernels.topk import RUN_DEPTH
from treerank.kernels.vectors import F32, Vecs, l2_normalize
from treerank.search.run import Run
from treerank.storelike import StoreLike

if TYPE_CHECKING:
    from qdrant_client import QdrantClient
    from qdrant_client import models as qm


class HeadIdentity(TypedDict):
    """The head a collection's passage vectors went through (``metadata.treerank.head``)."""

    checkpoint: str
    weights_sha256: str


__all__ = [
    "DBLocation",
    "DBSystem",
    "DBExport",
    "build_db_system",
    "export_to_db",
    "parse_db_spec",
]

_COLLECTION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SEP = "--"
DEFAULT_BATCH = 512
QUERY_BATCH = 64


@dataclass(frozen=True)
class DBLocation:
    """Where a Qdrant database lives: ``url`` (server / cluster) or ``path`` (embedded).

    Rendered by ``str()`` as the URL or the path; ``QDRANT_API_KEY`` in the environment is
    passed to a server when set.
    """

    url: str | None = None
    path: Path | None = None

    @classmethod
    def of(cls, text: str) -> DBLocation:
        """A URL when ``text`` starts with ``http://`` / ``https://``, else a local folder.

        Raises:
            ValueError: empty ``text``.
        """
        text = text.strip()
        if not text:
            raise ValueError("empty database location (expected a folder or http(s):// URL)")
        if text.startswith(("http://", "https://")):
            return cls(url=text.rstrip("/"))
        return cls(path=Path(text).expanduser())

    def __str__(self) -> str:
        return self.url if self.url is not None else str(self.path)

    @contextlib.contextmanager
    def client(self) -> Iterator[QdrantClient]:
        """An open ``QdrantClient`` (closed on exit: local mode locks its folder).

        Raises:
            ImportError: ``qdrant-client`` is not installed (the ``db`` extra).
        """
        try:
            from qdrant_client import QdrantClient
        except ImportError as exc:  # pragma: no cover - the db extra is in dev
            raise ImportError(
                "the vector database needs qdrant-client: pip install 'treerank[db]'"
            ) from exc
        if self.url is not None:
            client = QdrantClient(  # no version probe: its thread warns when no server runs
                url=self.url, api_key=os.environ.get("QDRANT_API_KEY"), check_compatibility=False
            )
        else:
            assert self.path is not None
            self.path.mkdir(parents=True, exist_ok=True)
            client = QdrantClient(path=str(self.path))
        try:
            yield client
        finally:
            client.close()


def parse_db_spec(body: str, spec: str) -> tuple[DBLocation, str | None]:
    """``"<path or url>[:collection]"`` -> ``(location, collection or None)``.

    The text after the last ``:`` is the collection when it is a collection name (letters,
    digits, ``_.-``, not only digits: ``http://host:6333`` ends in a port) and not a Windows
    drive; otherwise the whole body is the location.

    Raises:
        ValueError: empty body (message names ``spec``).
    """
    if not body.strip():
        raise ValueError(f"bad system spec {spec!r}: expected db:<folder or url>[:collection]")
    head, colon, tail = body.rpartition(":")
    if colon and head and _COLLECTION.match(tail) and not tail.isdigit() and "/" not in tail:
        if not head.endswith(("http", "https")) and len(head) > 1:
            return DBLocation.of(head), tail
    return DBLocation.of(body), None


def _store_identity(store: StoreLike) -> dict[str, object]:
    meta = store.meta
    return {
        "split": str(meta.get("split", store.split)),
        "signature": str(meta.get("signature") or meta.get("data_sha256") or ""),
        "n_passages": int(store.n_passages),
        "dim": int(store.dim),
        "encoder_fingerprint": store.encoder_fingerprint or "",
    }


def _head_identity(head_dir: Path | None) -> HeadIdentity | None:
    if head_dir is None:
        return None
    weights = head_dir / "weights.safetensors"
    if not weights.is_file() and (head_dir / "checkpoint" / "weights.safetensors").is_file():
        weights = head_dir / "checkpoint" / "weights.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else ""
    return HeadIdentity(checkpoint=str(head_dir.resolve()), weights_sha256=digest)


@dataclass(frozen=True)
class DBExport:
    """What :func:`export_to_db` wrote: ``collection`` (the alias searched) names
    ``physical``; ``n_points`` points of ``dim`` dims; ``reused`` when it was already there."""

    location: str
    collection: str
    physical: str
    n_points: int
    dim: int
    reused: bool


def _physical_name(collection: str, identity: Mapping[str, object]) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{collection}{_SEP}{digest}"


def _alias_target(client: QdrantClient, alias: str) -> str | None:
    for a in client.get_aliases().aliases:
        if a.alias_name == alias:
            return str(a.collection_name)
    return None


def export_to_db(
    store: StoreLike,
    location: DBLocation | str,
    collection: str,
    *,
    head: str | Path | None = None,
    texts: bool = True,
    batch_size: int = DEFAULT_BATCH,
    progress: bool = False,
    stop_after_batches: int | None = None,
    classes: Callable[[str], type] | None = None,
) -> DBExport:
    """Write a store split (raw vectors or a head's passage tower) as a Qdrant collection.

    Args:
        store: an opened store split (``EmbeddingStore``).
        location: a :class:`DBLocation` or its text (folder or URL).
        collection: the alias that searches use (letters, digits, ``_.-``).
        head: a linear / MLP checkpoint directory: the points are its passage tower's vectors,
            and the ``db:`` system encodes queries with its query tower. ``None``: the stored
            vectors, L2-normalised (the ``cosine`` system).
        texts: put each passage's text in its payload (when the store has texts).
        batch_size: points per upload request.
        progress: show a tqdm bar.
        stop_after_batches: testing hook: raise ``RuntimeError`` after this many batches, as a
            crash half-way would (the collection is left incomplete, the alias untouched).
        classes: ``model_type -> model class`` for ``head``
            (:data:`~treerank.models.registry.ModelClassOf`; ``None``: the models layer's
            families; ``treerank.families.model_class``: every family).

    Returns:
        A :class:`DBExport`.

    Raises:
        ValueError: a bad collection name, a head that is not a dense scorer, or a store whose
            vectors are not finite (checked before anything is written).
        EncoderMismatchError: the head was trained on another encoder's vectors.
    """
    from qdrant_client import models as qm

    if not _COLLECTION.match(collection) or _SEP in collection:
        raise ValueError(
            f"bad collection name {collection!r}: use letters, digits, '_', '.', '-' "
            f"(not {_SEP!r}), starting with a letter or digit"
        )
    loc = DBLocation.of(location) if isinstance(location, str) else location
    head_dir = Path(head) if head is not None else None
    transform, dim = _passage_tower(store, head_dir, classes)
    identity = {"store": _store_identity(store), "head": _head_identity(head_dir)}
    physical = _physical_name(collection, identity)
    ids = store.passage_ids() if store.has_texts else None
    bodies = store.passage_texts() if texts and store.has_texts else None
    n = int(store.n_passages)
    with loc.client() as client:
        if client.collection_exists(physical):
            info = client.get_collection(physical)
            if (info.config.metadata or {}).get("complete") is True:
                _switch_alias(client, collection, physical)
                return DBExport(str(loc), collection, physical, n, dim, reused=True)
            client.delete_collection(physical)  # a crash half-way: write it again
        client.create_collection(
            physical,
            vectors_config=qm.VectorParams(size=dim, distance=qm.Distance.DOT),
            metadata={"treerank": identity, "complete": False, "dim": dim},
        )
        from tqdm.auto import tqdm

        bar = tqdm(total=n, unit="p", disable=not progress, desc=f"export {collection}")
        try:
            for done, start in enumerate(range(0, n, batch_size), start=1):
                stop = min(n, start + batch_size)
                _upload_batch(client, physical, store, transform, start, stop, ids, bodies)
                bar.update(stop - start)
                if stop_after_batches is not None and done >= stop_after_batches and stop < n:
                    raise RuntimeError(f"stopped after {done} batches (stop_after_batches)")
        finally:
            bar.close()
        count = int(client.count(physical, exact=True).count)
        if count != n:
            raise RuntimeError(f"{loc}: {physical} holds {count} points, expected {n}")
        client.update_collection(physical, metadata={"complete": True, "n_points": n})
        _switch_alias(client, collection, physical)
    return DBExport(str(loc), collection, physical, n, dim, reused=False)


def _passage_tower(
    store: StoreLike, head_dir: Path | None, classes: Callable[[str], type] | None
) -> tuple[Callable[[F32], Vecs], int]:
    """``(passage transform, its output dimension)``: L2 normalisation of the stored vectors
    without a head; else the head's passage tower, loaded against the store's encoder and
    probed on the first passage before anything is written. Raises ValueError (not a dense
    scorer, or a tower whose output is not ``(1, out_dim)``) and EncoderMismatchError."""
    if head_dir is None:
        return l2_normalize, int(store.dim)
    from treerank.models.base import DenseScorer
    from treerank.models.registry import load_model, model_class

    model = load_model(
        head_dir,
        expected_fingerprint=store.encoder_fingerprint,
        expected_precision=vector_precision(store),
        classes=classes or model_class,
    )
    model_type = str(getattr(model, "model_type", ""))
    if not isinstance(model, DenseScorer) or getattr(model, "own_retrieval", False):
        raise ValueError(
            f"{head_dir}: a {model_type!r} model has no passage vectors to store "
            "(only dense families: linear, mlp, cosine-like)"
        )
    dim = int(getattr(model, "out_dim", store.dim))
    probe = np.asarray(model.encode_passages(np.asarray(store.passages[:1], dtype=np.float32)))
    if probe.ndim != 2 or probe.shape[1] != dim:  # checked before the collection exists
        raise ValueError(
            f"{head_dir}: its passage tower gives vectors of shape {tuple(probe.shape)}, "
            f"not (1, {dim}); it cannot be stored as a {dim}-dimensional collection"
        )
    return model.encode_passages, dim


def _upload_batch(
    client: QdrantClient,
    physical: str,
    store: StoreLike,
    transform: Callable[[F32], Vecs],
    start: int,
    stop: int,
    ids: Sequence[str] | None,
    bodies: Sequence[str] | None,
) -> None:
    """Upsert passages ``start .. stop - 1`` (point id = store row; payload: the row, its
    source id and its text where given), waiting for the write. Raises ValueError on a
    non-finite vector, before that batch is sent."""
    from qdrant_client import models as qm

    vecs = np.asarray(
        transform(np.asarray(store.passages[start:stop], dtype=np.float32)), np.float32
    )
    if not np.isfinite(vecs).all():
        raise ValueError(f"{store.path}: non-finite passage vectors in rows {start}:{stop}")
    payloads = []
    for i in range(start, stop):
        p: dict[str, object] = {"row": i}
        if ids is not None:
            p["source_id"] = ids[i]
        if bodies is not None:
            p["text"] = bodies[i]
        payloads.append(p)
    client.upsert(
        physical,
        points=qm.Batch(ids=list(range(start, stop)), vectors=vecs.tolist(), payloads=payloads),
        wait=True,
    )


def _switch_alias(client: QdrantClient, alias: str, physical: str) -> None:
    """Point ``alias`` at ``physical`` in one alias operation, then drop what it named before."""
    from qdrant_client import models as qm

    old = _alias_target(client, alias)
    if old == physical:
        return
    ops: list[qm.DeleteAliasOperation | qm.CreateAliasOperation] = []
    if old is not None:
        ops.append(qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=alias)))
    ops.append(
        qm.CreateAliasOperation(
            create_alias=qm.CreateAlias(collection_name=physical, alias_name=alias)
        )
    )
    client.update_collection_aliases(change_aliases_operations=ops)
    if old is not None and client.collection_exists(old):
        client.delete_collection(old)


def _resolve(
    client: QdrantClient, loc: DBLocation, collection: str | None, spec: str
) -> tuple[str, str]:
    aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
    if collection is None:
        if len(aliases) != 1:
            known = ", ".join(sorted(aliases)) or "none"
            raise ValueError(
                f"system spec {spec!r}: {loc} holds {len(aliases)} exported collections "
                f"({known}); name one: db:{loc}:<collection>"
            )
        collection = next(iter(aliases))
    if collection not in aliases:
        known = ", ".join(sorted(aliases)) or "none"
        raise ValueError(
            f"system spec {spec!r}: no exported collection {collection!r} at {loc} "
            f"(exported: {known}); write it with `treerank export <store> --to db:{loc}:"
            f"{collection}`"
        )
    return collection, str(aliases[collection])


class DBSystem:
    """Search an exported collection for the store's queries (see the module docstring)."""

    def __init__(self, location: DBLocation, collection: str | None, name: str) -> None:
        self.location = location
        self.collection = collection
        self.name = name
        self.head: str | None = None
        """``ckpt:<dir>`` of the head whose towers the collection holds, once searched (so
        ``uses_trained_model`` sees it)."""

    def _query_vectors(self, store: StoreLike, head: HeadIdentity | None) -> F32:
        q = np.asarray(store.queries, dtype=np.float32)
        if head is None:
            return l2_normalize(q)
        from treerank.models.registry import load_model

        self.head = f"ckpt:{head['checkpoint']}"
        model = load_model(
            head["checkpoint"],
            expected_fingerprint=store.encoder_fingerprint,
            expected_precision=vector_precision(store),
        )
        return np.asarray(model.encode_queries(q), np.float32)

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        """Top-``k`` passages (store row ids) for every query of ``store``.

        Raises:
            ValueError: no such collection, an incomplete one, or ``store`` is not the split
                that was exported.
        """
        from qdrant_client import models as qm

        with self.location.client() as client:
            alias, physical = _resolve(client, self.location, self.collection, self.name)
            meta = dict(client.get_collection(physical).config.metadata or {})
            if meta.get("complete") is not True:
                raise ValueError(f"{self.name}: collection {physical} is incomplete; re-export")
            want = (meta.get("treerank") or {}).get("store") or {}
            have = _store_identity(store)
            for key in ("signature", "n_passages", "encoder_fingerprint", "split"):
                if want.get(key) != have[key]:
                    raise ValueError(
                        f"{self.name}: collection {alias!r} was exported from another split "
                        f"({key} {want.get(key)!r} != this store's {have[key]!r}); "
                        "evaluate it on the store it was exported from"
                    )
            q = self._query_vectors(store, (meta.get("treerank") or {}).get("head"))
            k = min(k, int(store.n_passages))
            ids = np.full((q.shape[0], k), -1, np.int64)
            scores = np.full((q.shape[0], k), -np.inf, np.float32)
            for s in range(0, q.shape[0], QUERY_BATCH):
                reqs = [
                    qm.QueryRequest(query=v.tolist(), limit=k, with_payload=False)
                    for v in q[s : s + QUERY_BATCH]
                ]
                for r, res in enumerate(client.query_batch_points(physical, requests=reqs)):
                    pts = sorted(res.points, key=lambda p: (-float(p.score), int(p.id)))
                    ids[s + r, : len(pts)] = [int(p.id) for p in pts]
                    scores[s + r, : len(pts)] = [float(p.score) for p in pts]
        return Run(self.name, ids, scores)


def exported_head(location: DBLocation, collection: str | None, spec: str) -> str | None:
    """The checkpoint directory of the head whose towers an embedded collection holds (its
    ``treerank.head`` metadata), ``None`` when it holds plain vectors, is a server's (not read
    here), or cannot be read yet (not exported: searching it will say so)."""
    if location.path is None or not location.path.is_dir():
        return None
    with contextlib.suppress(Exception):
        with location.client() as client:
            _, physical = _resolve(client, location, collection, spec)
            meta = client.get_collection(physical).config.metadata or {}
            head = (meta.get("treerank") or {}).get("head")
            return str(head["checkpoint"]) if head else None
    return None


def build_db_system(location: DBLocation, collection: str | None, name: str) -> DBSystem:
    """The system of a parsed ``db:`` spec (:func:`parse_db_spec`); an embedded collection's
    head is named now (:func:`exported_head`)."""
    system = DBSystem(location, collection, name=name)
    head = exported_head(location, collection, name)
    system.head = f"ckpt:{head}" if head else None
    return system
