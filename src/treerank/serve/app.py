"""The HTTP JSON API (FastAPI), served by uvicorn.

=======================  ==================================================================
``POST /search``         ``{"query": "text"}`` or ``{"queries": ["a", "b"]}``, optional ``"k"``
                         (default 10, ``1..max_k``) and ``"system"`` (one of the served specs);
                         -> ``{"system", "k", "results": [{"query", "hits": [{"rank",
                         "passage_id", "source_id", "score", "text"}]}], "took_ms"}``
``GET /health``          ``{"status": "ok"}``
``GET /info``            encoder name + fingerprint, store path + signature + counts, served
                         systems, index kind + parameters, limits, requests served
=======================  ==================================================================

Bad requests get a 4xx JSON ``{"detail": ...}`` naming the problem (422: a body that does not
fit the schema, unknown fields included; 400: an unknown system); an unexpected failure inside a
search is a 500 with a one-line message, never a traceback.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from treerank.serve.service import SearchService

log = logging.getLogger("treerank.serve")


def create_app(service: SearchService) -> Any:
    """The FastAPI application answering from ``service``."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, model_validator

    max_k, max_batch = service.config.max_k, service.config.max_batch

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        query: str | None = Field(None, min_length=1, description="One query text.")
        queries: list[str] | None = Field(
            None, min_length=1, max_length=max_batch, description="A batch of query texts."
        )
        k: int = Field(10, ge=1, le=max_k, description="Hits per query.")
        system: str | None = Field(None, description="A served system spec (see /info).")

        @model_validator(mode="after")
        def one_of(self) -> SearchRequest:
            if (self.query is None) == (self.queries is None):
                raise ValueError("give exactly one of 'query' (a string) or 'queries' (a list)")
            if self.queries is not None and any(not q.strip() for q in self.queries):
                raise ValueError("'queries' holds an empty text")
            if self.query is not None and not self.query.strip():
                raise ValueError("'query' is empty")
            return self

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
        system = req.system or service.default_system
        if system not in service.systems:
            raise HTTPException(
                status_code=400,
                detail=f"system {system!r} is not served; served: {', '.join(service.systems)}",
            )
        texts = [req.query] if req.query is not None else list(req.queries or [])
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
