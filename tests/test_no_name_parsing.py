"""Names are rendered from typed identities, never parsed back (issue 21; ``docs/DESIGN.md``).

System and stage names (``linear@seed0@scifact``, ``train:scifact:linear@seed0``) are made by
:mod:`treerank.pipeline.identity`; ``@`` means a seed, a transfer dataset and a metric cutoff
alike, so splitting a name to recover its parts silently mixes them up. This test reads every
module under ``src/treerank`` and ``scripts/`` (except the identity module) and fails on:

* ``<expr>.split / rsplit / partition / rpartition("@" or ":")`` where ``<expr>`` mentions a
  name-like identifier (``name``, ``system``, ``stage``, ``run``, ``model``: the receivers that
  hold system or stage names); spec parsing (``spec.partition(":")`` in ``search/systems.py``,
  ``ref.partition(":")`` in the family table) is not about names and is not flagged;
* any split on the seed separator (``SEED_SEPARATOR``, ``"@seed"``);
* prefix / suffix tests of a name-like receiver (``name``, ``stage``) against a string holding
  ``@`` or ``:`` (``r.name.startswith(
  f"embed:{ds}:")``), the other way to parse a name (file-name tests such as
  ``p.name.startswith(".")`` are not flagged).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "src" / "treerank", REPO / "scripts")
ALLOWED = {REPO / "src" / "treerank" / "pipeline" / "identity.py"}

_RECEIVER = r"[\w.\[\]()'\"]*(?:name|system|stage|run|model)[\w.\[\]()'\"]*"
PATTERNS = {
    "split of a name on '@' or ':'": re.compile(
        _RECEIVER + r"\.(?:r?split|r?partition)\(\s*['\"][@:]['\"]", re.I
    ),
    "split on the seed separator": re.compile(
        r"\.(?:r?split|r?partition)\(\s*(?:SEED_SEPARATOR|['\"]@seed['\"])"
    ),
    "prefix / suffix test of a name": re.compile(
        r"[\w.\[\]()]*(?:name|stage)[\w.\[\]()]*\.(?:startswith|endswith)\(\s*f?['\"][^'\"]*[@:]",
        re.I,
    ),
}


def _violations(text: str) -> list[str]:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for what, pat in PATTERNS.items():
            if pat.search(code):
                out.append(f"{lineno}: {what}: {line.strip()}")
    return out


def test_patterns_catch_the_old_parsing_and_leave_spec_parsing_alone() -> None:
    bad = [
        "f\"model:{name.split('@')[1]}:{name.split('@')[0]}\"",
        'stats = {r.name.split(":")[-1]: r.summary for r in run.records}',
        "model, _, seed = system_name.rpartition(SEED_SEPARATOR)",
        'if r.name.startswith(f"embed:{ds.name}:"):',
        "base = run_name.partition('@')[0]",
    ]
    good = [
        'kind, _, body = spec.partition(":")',
        'module, _, attr = ref.partition(":")',
        'head, colon, tail = right.rpartition(":")',
        'k, m = metric.split("@")',
        'path = Path(over.partition(":")[2])',
    ]
    for line in bad:
        assert _violations(line), line
    for line in good:
        assert not _violations(line), line


def test_no_module_parses_system_or_stage_names() -> None:
    found = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            if path in ALLOWED:
                continue
            found += [f"{path.relative_to(REPO)}:{v}" for v in _violations(path.read_text())]
    assert not found, "names parsed back (render them from treerank.pipeline.identity):\n" + (
        "\n".join(found)
    )
