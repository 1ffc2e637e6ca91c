"""The layering of docs/DESIGN.md, checked on the source: a module never imports a higher layer.

Every ``import`` / ``from ... import`` in ``src/treerank`` (function-level imports included) is
parsed; the importing module's layer must be at or above the imported module's layer. A layer is
one folder (package) of ``src/treerank``; the base layer is the top-level modules. No module
imports another by name (``importlib.import_module``): only the root package's lazy public API
(``treerank/__init__.py``, the top of every layer, imported by no treerank module) and the CLI's
subcommand list (``treerank.cli.main``, inside the top layer) do.
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
            "treerank.storelike",
        },
    ),
    ("distributed", {"treerank.distributed"}),  # process group, gather, DDP training step
    ("kernels", {"treerank.kernels"}),
    ("metrics", {"treerank.metrics"}),
    ("readers", {"treerank.readers"}),
    ("encoders", {"treerank.encoders"}),
    ("store", {"treerank.store"}),
    ("models", {"treerank.models"}),
    ("training", {"treerank.training"}),
    ("search", {"treerank.search"}),
    # the forest family, one package: its model, config, training, index and kernels
    ("forest", {"treerank.forest"}),
    ("families", {"treerank.families"}),
    ("evaluation", {"treerank.evaluation"}),
    ("diagnostics", {"treerank.diagnostics"}),
    # the one library call behind each command (embed, train, evaluate, diagnose)
    ("tasks", {"treerank.tasks"}),
    ("pipeline", {"treerank.pipeline"}),
    ("serve", {"treerank.serve"}),
    ("cli", {"treerank.cli"}),
]
"""Bottom to top, one folder (package) per layer; the base layer is the top-level modules.
Keep in step with docs/DESIGN.md."""


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


ROOT_FACADE = "treerank/__init__.py"


def violations(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        mine = layer_of(me)
        rel = path.relative_to(root.parent)
        for line, mod in imports_of(path, root):
            if layer_of(mod) > mine:
                found.append(
                    f"{rel}:{line}: {me} ({LAYERS[mine][0]}) imports "
                    f"{mod} ({LAYERS[layer_of(mod)][0]})"
                )
    return found


def test_no_module_imports_a_higher_layer() -> None:
    assert violations() == []


NAME_IMPORTERS = {ROOT_FACADE, "treerank/cli/main.py"}
"""The only modules that may call ``importlib.import_module`` (see the module docstring)."""


def test_no_module_imports_another_by_name() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            name = ""
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.ImportFrom) and node.module == "importlib":
                name = next((a.name for a in node.names if a.name == "import_module"), "")
            if name in ("import_module", "__import__") and rel not in NAME_IMPORTERS:
                found.append(f"{rel}:{node.lineno}: {name}")
    assert found == []


def test_the_root_facade_is_not_imported_from_inside() -> None:
    import treerank

    public = set(treerank.__all__) if hasattr(treerank, "__all__") else set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "treerank" and not node.level:
                assert not {a.name for a in node.names} & public, f"{path}:{node.lineno}"


def test_system_kinds_do_not_depend_on_import_order() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from treerank.search.specs import SYSTEM_KINDS, build_system\n"
        "print(sorted(SYSTEM_KINDS))\n"
        "print(type(build_system('tuned-fusion:bm25+cosine')).__name__)\n"
        "print(type(build_system('adaptive-fusion:bm25+cosine')).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert "'tuned-fusion'" in out[0] and "'adaptive-fusion'" in out[0]
    assert out[1:3] == ["TunedFusionSystem", "TunedFusionSystem"]


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
        "treerank.search.systems (search)",
    ]
    with pytest.raises(KeyError, match="in no layer"):
        layer_of("treerank.nowhere")
