"""Splice generated result tables into ``docs/forest.md``.

Every block between ``<!-- begin generated: PATH -->`` and ``<!-- end generated -->`` is replaced
by the contents of ``PATH`` (relative to the repository root; a ``table.md`` written by
``bench/bench_forest_twins.py`` or ``bench/bench_forest_rescore.py``), so no measured number in
the document is typed by hand. Run: ``python bench/forest_docs.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- begin generated: (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def splice(text: str, root: Path) -> str:
    """``text`` with every generated block refreshed from its file."""

    def fill(m: re.Match[str]) -> str:
        body = (root / m.group(2)).read_text()
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)

    return BLOCK.sub(fill, text)


MEMORY_JSON = REPO / "bench" / "results" / "forest_memory.json"
MEMORY_TABLE = REPO / "bench" / "results" / "forest_memory.md"


def memory_table(result: dict) -> str:
    """The Scale section's table of one block-wise forest pair at C = 1,000
    (``bench/results/forest_memory.json``, written by ``bench/bench_forest_scale.py``)."""
    rows = [
        ("training queries x dim", f"{result['train_queries']:,} x {result['dim']}"),
        ("passages in the store", f"{result['passages']:,}"),
        ("passage rows of the pair (shared + random pool)", f"{result['passage_rows']:,}"),
        (
            "examples (selected / non-selected per query)",
            f"{result['positive_examples']:,} / {result['random_negatives']} random "
            f"+ {result['judged_negatives']} judged",
        ),
        (
            "classes C / pairs / steps per stage",
            f"{result['classes']} / {result['pairs']} / {result['steps_per_stage']}",
        ),
        ("chunk_size / threads", f"{result['chunk_size']:,} / {result['threads']}"),
        ("store build (s)", f"{result['store_build_seconds']:.0f}"),
        ("seconds for the pair (wall)", ", ".join(f"{s:.0f}" for s in result["seconds_per_pair"])),
        ("peak RSS after building the store (GiB)", f"{result['peak_rss_gib_after_store']:.2f}"),
        ("**peak RSS of the whole run (GiB)**", f"**{result['peak_rss_gib']:.2f}**"),
        (
            "logits + gradients the trainer held whole before (GiB, from the shapes)",
            f"{result['whole_logits_and_gradients_gib']:.2f}",
        ),
    ]
    lines = ["| quantity | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    if MEMORY_JSON.is_file():
        MEMORY_TABLE.write_text(memory_table(json.loads(MEMORY_JSON.read_text())))
    doc = REPO / "docs" / "forest.md"
    doc.write_text(splice(doc.read_text(), REPO))


if __name__ == "__main__":
    main()
