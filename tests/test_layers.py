"""The layering of docs/DESIGN.md, checked on the source: a module never imports a higher layer.

Every ``import`` / ``from ... import`` in ``src/treerank`` (function-level imports included) is
parsed; the importing module's layer must be at or above the imported module's layer. Imports
named as strings count too: a ``"treerank.x.y:attr"`` reference (lazy builders, the system-kind
table) and the module argument of ``import_module(...)`` / ``_lazy(...)``; the family table's
references are checked per field against ``ModelFamily.FIELD_LAYERS`` (the layer that resolves
that field). The root package's lazy public API (``treerank/__init__.py``) is the one exemption:
it is the top of every layer and no treerank module imports from it.
"""

from __future__ import annotations

import ast
import re
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
    ("kernels", {"treerank.kernels", "treerank.kernels.sharded"}),
    # pure metric maths (they import nothing above base): below search, so that fusion tuning
    # (a system kind) can score runs
    ("metrics", {"treerank.metrics.metrics", "treerank.metrics.qrels"}),
    ("readers", {"treerank.readers"}),
    ("encoders", {"treerank.encoders"}),
    ("store", {"treerank.store", "treerank.store.sharded_embed"}),
    ("models", {"treerank.models"}),
    ("training", {"treerank.training"}),
    ("search", {"treerank.search", "treerank.search.fusion_tuning"}),
    # the forest family, one package: its model, config, training, index and kernels
    ("forest", {"treerank.forest"}),
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


_REF = re.compile(r"treerank(\.\w+)*(:\w+)?")
_STRING_IMPORTERS = {"import_module", "_lazy", "resolve"}
ROOT_FACADE = "treerank/__init__.py"


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def string_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every treerank module a file names as a string to import it.

    Counted: a ``"treerank.mod:attr"`` constant anywhere, and the constant first argument of
    ``import_module`` / ``_lazy`` / ``resolve``. Skipped: strings inside a ``ModelFamily(...)``
    call (checked per field by :func:`family_violations`).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip: set[int] = set()
    named: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == "ModelFamily":
            skip |= {id(n) for n in ast.walk(node)}
        elif isinstance(node, ast.Call) and _call_name(node) in _STRING_IMPORTERS and node.args:
            a = node.args[0]
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and _REF.fullmatch(a.value):
                named.append((a.lineno, a.value.partition(":")[0]))
                skip.add(id(a))
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Constant):
            continue
        if isinstance(node.value, str) and ":" in node.value and _REF.fullmatch(node.value):
            named.append((node.lineno, node.value.partition(":")[0]))
    return named


def violations(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        mine = layer_of(me)
        rel = path.relative_to(root.parent)
        named = [] if rel.as_posix() == ROOT_FACADE else string_imports(path)
        for line, mod in [*imports_of(path, root), *((ln, m) for ln, m in named)]:
            if layer_of(mod) > mine:
                how = " (named as a string)" if (line, mod) in named else ""
                found.append(
                    f"{rel}:{line}: {me} ({LAYERS[mine][0]}) imports{how} "
                    f"{mod} ({LAYERS[layer_of(mod)][0]})"
                )
    return found


def family_violations() -> list[str]:
    """Every registered family's ``"module:attr"`` references against the field's layer."""
    from treerank.families import FAMILIES, ModelFamily

    names = [layer for layer, _ in LAYERS]
    found = []
    for fam in FAMILIES.values():
        for field, layer in ModelFamily.FIELD_LAYERS.items():
            ref = getattr(fam, field)
            if not isinstance(ref, str):
                continue
            ref_layer = layer_of(ref.partition(":")[0])
            if (
                ref_layer > names.index(layer)
                and names[ref_layer] not in ModelFamily.PACKAGE_LAYERS
            ):
                found.append(f"family {fam.name!r}: {field}={ref!r} is above the {layer} layer")
    return found


def test_no_module_imports_a_higher_layer() -> None:
    assert violations() == []


def test_family_references_stay_within_their_field_layer() -> None:
    from treerank.families import ModelFamily

    names = [layer for layer, _ in LAYERS]
    assert set(ModelFamily.FIELD_LAYERS.values()) <= set(names)
    assert set(ModelFamily.PACKAGE_LAYERS) <= set(names)
    assert family_violations() == []


def test_every_string_reference_names_a_real_module() -> None:
    import importlib.util

    for path in SRC.rglob("*.py"):
        for line, mod in string_imports(path):
            assert importlib.util.find_spec(mod) is not None, f"{path}:{line}: no module {mod}"


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
    (pkg / "lazy.py").write_text(
        'import importlib\nTABLE = {"x": "treerank.pipeline.experiment:run"}\n'
        'def g():\n    return importlib.import_module("treerank.cli.main")\n'
    )
    got = violations(tmp_path / "treerank")
    assert got == [
        "treerank/models/bad.py:2: treerank.models.bad (models) imports "
        "treerank.search.systems (search)",
        "treerank/models/lazy.py:4: treerank.models.lazy (models) imports (named as a string) "
        "treerank.cli.main (cli)",
        "treerank/models/lazy.py:2: treerank.models.lazy (models) imports (named as a string) "
        "treerank.pipeline.experiment (pipeline)",
    ]
    with pytest.raises(KeyError, match="in no layer"):
        layer_of("treerank.nowhere")
