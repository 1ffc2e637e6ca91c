"""Shared loader of the real TREC DL19 material (qrels, topics, six public first-stage runs)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

DL19 = SHARED_DATA / "msmarco-trec-dl19"
RUN_NAMES = (
    "BM25",
    "BM25_RM3",
    "D_BERT_KD_TASB",
    "OPEN_AI_ADA2",
    "REP_LLAMA",
    "SPLADE_P_P_ENSEMBLE_DISTIL",
)


def require_dl19() -> Path:
    if not (DL19 / "qrels.dl19-passage.txt").is_file():
        pytest.skip(f"{DL19} not available")
    return DL19


@cache
def load_runs() -> dict[str, dict[str, list[tuple[str, float]]]]:
    """run name -> {qid: [(docid, score), ...]} in the published rank order."""
    out = {}
    for name in RUN_NAMES:
        doc = json.loads(
            (DL19 / "retrieve_results" / name / "retrieve_results_dl19.json").read_text()
        )
        run: dict[str, list[tuple[str, float]]] = {}
        for entry in doc:
            hits = sorted(entry["hits"], key=lambda h: h["rank"])
            if hits:
                run[str(hits[0]["qid"])] = [(str(h["docid"]), float(h["score"])) for h in hits]
        out[name] = run
    return out


def topic_ids() -> list[str]:
    return [
        line.split("\t")[0]
        for line in (DL19 / "topics.dl19-passage.txt").read_text().splitlines()
        if line.strip()
    ]
