"""Regenerate the README's result tables from an experiment report (never type them by hand).

    python scripts/readme_results.py --report runs/sample/report.json   # after bash scripts/sample.sh
    python scripts/readme_results.py                                    # re-render from the JSON
    python scripts/readme_results.py --check                            # exit 1 if README is stale

With ``--report`` the dataset's numbers are first copied into ``docs/results/sample.json``
(committed: the README's only source); the README block between the markers of
:mod:`treerank.pipeline.published` is then rewritten from that file. ``tests/pipeline/
test_published.py`` runs the ``--check`` comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from treerank.pipeline.published import extract, read_block, render, replace_block  # noqa: E402

RESULTS = REPO / "docs" / "results" / "sample.json"
README = REPO / "README.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, help="report.json of a finished `treerank run`")
    ap.add_argument("--dataset", default="scifact", help="dataset of the report to publish")
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when stale")
    args = ap.parse_args(argv)
    if args.report is not None:
        doc = extract(json.loads(args.report.read_text(encoding="utf-8")), args.dataset)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {RESULTS.relative_to(REPO)} from {args.report}")
    block = render(json.loads(RESULTS.read_text(encoding="utf-8")))
    text = README.read_text(encoding="utf-8")
    if args.check:
        if read_block(text) != block:
            print(f"{README.name} is stale: run python scripts/readme_results.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(replace_block(text, block), encoding="utf-8")
    print(f"rewrote the generated block of {README.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
