"""The HTTP JSON API (FastAPI), served by uvicorn.

=======================  ==================================================================
``POST /search``         ``{"query": "text"}`` or ``{"queries": ["a", "b"]}``, optional ``"k"``
                         (default 10, ``1..max_k``) and ``"system"`` (one of the served specs);
                         -> ``{"system", "k", "results": [{"query", "hits": [{"rank",
                         "passage_id", "source_id", "score", "text"}]}], "took_ms"}``
``GET /health``          ``{"status": "ok"}``
``GET /info``            encoder name + fingerprint, store path + vectors digest + counts, served
                         systems, index kind + parameters, limits, batching,
                         requests served
=======================  ==================================================================

Bad requests get a 4xx JSON ``{"detail": ...}`` naming the problem: 422 for a body that does not
fit the schema (unknown fields, an empty or blank text, an empty or blank ``system``, a text
with a lone UTF-16 surrogate such as ``"\\ud83d"``, a query longer than ``max_query_chars``,
more than ``max_batch`` queries, ``k`` above ``max_k``), 413 for a body above
``max_body_bytes`` (checked on the header and on the bytes received), 400 for an unknown system.
Every response is ASCII-escaped JSON, so a message that echoes any input renders. A search not
answered within ``request_timeout_s`` is a 504; one that fails inside is a 500 with a one-line
message, never a traceback; a request that arrives during shutdown, or is still running when
the graceful shutdown window ends, is a 503.

Concurrent requests are answered in batches by one worker
(:class:`~treerank.serve.batching.QueryBatcher`, started and stopped with the app's lifespan);
the handlers only validate and wait, so the event loop is never blocked by a search.
"""

import asyncio
import errno
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Self

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from treerank.serve.batching import QueryBatcher, ServiceStopped
from treerank.serve.service import SearchService

log = logging.getLogger("treerank.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped (``\\uXXXX``): a lone surrogate echoed from
    the input cannot be encoded as UTF-8, but it can always be written escaped."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode("ascii")


def _check_text(text: str, what: str) -> None:
    for i, ch in enumerate(text):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise ValueError(
                f"{what} holds a lone UTF-16 surrogate U+{ord(ch):04X} at character {i}; "
                "send valid Unicode (a surrogate pair is one character, escaped as two halves)"
            )


class SearchRequest(BaseModel):
    """The body of ``POST /search`` (unknown fields are refused)."""

    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, min_length=1, description="One query text.")
    queries: list[str] | None = Field(None, min_length=1, description="A batch of query texts.")
    k: int = Field(
        10, ge=1, strict=True, description="Hits per query (at most the server's max_k)."
    )
    system: str | None = Field(None, description="A served system spec (see /info).")

    @field_validator("query")
    @classmethod
    def valid_query(cls, v: str | None) -> str | None:
        if v is not None:
            _check_text(v, "'query'")
        return v

    @field_validator("queries")
    @classmethod
    def valid_queries(cls, v: list[str] | None) -> list[str] | None:
        for i, t in enumerate(v or []):
            _check_text(t, f"'queries'[{i}]")
        return v

    @field_validator("system")
    @classmethod
    def valid_system(cls, v: str | None) -> str | None:
        if v is not None:
            _check_text(v, "'system'")
            if not v.strip():
                raise ValueError(
                    "'system' is empty; name a served system (see /info) or leave the field "
                    "out for the default"
                )
        return v

    @model_validator(mode="after")
    def one_of(self) -> Self:
        if (self.query is None) == (self.queries is None):
            raise ValueError("give exactly one of 'query' (a string) or 'queries' (a list)")
        if self.queries is not None and any(not q.strip() for q in self.queries):
            raise ValueError("'queries' holds an empty text")
        if self.query is not None and not self.query.strip():
            raise ValueError("'query' is empty")
        return self


