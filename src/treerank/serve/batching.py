"""Micro-batching: concurrent requests answered by one encoder + search call per batch.

HTTP handlers :meth:`QueryBatcher.submit` their texts and await the returned future; one worker
thread owns the service's systems (their per-store caches are not thread-safe) and, each round,

1. waits for the first queued item, then collects more for at most ``window_s`` seconds (or
   until ``max_queries`` texts are waiting),
2. groups the collected items by ``(system, k)`` (``k`` changes some indexes' search, e.g.
   HNSW's ``ef_search`` is raised to ``k``, so only equal ``k`` share a call),
3. answers each group with one :meth:`~treerank.serve.service.SearchService.search` call
   and hands each item its rows. That call encodes and searches each text alone, so an answer
   never depends on which requests shared the round (batch invariance, see
   :mod:`treerank.serve.service`); the round saves the per-request hand-offs and the lock.

A request with more than ``max_queries`` texts is split into chunks of at most that many; each
chunk is queued only when the previous one is answered, so a small request that arrives
meanwhile is answered next instead of after the whole large request (it waits at most one
chunk's search). A cancelled item (its
request timed out) is skipped if it has not started.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from treerank.search.query import Hit

__all__ = ["QueryBatcher", "ServiceStopped"]


class ServiceStopped(RuntimeError):
    """The batcher was stopped (server shutdown) before the request was answered."""


@dataclass
class _Item:
    texts: list[str]
    k: int
    system: str
    future: Future[list[list[Hit]]] = field(default_factory=Future)


@dataclass
class BatchStats:
    """Counters of the worker: rounds run, engine calls, texts answered, largest call."""

    rounds: int = 0
    calls: int = 0
    texts: int = 0
    largest_call: int = 0


class QueryBatcher:
    """One worker thread answering queued searches in batches (see module docstring).

    Args:
        service: a :class:`~treerank.serve.service.SearchService` (its :meth:`search` is called
            from the worker thread only).
        window_s: how long a round waits for more items after the first (seconds; 0: no wait,
            just what is already queued).
        max_queries: most texts per engine call; larger requests are split into chunks.
    """

    def __init__(self, service: Any, window_s: float = 0.002, max_queries: int = 64) -> None:
        if window_s < 0 or max_queries < 1:
            raise ValueError(
                f"window_s >= 0 and max_queries >= 1 required, got {window_s}, {max_queries}"
            )
        self.service = service
        self.window_s = float(window_s)
        self.max_queries = int(max_queries)
        self.stats = BatchStats()
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="treerank-batcher", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Answer what is queued, then stop the worker; later submits raise
        :class:`ServiceStopped`."""
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        while True:  # anything left (the join timed out): fail it rather than hang a client
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None and item.future.set_running_or_notify_cancel():
                item.future.set_exception(ServiceStopped("the server is shutting down"))

    def submit(self, texts: list[str], k: int, system: str) -> Future[list[list[Hit]]]:
        """Queue a search; the future resolves to one hit list per text.

        Raises:
            ServiceStopped: the batcher is stopped.
        """
        if self._stop.is_set():
            raise ServiceStopped("the server is shutting down")
        self.start()
        chunks = [
            _Item(texts[i : i + self.max_queries], k, system)
            for i in range(0, len(texts), self.max_queries)
        ]
        if len(chunks) == 1:
            self._queue.put(chunks[0])
            return chunks[0].future
        whole: Future[list[list[Hit]]] = Future()
        whole.set_running_or_notify_cancel()

        def done(i: int, chunk: Future[list[list[Hit]]]) -> None:
            # the next chunk is queued only now, behind whatever arrived meanwhile
            if chunk.cancelled() or chunk.exception() is not None:
                if not whole.done():
                    whole.set_exception(chunk.exception() or ServiceStopped("cancelled"))
                return
            if i + 1 < len(chunks):
                nxt = chunks[i + 1]
                nxt.future.add_done_callback(lambda f: done(i + 1, f))
                self._queue.put(nxt)
                return
            if not whole.done():
                whole.set_result([h for c in chunks for h in c.future.result()])

        chunks[0].future.add_done_callback(lambda f: done(0, f))
        self._queue.put(chunks[0])
        return whole

    def _collect(self, first: _Item) -> list[_Item]:
        items, n = [first], len(first.texts)
        deadline = time.monotonic() + self.window_s
        while n < self.max_queries:
            wait = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # stop sentinel: answer this round, then stop
                self._queue.put(None)
                break
            items.append(item)
            n += len(item.texts)
        return items

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                if self._stop.is_set() and self._queue.empty():
                    return
                continue
            items = [it for it in self._collect(first) if it.future.set_running_or_notify_cancel()]
            self.stats.rounds += 1
            groups: dict[tuple[str, int], list[_Item]] = {}
            for it in items:
                groups.setdefault((it.system, it.k), []).append(it)
            for (system, k), group in groups.items():
                texts = [t for it in group for t in it.texts]
                try:
                    hits = self.service.search(texts, k=k, system=system, count=False)
                except BaseException as exc:  # noqa: BLE001 (each request gets the error)
                    for it in group:
                        it.future.set_exception(exc)
                    continue
                self.stats.calls += 1
                self.stats.texts += len(texts)
                self.stats.largest_call = max(self.stats.largest_call, len(texts))
                start = 0
                for it in group:
                    it.future.set_result(hits[start : start + len(it.texts)])
                    start += len(it.texts)
