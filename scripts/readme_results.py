"""Publish the main job's numbers: copy them from a report, then regenerate the pages.

    python scripts/readme_results.py --report runs/sample/report.json  # after scripts/sample.sh
    python scripts/readme_results.py                                   # re-render from the JSON
    python scripts/readme_results.py --check                           # exit 1 if a page is stale

With ``--report`` the dataset's numbers are first copied into ``docs/results/sample.json``
(committed: the only source of published numbers; :func:`treerank.pipeline.published.extract`);
``scripts/gen_docs.py`` then renders ``docs/results/sample.md`` and the README's headline block
from it. ``tests/test_docs.py`` and ``tests/pipeline/test_published.py`` check both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "scripts"))

import gen_docs  # noqa: E402

from treerank.pipeline.published import extract  # noqa: E402

RESULTS = REPO / "docs" / "results" / "sample.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, help="report.json of a finished `treerank run`")
    ap.add_argument("--dataset", default="scifact", help="dataset of the report to publish")
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when stale")
    args = ap.parse_args(argv)
    if args.check:
        return gen_docs.main(["--check"])
    if args.report is not None:
        doc = extract(json.loads(args.report.read_text(encoding="utf-8")), args.dataset)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {RESULTS.relative_to(REPO)} from {args.report}")
    return gen_docs.main([])


if __name__ == "__main__":
    sys.exit(main())