class BodyLimit:
    """ASGI middleware: a request body above ``limit`` bytes gets 413 before any parsing.

    Checks ``Content-Length`` first, then counts the bytes actually received (a chunked or lying
    client), reading at most ``limit + 1`` bytes of it.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = int(limit)

    async def _refuse(self, send: Send) -> None:
        body = AsciiJSONResponse(
            status_code=413,
            content={
                "detail": f"request body exceeds the limit of {self.limit:,} bytes "
                "(max_body_bytes, --max-body-bytes)"
            },
        )
        await send({"type": "http.response.start", "status": 413, "headers": body.raw_headers})
        await send({"type": "http.response.body", "body": body.body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(service: SearchService, batcher: QueryBatcher | None = None) -> FastAPI:
    """The FastAPI application answering from ``service`` through ``batcher`` (default: a
    :class:`QueryBatcher` with the service config's window and size), which the app's lifespan
    starts and, on shutdown, stops after answering what is queued."""
    cfg = service.config
    timeout = cfg.request_timeout_s
    batcher = batcher or QueryBatcher(service, cfg.batch_window_s, cfg.batch_queries)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.stop)

    app = FastAPI(
        title="treerank search",
        version="1",
        lifespan=lifespan,
        default_response_class=AsciiJSONResponse,
    )
    app.state.batcher = batcher
    app.state.shutting_down = False  # set by the server when its shutdown begins (make_server)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> AsciiJSONResponse:
        return AsciiJSONResponse(status_code=422, content={"detail": _validation_detail(exc)})

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> AsciiJSONResponse:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return AsciiJSONResponse(
            status_code=500, content={"detail": f"internal error: {type(exc).__name__}: {exc}"}
        )

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    def info() -> dict[str, Any]:
        doc = service.info()
        s = batcher.stats
        doc["batching"] = {
            **doc.get("batching", {}),
            "rounds": s.rounds,
            "calls": s.calls,
            "texts": s.texts,
            "largest_call": s.largest_call,
        }
        return doc

    @app.post("/search")
    async def search(req: SearchRequest) -> dict[str, Any]:
        texts, system = _checked_request(req, service)
        t0 = time.perf_counter()
        try:
            future = batcher.submit(texts, req.k, system)
            hits = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except ServiceStopped as exc:
            raise HTTPException(503, detail=str(exc)) from None
        except asyncio.CancelledError:
            if not app.state.shutting_down:  # not ours to answer (e.g. the client went away)
                raise
            # uvicorn cancels what still runs when the graceful window ends: answer 503, not 500
            future.cancel()  # the worker skips it if it has not started
            raise HTTPException(
                503,
                detail="the server shut down before the search was answered (the graceful "
                "shutdown window ended); retry",
            ) from None
        except TimeoutError:
            raise HTTPException(
                504,
                detail=f"the search was not answered within {timeout:g} s "
                "(request_timeout_s, --timeout)",
            ) from None
        service.stats.requests += 1
        service.stats.queries += len(texts)
        return {
            "system": system,
            "k": req.k,
            "results": [
                {"query": t, "hits": [h.to_dict() for h in hs]}
                for t, hs in zip(texts, hits, strict=True)
            ],
            "took_ms": (time.perf_counter() - t0) * 1000,
        }

    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes)
    return app


def _validation_detail(exc: RequestValidationError) -> list[Any]:
    """A 422's ``detail``: pydantic's errors, or, when an input they echo does not serialise
    as strict ASCII JSON (NaN, 1e309, ...), the errors without their echoes."""
    try:
        detail = jsonable_encoder(exc.errors())
        json.dumps(detail, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError):
        detail = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
    return list(detail)


def _checked_request(req: SearchRequest, service: SearchService) -> tuple[list[str], str]:
    """``(query texts, system name)`` of a search request within the service's limits.

    Raises:
        HTTPException: 422 for ``k`` above ``max_k``, more than ``max_batch`` queries or a
            query longer than ``max_query_chars``; 400 for a system the service does not serve.
    """
    cfg = service.config
    max_k, max_batch, max_chars = cfg.max_k, cfg.max_batch, cfg.max_query_chars
    if req.k > max_k:
        raise HTTPException(422, detail=f"k must be less than or equal to {max_k} (max_k)")
    texts = [req.query] if req.query is not None else list(req.queries or [])
    if len(texts) > max_batch:
        raise HTTPException(
            422, detail=f"at most {max_batch} queries per request (max_batch, --max-batch)"
        )
    for i, t in enumerate(texts):
        if len(t) > max_chars:
            raise HTTPException(
                422,
                detail=f"query {i} has {len(t):,} characters; the limit is {max_chars:,} "
                "(max_query_chars, --max-query-chars)",
            )
    system = service.default_system if req.system is None else req.system
    if system not in service.systems:
        raise HTTPException(
            status_code=400,
            detail=f"system {system!r} is not served; served: {', '.join(service.systems)}",
        )
    return texts, system


class PortInUseError(OSError):
    """The address to serve on cannot be bound (another process holds the port)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, bound before anything is loaded or printed.

    Raises:
        ValueError: ``port`` is outside 0-65535.
        PortInUseError: the port is taken (``EADDRINUSE``) or the address cannot be bound; the
            message names the address and what to do.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} is not a TCP port (0-65535)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            what = "is already in use; stop the other server or choose another --port"
        elif exc.errno == errno.EACCES:
            what = f"cannot be bound ({exc.strerror}); choose a --port above 1023"
        else:
            what = (
                f"cannot be bound ({exc.strerror}); choose another --host "
                "(an address of this machine, e.g. 127.0.0.1 or 0.0.0.0)"
            )
        raise PortInUseError(f"http://{host}:{port} {what}") from None
    sock.set_inheritable(True)
    return sock


def make_server(app: FastAPI, graceful_s: float = 10.0) -> Any:
    """The ``uvicorn.Server`` that :func:`serve` runs, for ``app`` (:func:`create_app`).

    When its shutdown begins it sets ``app.state.shutting_down``; a search still running when
    the ``graceful_s`` window ends is then cancelled by uvicorn and answered 503 (documented in
    ``docs/serving.md``), not 500. A captured SIGINT / SIGTERM is not re-raised after a clean
    shutdown (exit 0).
    """
    import uvicorn

    class _CleanExitServer(uvicorn.Server):
        """uvicorn >= 0.29 re-raises a captured SIGINT / SIGTERM after its graceful shutdown, so
        the process would die of the signal (exit 130 / 143) although it shut down cleanly;
        ``treerank serve`` documents exit 0 then (docs/exit-codes.md, tests/test_readme.py)."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.state.shutting_down = True
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app, log_level="info", timeout_graceful_shutdown=max(1, round(graceful_s))
    )
    return _CleanExitServer(config)


def serve(
    service: SearchService,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    sock: socket.socket | None = None,
    graceful_s: float = 10.0,
) -> None:
    """Run the app with uvicorn until SIGINT / SIGTERM.

    On a signal uvicorn stops accepting connections, lets in-flight requests finish for up to
    ``graceful_s`` seconds (a search still running then is answered 503), then the lifespan
    stops the batcher (queued work is answered first).

    Args:
        sock: an already bound socket (:func:`bind_socket`); default: bound here.
    """
    sock = sock or bind_socket(host, port)
    make_server(create_app(service), graceful_s).run(sockets=[sock])
