"""Splice generated result tables into ``docs/forest.md``.

Every block between ``<!-- begin generated: PATH -->`` and ``<!-- end generated -->`` is replaced
by the contents of ``PATH`` (relative to the repository root; a ``table.md`` written by
``bench/bench_forest_twins.py`` or ``bench/bench_forest_rescore.py``), so no measured number in
the document is typed by hand. Run: ``python bench/forest_docs.py``.
"""

from __future__ import annotations

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


def main() -> None:
    doc = REPO / "docs" / "forest.md"
    doc.write_text(splice(doc.read_text(), REPO))


if __name__ == "__main__":
    main()
