"""Pipeline fixtures: one small real SciFact store shared by the re-run and crash tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _scifact_path, cached_store

SLICE_QUERIES = 60
SLICE_PASSAGES = 400


@pytest.fixture(scope="session")
def scifact_slice(encoder: Any) -> Path:
    """Store root holding ``train/`` and ``test/`` of SciFact cut to 60 queries and 400 passages
    per split (the reader's ``limit`` / ``max_passages``), embedded once with the default
    encoder and cached under ``.cache/test-stores`` (see ``tests/conftest.py``)."""
    from treerank.readers import read_split

    def load() -> list[Any]:
        return [
            read_split(
                _scifact_path(), "scifact", s, limit=SLICE_QUERIES, max_passages=SLICE_PASSAGES
            )
            for s in ("train", "test")
        ]

    stores = cached_store("scifact-slice", load, encoder)
    return Path(stores["train"].path).parent  # type: ignore[attr-defined]
