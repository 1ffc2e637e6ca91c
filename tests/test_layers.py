"""The layering of docs/DESIGN.md, checked on the source: a module never imports a higher layer.

Every ``import`` / ``from ... import`` in ``src/treerank`` (function-level imports included) is
parsed; the importing module's layer must be at or above the imported module's layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "treerank"

LAYERS = [
    (
        "base",
        {
            "treerank",
            "treerank.atomic",
            "treerank.config",
            "treerank.faults",
            "treerank.lock",
            "treerank.names",
        },
    ),
    ("distributed", {"treerank.distributed"}),  # process group, gather, DDP training step
    ("kernels", {"treerank.kernels", "treerank.distributed.search"}),
    ("readers", {"treerank.readers"}),
    ("encoders", {"treerank.encoders"}),
    ("store", {"treerank.store", "treerank.distributed.embed"}),
    ("models", {"treerank.models"}),
    ("training", {"treerank.training"}),
    ("search", {"treerank.search"}),
    ("evaluation", {"treerank.evaluation"}),
    ("diagnostics", {"treerank.diagnostics"}),
    ("pipeline", {"treerank.pipeline"}),
    ("cli", {"treerank.cli", "treerank.serve"}),
]
"""Bottom to top; a package's layer covers its submodules. Keep in step with docs/DESIGN.md."""


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of a ``treerank`` module (the longest matching prefix)."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module == p or (p != "treerank" and module.startswith(p + "."))
            if inside and len(p) > best_len:
                best, best_len = i, len(p)
    if best < 0:
        raise KeyError(f"{module}: in no layer of tests/test_layers.py LAYERS")
    return best


def module_name(path: Path, root: Path = SRC) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, root: Path = SRC) -> list[tuple[int, str]]:
    """``(line, module)`` of every treerank import in a file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
    return [(ln, m) for ln, m in out if m == "treerank" or m.startswith("treerank.")]


def violations(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        mine = layer_of(me)
        for line, mod in imports_of(path, root):
            if layer_of(mod) > mine:
                found.append(
                    f"{path.relative_to(root.parent)}:{line}: {me} ({LAYERS[mine][0]}) imports "
                    f"{mod} ({LAYERS[layer_of(mod)][0]})"
                )
    return found


def test_no_module_imports_a_higher_layer() -> None:
    assert violations() == []


def test_every_module_has_a_layer() -> None:
    for path in SRC.rglob("*.py"):
        layer_of(module_name(path))


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "treerank" / "models"
    pkg.mkdir(parents=True)
    (tmp_path / "treerank" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("def f():\n    from treerank.search.systems import build_system\n")
    (pkg / "ok.py").write_text("from treerank.kernels.topk import exact_search\n")
    got = violations(tmp_path / "treerank")
    assert got == [
        "treerank/models/bad.py:2: treerank.models.bad (models) imports "
        "treerank.search.systems (search)"
    ]
    with pytest.raises(KeyError, match="in no layer"):
        layer_of("treerank.nowhere")
