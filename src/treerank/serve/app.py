"""The HTTP JSON API (FastAPI), served by uvicorn.

=======================  ==================================================================
``POST /search``         ``{"query": "text"}`` or ``{"queries": ["a", "b"]}``, optional ``"k"``
                         (default 10, ``1..max_k``) and ``"system"`` (one of the served specs);
                         -> ``{"system", "k", "results": [{"query", "hits": [{"rank",
                         "passage_id", "source_id", "score", "text"}]}], "took_ms"}``
``GET /health``          ``{"status": "ok"}``
``GET /info``            encoder name + fingerprint, store path + vectors digest + counts, served
                         systems, index kind + parameters, limits, requests served
=======================  ==================================================================

Bad requests get a 4xx JSON ``{"detail": ...}`` naming the problem (422: a body that does not
fit the schema, unknown fields included; 400: an unknown system); an unexpected failure inside a
search is a 500 with a one-line message, never a traceback.
"""

import logging
import time
from typing import Any, Self

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from treerank.serve.service import SearchService

log = logging.getLogger("treerank.serve")


class SearchRequest(BaseModel):
    """The body of ``POST /search`` (unknown fields are refused)."""

    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, min_length=1, description="One query text.")
    queries: list[str] | None = Field(None, min_length=1, description="A batch of query texts.")
    k: int = Field(10, ge=1, description="Hits per query (at most the server's max_k).")
    system: str | None = Field(None, description="A served system spec (see /info).")

    @model_validator(mode="after")
    def one_of(self) -> Self:
        if (self.query is None) == (self.queries is None):
            raise ValueError("give exactly one of 'query' (a string) or 'queries' (a list)")
        if self.queries is not None and any(not q.strip() for q in self.queries):
            raise ValueError("'queries' holds an empty text")
        if self.query is not None and not self.query.strip():
            raise ValueError("'query' is empty")
        return self


def create_app(service: SearchService) -> FastAPI:
    """The FastAPI application answering from ``service``."""
    max_k, max_batch = service.config.max_k, service.config.max_batch
    app = FastAPI(title="treerank search", version="1")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return JSONResponse(
            status_code=500, content={"detail": f"internal error: {type(exc).__name__}: {exc}"}
        )

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    def info() -> dict[str, Any]:
        return service.info()

    @app.post("/search")
    def search(req: SearchRequest) -> dict[str, Any]:
        if req.k > max_k:
            raise HTTPException(422, detail=f"k must be less than or equal to {max_k}")
        texts = [req.query] if req.query is not None else list(req.queries or [])
        if len(texts) > max_batch:
            raise HTTPException(422, detail=f"at most {max_batch} queries per request")
        system = req.system or service.default_system
        if system not in service.systems:
            raise HTTPException(
                status_code=400,
                detail=f"system {system!r} is not served; served: {', '.join(service.systems)}",
            )
        t0 = time.perf_counter()
        hits = service.search(texts, k=req.k, system=system)
        return {
            "system": system,
            "k": req.k,
            "results": [
                {"query": t, "hits": [h.to_dict() for h in hs]}
                for t, hs in zip(texts, hits, strict=True)
            ],
            "took_ms": (time.perf_counter() - t0) * 1000,
        }

    return app


def serve(service: SearchService, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the app with uvicorn until interrupted (one process; requests queue on the lock)."""
    import uvicorn

    uvicorn.run(create_app(service), host=host, port=port, log_level="info")
