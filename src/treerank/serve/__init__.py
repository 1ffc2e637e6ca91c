"""treerank.serve: the HTTP JSON search service (FastAPI app + uvicorn runner)."""

from treerank.serve.service import SearchService, ServiceConfig

__all__ = ["SearchService", "ServiceConfig"]
