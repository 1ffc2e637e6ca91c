"""Batch invariance of the service (issue 36): a query gets the same ids, order and scores
whichever requests share its micro-batch.

The fake encoder behaves like a padded batch of MiniLM does, exaggerated so that the effect is
certain: a text's vector moves with the batch it is encoded in. Alone, every query sits exactly
between passages 0 and 1 (a tie, broken by ascending id: 0 first); in a batch of n texts it
leans towards passage 1 by ``1e-6 * (n - 1)``, which swaps the two. The old service encoded the
whole micro-batch at once, so the order depended on the traffic.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.search.tiny_store import write_tiny_store
from treerank.serve.app import create_app
from treerank.serve.service import SearchService, ServiceConfig
from treerank.store import EmbeddingStore

DIM = 16
ANGLE = 0.3


class BatchSensitiveEncoder:
    name = "fake"
    fingerprint = "sha256:fake"

    def __init__(self) -> None:
        from treerank.encoders.backend import get_backend

        self.backend = get_backend("torch")
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def encode_queries(self, texts: list[str], progress: bool = False) -> np.ndarray:
        with self._lock:
            self.batches.append(len(texts))
        q = np.zeros((len(texts), DIM), np.float32)
        q[:, 0] = 1.0
        q[:, 1] = -1e-6 * (len(texts) - 1)  # towards passage 1 when others share the batch
        return q


def _tied_store(root: Path) -> EmbeddingStore:
    store = write_tiny_store(root, dim=DIM)
    p = np.asarray(store.passages, dtype=np.float32).copy()
    p[:, 0] = -np.abs(p[:, 0])  # every other passage scores below the two tied ones
    p[0] = 0.0
    p[1] = 0.0
    p[0, 0] = p[1, 0] = np.cos(ANGLE)
    p[0, 1], p[1, 1] = np.sin(ANGLE), -np.sin(ANGLE)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    p.astype("<f4").tofile(root / "passages.bin")
    meta = json.loads((root / "meta.json").read_text())
    meta.pop("finite", None)
    (root / "meta.json").write_text(json.dumps(meta))
    return EmbeddingStore.open(root)


@pytest.fixture()
def service(tmp_path: Path) -> SearchService:
    _tied_store(tmp_path / "s")
    systems = ("cosine", "faiss:flat", "faiss:hnsw", "rrf:bm25+cosine")
    return SearchService(
        ServiceConfig(store=tmp_path / "s", systems=systems), encoder=BatchSensitiveEncoder()
    )


def _ranking(hits) -> list[tuple[int, float]]:  # type: ignore[no-untyped-def]
    return [(h.passage_id, h.score) for h in hits]


def test_a_query_ranks_alike_alone_and_in_any_batch(service: SearchService) -> None:
    texts = ["dogs bark loudly", "cats purr softly", "fish swim", "birds sing at dawn"] * 6
    for system in service.systems:
        alone = [_ranking(service.search([t], k=3, system=system)[0]) for t in texts]
        if not system.startswith("rrf"):  # the dense tie, broken by the lower id
            assert [pid for pid, _ in alone[0][:2]] == [0, 1], system
        together = [_ranking(h) for h in service.search(texts, k=3, system=system)]
        assert together == alone, system  # ids, order and float32 scores, exactly
        pairs = [_ranking(h) for h in service.search(texts[5:7], k=3, system=system)]
        assert pairs == alone[5:7], system
    assert set(service.encoder.batches) == {1}  # every text was encoded alone


def test_16_concurrent_clients_get_the_sequential_rankings(service: SearchService) -> None:
    # the micro-batcher groups concurrent requests into one search() call: the answers must
    # not depend on who else was in it
    texts = [f"query {i} about dogs and cats" for i in range(56)]
    app = create_app(service)
    with TestClient(app) as client:
        sequential = [
            client.post("/search", json={"query": t, "k": 3}).json()["results"][0]["hits"]
            for t in texts
        ]

        def ask(t: str) -> list[dict]:  # type: ignore[type-arg]
            r = client.post("/search", json={"query": t, "k": 3})
            assert r.status_code == 200, r.text
            return r.json()["results"][0]["hits"]  # type: ignore[no-any-return]

        with ThreadPoolExecutor(max_workers=16) as pool:
            concurrent = list(pool.map(ask, texts))
        batching = client.get("/info").json()["batching"]
    key = [[(h["passage_id"], h["score"]) for h in hs] for hs in sequential]
    assert [[(h["passage_id"], h["score"]) for h in hs] for hs in concurrent] == key
    assert all(k[0][0] == 0 for k in key)
    assert batching["texts"] >= 2 * 56  # every request went through the batcher


def test_no_batch_invariant_encodes_the_batch_together(tmp_path: Path) -> None:
    # the throughput option: one encode per batch, so the exaggerated batch effect shows
    _tied_store(tmp_path / "s")
    encoder = BatchSensitiveEncoder()
    service = SearchService(
        ServiceConfig(store=tmp_path / "s", systems=("cosine",), batch_invariant=False),
        encoder=encoder,
    )
    alone = service.search(["dogs"], k=2)[0]
    together = service.search(["dogs", "cats", "fish"], k=2)[0]
    assert [h.passage_id for h in alone] == [0, 1]
    assert [h.passage_id for h in together] == [1, 0]  # leaned towards passage 1
    assert encoder.batches[-1] == 3
    assert service.info()["batching"]["invariant"] is False
