"""The ``db:`` system on Qdrant's embedded engine (``QdrantClient(path=...)``, exact search), on
a real 400-passage SciFact slice: its top-k equals `exact_search` (ids compared wherever
consecutive scores differ by more than 1e-6, scores within 1e-5), with raw vectors and with a
head's towers; ``evaluate``, fusion and rescoring run on it; a crash half-way (an exception, and
a SIGKILL of a child process) leaves the alias on a complete collection and a re-export leaves
exactly one consistent collection."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from treerank.evaluation.settings import EvaluationSettings
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.models.checkpoint import save_checkpoint
from treerank.models.linear import LinearHead
from treerank.search.specs import build_system
from treerank.search.vector_db import DBLocation, export_to_db, parse_db_spec

pytest.importorskip("qdrant_client")  # in the db and dev extras: CI installs it

TOL_SCORE = 1e-5
TIE_GAP = 1e-6


@pytest.fixture(scope="module")
def store(encoder, scifact_zip):
    from tests.conftest import cached_store
    from treerank.readers import read_split

    return cached_store(
        "scifact400",
        lambda: [read_split(scifact_zip, "scifact", "test", max_passages=400)],
        encoder,
    )["test"]


def assert_same_topk(run, ids: np.ndarray, scores: np.ndarray) -> None:
    """Scores equal within TOL_SCORE; ids equal at every rank not inside a near-tie."""
    assert run.ids.shape == ids.shape
    assert np.abs(run.scores - scores).max() <= TOL_SCORE
    gaps = np.abs(np.diff(scores, axis=1))
    clear = np.ones(ids.shape, bool)  # rank r is unambiguous if it is apart from both neighbours
    clear[:, 1:] &= gaps > TIE_GAP
    clear[:, :-1] &= gaps > TIE_GAP
    clear[:, -1] = False  # the k-th may tie with the (k+1)-th, which neither side shows
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(run.ids[clear], ids[clear])


def _head(encoder, path: Path) -> Path:
    head = LinearHead(384, bias=True)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    save_checkpoint(path, head.eval().to_checkpoint(encoder.name, encoder.fingerprint))
    return path


def test_raw_vectors_topk_equals_exact_search(store, tmp_path):
    res = export_to_db(store, str(tmp_path / "qd"), "scifact", batch_size=128)
    assert (res.n_points, res.dim, res.reused) == (400, 384, False)
    run = build_system(f"db:{tmp_path / 'qd'}:scifact").retrieve(store, 50)
    ids, scores = exact_search(
        l2_normalize(np.asarray(store.queries)), l2_normalize(np.asarray(store.passages)), k=50
    )
    assert_same_topk(run, ids, scores)
    # one collection at the location: the collection may be left out of the spec
    assert_same_topk(build_system(f"db:{tmp_path / 'qd'}").retrieve(store, 50), ids, scores)
    # the same export again is recognised as complete, nothing rewritten
    assert export_to_db(store, str(tmp_path / "qd"), "scifact").reused


def test_head_towers_topk_equals_checkpoint_search(encoder, store, tmp_path):
    from treerank.models.registry import load_model

    ckpt = _head(encoder, tmp_path / "head")
    res = export_to_db(store, DBLocation.of(str(tmp_path / "qd")), "head", head=ckpt)
    assert res.dim == 384
    head = load_model(ckpt)
    ids, scores = exact_search(
        head.encode_queries(np.asarray(store.queries)),
        store.passages,
        k=30,
        passage_transform=head.encode_passages,
    )
    system = build_system(f"db:{tmp_path / 'qd'}:head")
    from treerank.search.specs import parse_spec, system_uses_trained_model, uses_trained_model

    assert system.head == f"ckpt:{ckpt.resolve()}" and system_uses_trained_model(system)
    assert uses_trained_model(parse_spec(f"db:{tmp_path / 'qd'}:head"))  # a tree query
    assert not system_uses_trained_model(build_system(f"db:{tmp_path / 'qd'}:nothing-here"))
    run = system.retrieve(store, 30)
    assert_same_topk(run, ids, scores)
    # and it differs from raw cosine (the head really is applied on both sides)
    raw_ids, _ = exact_search(
        l2_normalize(np.asarray(store.queries)), l2_normalize(np.asarray(store.passages)), k=30
    )
    assert (raw_ids[:, :10] != ids[:, :10]).any()


def test_evaluate_fusion_and_rescore_run_on_db(store, tmp_path):
    from treerank.evaluation.compare import compare_systems

    export_to_db(store, str(tmp_path / "qd"), "scifact")
    db = f"db:{tmp_path / 'qd'}:scifact"
    comp = compare_systems(
        store,
        ["cosine", db, f"rrf:{db}+bm25", f"rescore:{db}:depth=50,scorer=cosine"],
        settings=EvaluationSettings(
            baseline="cosine",
            k=100,
            metrics=("mrr@10", "ndcg@10", "recall@100"),
            n_permutations=100,
        ),
    )
    assert not comp.failed, comp.failed
    cos, got = comp.results["cosine"].mean, comp.results[db].mean
    for m, v in cos.items():
        assert abs(got[m] - v) <= 1e-4, m
    assert comp.results[f"rrf:{db}+bm25"].mean["ndcg@10"] > 0.1
    assert (
        abs(comp.results[f"rescore:{db}:depth=50,scorer=cosine"].mean["mrr@10"] - cos["mrr@10"])
        <= 1e-4
    )


def _points(location: Path, collection: str) -> tuple[list[int], np.ndarray, list[dict]]:
    with DBLocation(path=location).client() as client:
        pts, _ = client.scroll(collection, limit=10_000, with_vectors=True, with_payload=True)
    pts = sorted(pts, key=lambda p: int(p.id))
    return (
        [int(p.id) for p in pts],
        np.array([p.vector for p in pts], np.float32),
        [dict(p.payload) for p in pts],
    )


def _collections(location: Path) -> tuple[list[str], dict[str, str]]:
    with DBLocation(path=location).client() as client:
        names = sorted(c.name for c in client.get_collections().collections)
        aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
    return names, aliases


def _check_consistent(store, location: Path, collection: str, vectors: np.ndarray) -> None:
    ids, vecs, payloads = _points(location, collection)
    assert ids == list(range(store.n_passages))
    np.testing.assert_allclose(vecs, vectors, atol=1e-6)
    assert [p["source_id"] for p in payloads] == store.passage_ids()
    assert [p["text"] for p in payloads] == store.passage_texts()
    names, aliases = _collections(location)
    assert names == [aliases[collection]]  # exactly one physical collection, the aliased one


def test_crash_half_way_then_reexport_is_consistent(encoder, store, tmp_path):
    loc = tmp_path / "qd"
    export_to_db(store, str(loc), "scifact", batch_size=64)  # a complete, older export
    old = _collections(loc)[1]["scifact"]
    ckpt = _head(encoder, tmp_path / "head")
    with pytest.raises(RuntimeError, match="stop_after_batches"):
        export_to_db(store, str(loc), "scifact", head=ckpt, batch_size=64, stop_after_batches=3)
    names, aliases = _collections(loc)
    assert aliases["scifact"] == old and len(names) == 2  # searches still see the old one
    raw = l2_normalize(np.asarray(store.passages))
    ids, vecs, _ = _points(loc, old)
    assert len(ids) == 400 and np.abs(vecs - raw).max() <= 1e-6
    res = export_to_db(store, str(loc), "scifact", head=ckpt, batch_size=64)
    assert not res.reused and res.physical != old
    from treerank.models.registry import load_model

    _check_consistent(store, loc, "scifact", load_model(ckpt).encode_passages(store.passages))
    # a first export that crashes leaves no alias: the db system says so
    with pytest.raises(RuntimeError):
        export_to_db(store, str(loc), "fresh", batch_size=64, stop_after_batches=1)
    with pytest.raises(ValueError, match="no exported collection 'fresh'"):
        build_system(f"db:{loc}:fresh").retrieve(store, 10)
    export_to_db(store, str(loc), "fresh", batch_size=64)
    ids, vecs, _ = _points(loc, "fresh")
    assert ids == list(range(400)) and np.abs(vecs - raw).max() <= 1e-6


def test_killed_export_then_reexport_is_consistent(store, tmp_path):
    """A real crash: the child process is SIGKILLed right after its second upload."""
    loc = tmp_path / "qd"
    child = textwrap.dedent(
        f"""
        import os, signal
        from qdrant_client import QdrantClient
        from treerank.search.vector_db import export_to_db
        from treerank.store import EmbeddingStore
        upsert, n = QdrantClient.upsert, [0]
        def killing_upsert(self, *a, **k):
            out = upsert(self, *a, **k)
            n[0] += 1
            if n[0] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        QdrantClient.upsert = killing_upsert
        store = EmbeddingStore.open({str(store.path)!r})
        export_to_db(store, {str(loc)!r}, "scifact", batch_size=64)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], env=os.environ.copy(), timeout=600)
    assert proc.returncode == -9
    names, aliases = _collections(loc)
    assert len(names) == 1 and "scifact" not in aliases
    export_to_db(store, str(loc), "scifact", batch_size=64)
    _check_consistent(store, loc, "scifact", l2_normalize(np.asarray(store.passages)))


def test_store_mismatch_and_bad_specs(store, msmarco_store, tmp_path):
    export_to_db(store, str(tmp_path / "qd"), "scifact")
    with pytest.raises(ValueError, match="exported from another split"):
        build_system(f"db:{tmp_path / 'qd'}:scifact").retrieve(msmarco_store["validation"], 10)
    with pytest.raises(ValueError, match="bad collection name"):
        export_to_db(store, str(tmp_path / "qd"), "a--b")
    with pytest.raises(ValueError, match="expected db:"):
        build_system("db:")
    assert parse_db_spec("http://localhost:6333", "s") == (
        DBLocation(url="http://localhost:6333"),
        None,
    )
    assert parse_db_spec("https://q.example.org:6333:msmarco-dev", "s") == (
        DBLocation(url="https://q.example.org:6333"),
        "msmarco-dev",
    )
    assert parse_db_spec("/data/qd:scifact", "s") == (DBLocation(path=Path("/data/qd")), "scifact")
    assert parse_db_spec("relative/qd", "s") == (DBLocation(path=Path("relative/qd")), None)
