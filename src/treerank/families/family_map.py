"""``docs/families.md``: each model family's modules on one page, generated from the family table.

A dense family's code spans packages by layer (its model in ``models/``, its training in
``training/``); the forest is one package (``forest/``). ``ModelFamily.modules`` lists them
with their role, and this module renders the map: per family, each module's role, path and
what it holds (the first line of its docstring, read from
the source without importing it). ``tests/models/test_family_map.py`` fails when the page is out
of date or a listed module is missing.

Regenerate: ``python -m treerank.families.family_map`` (writes ``docs/families.md``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from treerank.families import MODULE_ROLES, ModelFamily, all_families

__all__ = ["PACKAGE_DIR", "module_summary", "render_family_map", "write_family_map"]

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""``src/treerank``: the paths of ``ModelFamily.modules`` are relative to it."""


def module_summary(path: str | Path, root: Path = PACKAGE_DIR) -> str:
    """The first line of a module's docstring (read with ``ast``, never imported).

    Raises:
        FileNotFoundError: no such module under ``root``.
        ValueError: the module has no docstring.
    """
    file = root / path
    doc = ast.get_docstring(ast.parse(file.read_text(encoding="utf-8"), str(file)))
    if not doc:
        raise ValueError(f"{file}: no module docstring to describe it in the family map")
    return doc.strip().splitlines()[0].strip().replace("``", "`")  # reST literals -> markdown


def _role_order(role: str) -> int:
    return MODULE_ROLES.index(role.split(" + ")[0])


def render_family_map(
    families: dict[str, ModelFamily] | None = None, root: Path = PACKAGE_DIR
) -> str:
    """The markdown of ``docs/families.md`` for ``families`` (default: every registered one).

    Raises:
        ValueError: a role outside :data:`~treerank.families.MODULE_ROLES`, or a module
            without a docstring.
        FileNotFoundError: a listed module does not exist.
    """
    fams = all_families() if families is None else families
    out = [
        "# Where each model family lives\n",
        "Generated from `ModelFamily.modules` in `src/treerank/families/__init__.py` by "
        "`python -m treerank.families.family_map`; `tests/models/test_family_map.py` fails when "
        "this page is out of date. Paths are under `src/treerank/`; a family's modules sit in "
        'the package of their layer (docs/DESIGN.md, "Layers"), and this page puts them '
        "together. Roles, in reading order: " + ", ".join(MODULE_ROLES) + ".\n",
    ]
    for fam in fams.values():
        if not fam.modules:
            continue
        for role, _ in fam.modules:
            bad = [r for r in role.split(" + ") if r not in MODULE_ROLES]
            if bad:
                raise ValueError(f"family {fam.name!r}: unknown module role(s) {bad}")
        out.append(f"## `{fam.name}`\n")
        out.append(f"{fam.description}.\n" if fam.description else "")
        out.append("| role | module | what it holds |\n|---|---|---|")
        for role, path in sorted(fam.modules, key=lambda m: _role_order(m[0])):
            summary = module_summary(path, root).replace("|", "\\|")
            out.append(f"| {role} | `{path}` | {summary} |")
        out.append("")
    return "\n".join(x for x in out if x is not None).rstrip() + "\n"


def write_family_map(path: str | Path) -> Path:
    """Write :func:`render_family_map` to ``path`` atomically; returns ``path``."""
    from treerank.atomic import atomic_write_text

    atomic_write_text(Path(path), render_family_map())
    return Path(path)


if __name__ == "__main__":  # python -m treerank.families.family_map [PATH]
    target = sys.argv[1] if len(sys.argv) > 1 else PACKAGE_DIR.parents[1] / "docs" / "families.md"
    print(write_family_map(target))
