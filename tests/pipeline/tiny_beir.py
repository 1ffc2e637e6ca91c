"""A tiny BEIR folder (real text, hand-made judgments) for pipeline tests that must run fast."""

from __future__ import annotations

import json
from pathlib import Path

DOCS = {
    "d1": "cats purr when they are content and calm",
    "d2": "dogs bark loudly at strangers during the night",
    "d3": "fish swim upstream in the cold river to spawn",
    "d4": "stock markets fell sharply today after the report",
    "d5": "birds sing at dawn to mark their territory",
    "d6": "bees make honey from the nectar of flowers",
    "d7": "volcanoes erupt when magma pressure builds up",
    "d8": "glaciers carve valleys over thousands of years",
}
QUERIES = {
    "t1": "why do cats purr",
    "t2": "why do dogs bark at night",
    "t3": "where do fish spawn",
    "t4": "why did stocks fall",
    "t5": "why do birds sing in the morning",
    "t6": "how is honey made",
    "t7": "what makes a volcano erupt",
    "t8": "how do glaciers shape valleys",
    "e1": "purring cats",
    "e2": "barking dogs",
    "e3": "honey bees",
    "e4": "magma and eruptions",
}
TRAIN = [(f"t{i}", f"d{i}") for i in range(1, 9)]
TEST = [("e1", "d1"), ("e2", "d2"), ("e3", "d6"), ("e4", "d7")]


def write_tiny_beir(root: Path) -> Path:
    """BEIR layout with a train split (8 queries) and a test split (4 queries), 8 passages."""
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in DOCS.items())
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in QUERIES.items())
    )
    for split, pairs in (("train", TRAIN), ("test", TEST)):
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in pairs)
        )
    return root
