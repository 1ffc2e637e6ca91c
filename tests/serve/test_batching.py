"""The micro-batcher and the app's limits, timeout and shutdown, on a fake service (no model).

The fake answers each text with one hit whose passage id is the text's length, so every answer
can be checked against its request; it records each engine call, and can be made slow.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from treerank.search.query import Hit
from treerank.serve.app import PortInUseError, bind_socket, create_app, make_server
from treerank.serve.batching import QueryBatcher, ServiceStopped
from treerank.serve.service import ServiceConfig


@dataclass
class _Stats:
    requests: int = 0
    queries: int = 0


@dataclass
class FakeService:
    config: ServiceConfig
    delay_s: float = 0.0
    calls: list[tuple[str, int, int]] = field(default_factory=list)
    stats: _Stats = field(default_factory=_Stats)
    systems: dict[str, Any] = field(default_factory=lambda: {"cosine": None, "bm25": None})
    default_system: str = "cosine"

    def info(self) -> dict[str, Any]:
        return {"systems": list(self.systems)}

    busy: bool = False

    def search(self, texts, k=10, system=None, count=True):
        self.calls.append((system, k, len(texts)))
        self.busy = True
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if any(t == "boom" for t in texts):
                raise RuntimeError("engine failed")
            return [[Hit(1, len(t), str(len(t)), float(k), t)] for t in texts]
        finally:
            self.busy = False


def _service(**cfg: Any) -> FakeService:
    delay = cfg.pop("delay_s", 0.0)
    return FakeService(ServiceConfig(store=Path("."), **cfg), delay_s=delay)


def test_concurrent_submits_share_one_engine_call() -> None:
    svc = _service()
    # the round closes when 12 texts wait (or after 10 s): no timing in the assertion
    b = QueryBatcher(svc, window_s=10.0, max_queries=12)
    b.start()
    texts = [f"q{'x' * i}" for i in range(12)]
    futures = [b.submit([t], 10, "cosine") for t in texts]
    answers = [f.result(timeout=10) for f in futures]
    b.stop()
    assert [a[0][0].passage_id for a in answers] == [len(t) for t in texts]
    assert svc.calls == [("cosine", 10, 12)]  # one call for all twelve requests
    assert b.stats.calls == 1 and b.stats.largest_call == 12


def test_groups_by_system_and_k_and_splits_large_requests() -> None:
    svc = _service()
    b = QueryBatcher(svc, window_s=0.2, max_queries=4)
    b.start()
    big = b.submit([f"t{i}" for i in range(10)], 10, "cosine")  # chunks of 4, 4, 2
    other_k = b.submit(["a"], 5, "cosine")
    other_sys = b.submit(["bb"], 10, "bm25")
    hits = big.result(timeout=10)
    assert [h[0].text for h in hits] == [f"t{i}" for i in range(10)]
    assert other_k.result(timeout=10)[0][0].score == 5.0
    assert other_sys.result(timeout=10)[0][0].passage_id == 2
    b.stop()
    assert sorted(svc.calls) == sorted(
        [("cosine", 10, 4), ("cosine", 10, 4), ("cosine", 10, 2), ("cosine", 5, 1), ("bm25", 10, 1)]
    )
    assert max(n for _, _, n in svc.calls) <= 4


def test_a_small_request_is_not_stuck_behind_a_large_one() -> None:
    svc = _service(delay_s=0.05)
    b = QueryBatcher(svc, window_s=0.0, max_queries=2)
    b.start()
    big = b.submit([f"t{i}" for i in range(40)], 10, "cosine")  # 20 chunks, 50 ms each
    time.sleep(0.01)
    small = b.submit(["s"], 10, "bm25")
    small.result(timeout=10)
    assert not big.done()  # answered while the large request still had chunks to go
    big.result(timeout=30)
    b.stop()


def test_engine_errors_reach_every_request_of_the_call_and_stop_refuses() -> None:
    svc = _service()
    b = QueryBatcher(svc, window_s=0.1)
    f1, f2 = b.submit(["boom"], 10, "cosine"), b.submit(["fine"], 10, "cosine")
    with pytest.raises(RuntimeError, match="engine failed"):
        f1.result(timeout=10)
    with pytest.raises(RuntimeError, match="engine failed"):
        f2.result(timeout=10)
    b.stop()
    with pytest.raises(ServiceStopped):
        b.submit(["late"], 10, "cosine")


def test_stop_answers_what_is_queued() -> None:
    svc = _service(delay_s=0.05)
    b = QueryBatcher(svc, window_s=0.0, max_queries=1)
    futures = [b.submit([f"t{i}"], 10, "cosine") for i in range(5)]
    b.stop()
    assert [f.result(timeout=1)[0][0].text for f in futures] == [f"t{i}" for i in range(5)]


def test_app_limits_surrogates_and_timeout() -> None:
    svc = _service(max_body_bytes=2000, max_query_chars=50, request_timeout_s=0.3, max_k=20)
    with TestClient(create_app(svc), raise_server_exceptions=False) as client:
        ok = client.post("/search", json={"queries": ["abc", "de"], "k": 3})
        assert ok.status_code == 200, ok.text
        assert [r["hits"][0]["passage_id"] for r in ok.json()["results"]] == [3, 2]
        # a lone surrogate (JSON-escaped): 422 naming it, and the echoing error renders
        lone = client.post(
            "/search",
            content=b'{"query": "\\ud83d penguins"}',
            headers={"content-type": "application/json"},
        )
        assert lone.status_code == 422, lone.text
        assert "valid string, unable to parse raw data as a unicode string" in lone.text
        assert "\\ud83d" in lone.text  # echoed escaped: the body is ASCII JSON
        pair = client.post("/search", json={"query": "\U0001f427 penguins"})
        assert pair.status_code == 200  # a real emoji (a surrogate pair in JSON) is fine
        many = client.post(
            "/search",
            content=b'{"queries": ["ok", "\\udc00"]}',
            headers={"content-type": "application/json"},
        )
        assert many.status_code == 422
        assert "'queries'[1] holds a lone UTF-16 surrogate U+DC00 at character 0" in many.text
        # body size: header check and counted bytes
        big = client.post("/search", content=json.dumps({"query": "a" * 3000}))
        assert big.status_code == 413
        assert "exceeds the limit of 2,000 bytes (max_body_bytes" in big.json()["detail"]
        chunked = client.post(
            "/search",
            content=iter([b'{"query": "', b"a" * 1500, b"a" * 1500, b'"}']),
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 413
        long = client.post("/search", json={"query": "a" * 51})
        assert long.status_code == 422
        assert long.json()["detail"] == (
            "query 0 has 51 characters; the limit is 50 (max_query_chars, --max-query-chars)"
        )
        assert client.post("/search", json={"query": "a", "k": 21}).status_code == 422
        for bad_k in (b"NaN", b"1e309", b"true", b'"5"', b"2.5"):  # 422, never 500 or a cast
            res = client.post(
                "/search",
                content=b'{"query": "a", "k": ' + bad_k + b"}",
                headers={"content-type": "application/json"},
            )
            assert res.status_code == 422, (bad_k, res.text)
        svc.delay_s = 1.0
        slow = client.post("/search", json={"query": "slow"})
        assert slow.status_code == 504
        assert "not answered within 0.3 s (request_timeout_s" in slow.json()["detail"]
        svc.delay_s = 0.0
        wait = time.monotonic() + 30
        while svc.busy and time.monotonic() < wait:  # the slow search still runs in the worker
            time.sleep(0.01)
        boom = client.post("/search", json={"query": "boom"})
        assert boom.status_code == 500 and "engine failed" in boom.json()["detail"]
        info = client.get("/info").json()
        assert info["batching"]["calls"] >= 3


def test_requests_after_shutdown_get_503() -> None:
    svc = _service()
    app = create_app(svc)
    with TestClient(app) as client:
        assert client.post("/search", json={"query": "x"}).status_code == 200
        app.state.batcher.stop()
        res = client.post("/search", json={"query": "x"})
        assert res.status_code == 503 and "shutting down" in res.json()["detail"]


def test_concurrent_http_requests_are_batched() -> None:
    svc = _service(delay_s=0.05, batch_window_s=0.01)
    with TestClient(create_app(svc)) as client:

        def ask(i: int) -> tuple[int, int]:
            r = client.post("/search", json={"query": "q" * (i + 1)})
            return r.status_code, r.json()["results"][0]["hits"][0]["passage_id"]

        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(ask, range(64)))
    assert answers == [(200, i + 1) for i in range(64)]
    assert len(svc.calls) < 64  # some requests shared a call
    assert sum(n for _, _, n in svc.calls) == 64


def test_port_in_use_is_refused_before_anything() -> None:
    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        with pytest.raises(PortInUseError, match=f"http://127.0.0.1:{port} is already in use"):
            bind_socket("127.0.0.1", port)
    finally:
        first.close()
    assert threading.active_count() >= 1


def test_an_address_not_of_this_machine_points_at_host() -> None:
    want = r"10\.99\.99\.99:0 cannot be bound \(.*\); choose another --host"
    with pytest.raises(PortInUseError, match=want) as e:
        bind_socket("10.99.99.99", 0)
    assert "--port" not in str(e.value)


@pytest.mark.parametrize("port", [-1, 65536, 99999])
def test_port_out_of_range_is_a_clear_error(port: int) -> None:
    with pytest.raises(ValueError, match=rf"--port {port} is not a TCP port \(0-65535\)"):
        bind_socket("127.0.0.1", port)


def _shutdown_during_a_search(delay_s: float, graceful_s: float):  # type: ignore[no-untyped-def]
    """Start the server `treerank serve` runs (:func:`make_server`) on a free port, send one
    search whose engine call takes ``delay_s``, and once it runs do what SIGTERM / Ctrl-C does
    (uvicorn's handler sets ``should_exit``). Returns ``(response, seconds from the signal to
    the response, app)`` after the server has stopped."""
    import httpx

    svc = _service(delay_s=delay_s)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    app = create_app(svc)
    server = make_server(app, graceful_s=graceful_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(
            httpx.post, f"http://127.0.0.1:{port}/search", json={"query": "slow"}, timeout=30
        )
        wait = time.monotonic() + 30
        while not svc.calls and time.monotonic() < wait:  # until the search has started
            time.sleep(0.01)
        assert svc.calls
        t0 = time.monotonic()
        server.should_exit = True
        res = pending.result(timeout=30)
        waited = time.monotonic() - t0
    thread.join(timeout=30)
    assert not thread.is_alive()
    sock.close()
    return res, waited, app


def test_graceful_shutdown_answers_the_request_in_flight() -> None:
    res, _, app = _shutdown_during_a_search(delay_s=1.0, graceful_s=10)
    assert res.status_code == 200 and res.json()["results"][0]["hits"][0]["passage_id"] == 4
    with pytest.raises(ServiceStopped):  # the lifespan stopped the batcher
        app.state.batcher.submit(["late"], 10, "cosine")


def test_a_search_still_running_after_the_graceful_window_gets_503() -> None:
    # issue 36: uvicorn cancels what still runs when the window ends; that was a 500
    res, waited, _ = _shutdown_during_a_search(delay_s=3.0, graceful_s=1)
    assert res.status_code == 503, res.text
    assert res.json() == {
        "detail": "the server shut down before the search was answered (the graceful "
        "shutdown window ended); retry"
    }
    assert 0.9 < waited < 2.9  # answered at the end of the window, not after the search
