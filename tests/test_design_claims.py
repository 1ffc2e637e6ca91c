"""The claims ``docs/DESIGN.md`` makes about the code, checked on the source (issue 31 item 10).

Each test parses ``src/treerank`` (``ast``, as ``tests/test_layers.py`` does) and fails when the
claim it is named beside in DESIGN.md stops being true. A claim no parse can check (the CLI
holds no logic a test cannot reach, numbers reproduce) is checked elsewhere or not at all.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.test_layers import LAYERS, SRC, imports_of, module_name

DESIGN = SRC.parents[1] / "docs" / "DESIGN.md"


def _tree(rel: str) -> ast.Module:
    return ast.parse((SRC / rel).read_text(encoding="utf-8"), rel)


def _files(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((SRC / folder).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _called(tree: ast.AST) -> set[str]:
    """The names called in ``tree`` (``f(...)`` and ``x.f(...)`` both give ``f``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                out.add(f.id)
            elif isinstance(f, ast.Attribute):
                out.add(f.attr)
    return out


def _imported(tree: ast.AST) -> dict[str, str]:
    """Local name -> ``module.name`` of every ``from module import name [as local]``."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


# -- layers ---------------------------------------------------------------------------------


def test_the_layer_table_is_the_layers_list() -> None:
    """DESIGN "Layers": its table is ``tests/test_layers.py``'s ``LAYERS``, row for row."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [
        line.split("|")[1].strip()
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| layer ")
    ]
    assert rows == [name for name, _ in LAYERS]


def test_no_module_attr_strings() -> None:
    """DESIGN "Layers": no module is named by a ``"module:attr"`` string."""
    pattern = re.compile(r"^treerank(\.[a-z_0-9]+)+:[A-Za-z_]\w*$")
    found = [
        f"{_rel(p)}:{n.lineno}: {n.value}"
        for p in _files(".")
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and pattern.match(n.value)
    ]
    assert found == []


# -- tasks: one library call behind each command ---------------------------------------------

TASKS = {
    # task module -> (its function, the callers that must use it, lower calls they must not make)
    "tasks/embed.py": ("embed", ("cli/embed.py", "pipeline/stages/embed.py"), {"embed_dataset"}),
    "tasks/train.py": ("train_model", ("cli/train.py", "pipeline/stages/train.py"), set()),
    "tasks/evaluate.py": (
        "evaluate",
        ("cli/evaluate.py", "pipeline/stages/evaluate.py"),
        {"compare_systems", "resolve_evaluation"},
    ),
    # treerank diagnose (cli/diagnose.py) still calls run_diagnostics itself
    "tasks/diagnose.py": ("diagnose", ("pipeline/stages/diagnose.py",), {"run_diagnostics"}),
}


def test_each_command_and_its_stage_call_one_task() -> None:
    """DESIGN "Layers" (tasks) and "Data flow": ``treerank embed / train / evaluate`` and their
    stages call the same ``tasks`` function, and neither makes the lower call the task makes."""
    for task, (fn, callers, lower) in TASKS.items():
        module = module_name(SRC / task)
        defined = {n.name for n in _tree(task).body if isinstance(n, ast.FunctionDef)}
        assert fn in defined, f"{task} defines no {fn}"
        for caller in callers:
            tree = _tree(caller)
            local = [k for k, v in _imported(tree).items() if v == f"{module}.{fn}"]
            assert local, f"{caller} does not import {module}.{fn}"
            assert set(local) & _called(tree), f"{caller} does not call {fn}"
            assert not lower & _called(tree), f"{caller} calls {lower & _called(tree)} itself"


def test_the_pipeline_and_the_cli_decide_an_evaluation_with_resolve_evaluation() -> None:
    """DESIGN "Identities and the stage graph" / "Configs": the evaluate stage and
    ``treerank evaluate`` hand ``EvaluationSettings`` to the same ``resolve_evaluation``
    (through ``tasks.evaluate.evaluate``), then ``compare_systems`` under ``launch()``."""
    called = _called(_tree("tasks/evaluate.py"))
    assert {"resolve_evaluation", "compare_systems", "launch"} <= called
    for caller in ("cli/evaluate.py", "pipeline/stages/evaluate.py"):
        assert "EvaluationSettings" in ast.unparse(_tree(caller))


# -- families -------------------------------------------------------------------------------

FAMILY_HOMES = ("families/", "forest/")
"""Where a family may be named: the family table and the forest's own package."""


def _family_names() -> set[str]:
    from treerank.families import FAMILIES

    return set(FAMILIES)


def _str_constants(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for elt in node.elts:
            yield from _str_constants(elt)


HOMONYMS = {"cosine", "linear"}
"""Family names that are also a system kind, a scoring rule, an nDCG gain or a fusion method:
compared as such they name no family, so they count only against a family-like value."""


def test_no_module_compares_a_family_name() -> None:
    """DESIGN "Data flow" / "Model families": no generic module compares a value with a family
    name of the table (``model_type == "forest"``, ``family in ("mlp", "drt")``); it asks the
    family entry (its hooks, ``trained``, ``own_retrieval``)."""
    names = _family_names()
    found = []
    for path in _files("."):
        if _rel(path).startswith(FAMILY_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = (node.left, *node.comparators)
            text = " ".join(ast.unparse(s) for s in sides)
            family_like = re.search(r"famil|model_type|\bfam\b", text) is not None
            for side in sides:
                hit = set(_str_constants(side)) & names
                if hit - HOMONYMS or (hit and family_like):
                    found.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_no_generic_module_imports_the_forest() -> None:
    """DESIGN "Layers" (forest): generic code reaches the forest only through its family entry."""
    found = [
        f"{_rel(p)}:{line}: {mod}"
        for p in _files(".")
        if not _rel(p).startswith(FAMILY_HOMES)
        for line, mod in imports_of(p)
        if mod == "treerank.forest" or mod.startswith("treerank.forest.")
    ]
    assert found == []


# -- stores ---------------------------------------------------------------------------------

STORE_ANY_PENDING = {
    # ``store: Any`` left today (issue 31 item 6 types them with the narrow store protocols)
    ("encoders/precision.py", "vector_precision", "store"),
    ("evaluation/folds.py", "relevant_rows", "store"),
    ("evaluation/folds.py", "topic_folds", "store"),
    ("search/vector_db.py", "_store_identity", "store"),
    ("search/vector_db.py", "export_to_db", "store"),
    ("search/vector_db.py", "_query_vectors", "store"),
    ("search/vector_db.py", "retrieve", "store"),
}


def test_store_parameters_are_typed() -> None:
    """DESIGN "Configs": a store split is passed typed (``StoreLike``, a concrete store, a path
    or a stage id), never as ``Any`` or unannotated, except the ones listed as pending."""
    found = set()
    for path in _files("."):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                if arg.arg != "store" and not arg.arg.endswith("_store"):
                    continue
                if arg.arg.startswith("open_"):  # a function that opens one, not a store
                    continue
                ann = "" if arg.annotation is None else ast.unparse(arg.annotation)
                if ann in ("", "Any") or "Any" in re.findall(r"\w+", ann):
                    found.add((_rel(path), node.name, arg.arg))
    assert found - STORE_ANY_PENDING == set()


ANY_BANNED = [
    "treerank.storelike",
    "treerank.kernels.*",
    "treerank.metrics.*",
    "treerank.search.*",
    "treerank.evaluation.*",
]
ANY_PENDING = {
    # explicit ``Any`` left today (issue 31 item 6; pyproject.toml says why for each): nested
    # JSON documents read with ``.get``, a dynamic proxy, load_model's model
    "treerank.evaluation.summary",
    "treerank.search.fusion_tuning",
    "treerank.search.query",
    "treerank.search.systems",
}


def test_any_ban_covers_the_documented_layers() -> None:
    """DESIGN "Configs": mypy forbids explicit ``Any`` in ``storelike``, ``kernels/``,
    ``metrics/``, ``search/`` and ``evaluation/``, except the modules listed as pending; a module
    of those layers that is not pending imports no ``Any``."""
    doc = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    overrides = doc["tool"]["mypy"]["overrides"]
    banned = [m for o in overrides if o.get("disallow_any_explicit") for m in o["module"]]
    allowed = {m for o in overrides if o.get("disallow_any_explicit") is False for m in o["module"]}
    assert banned == ANY_BANNED
    assert allowed == ANY_PENDING
    found = []
    for pattern in ANY_BANNED:
        rel = pattern.removeprefix("treerank.").removesuffix(".*").replace(".", "/")
        paths = _files(rel) if pattern.endswith(".*") else [SRC / f"{rel}.py"]
        for p in paths:
            module = "treerank." + _rel(p).removesuffix(".py").replace("/", ".")
            if module.removesuffix(".__init__") in ANY_PENDING:
                continue
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "typing"
                    and any(a.name == "Any" for a in node.names)
                ) or (isinstance(node, ast.Attribute) and node.attr == "Any"):
                    found.append(f"{_rel(p)}:{node.lineno}")
    assert found == []


# -- training -------------------------------------------------------------------------------

TRAINERS = [*_files("training"), SRC / "forest" / "trainer.py", SRC / "forest" / "stages.py"]


def test_trainers_never_import_search_or_evaluation() -> None:
    """DESIGN "Layers": trainers never import search or evaluation (``tasks.train`` hands them
    a ``validate`` callback)."""
    found = [
        f"{_rel(p)}:{line}: {mod}"
        for p in TRAINERS
        for line, mod in imports_of(p)
        if mod.startswith(("treerank.search", "treerank.evaluation"))
    ]
    assert found == []


def test_negative_mining_inside_training_goes_through_kernels_topk() -> None:
    """DESIGN "Layers": a trainer that searches (ANCE-style refresh) imports its exact search
    from ``kernels.topk``, never from ``search``."""
    searchers = []
    for p in TRAINERS:
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for local, full in _imported(tree).items():
            if local in ("exact_search", "topk_desc") and local in _called(tree):
                assert full.startswith("treerank.kernels.topk."), f"{_rel(p)}: {full}"
                searchers.append(_rel(p))
    assert "training/heads.py" in searchers  # the refresh of mined negatives


# -- models and metrics ---------------------------------------------------------------------

FILE_READS = {"open", "read_text", "read_bytes", "load_file", "safe_open"}
READERS = {"models/checkpoint.py", "models/export_st.py"}
"""The modules of ``models/`` that read files: the one checkpoint reader/writer
(``CheckpointMixin``, ``load_model``'s files) and the export's store metadata."""


def test_a_model_never_reads_files() -> None:
    """DESIGN "Layers": a model's module never reads files; a checkpoint is read once, by
    ``models/checkpoint.py`` (``CheckpointMixin.from_checkpoint``)."""
    found = []
    models = [*_files("models"), SRC / "forest" / "model.py"]
    for p in models:
        if _rel(p) in READERS:
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        calls = _called(tree)
        loads = {
            f"{ast.unparse(n.func)}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "load"
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id in ("np", "numpy", "json", "torch", "pickle")
        }
        if calls & FILE_READS or loads:
            found.append(f"{_rel(p)}: {sorted(calls & FILE_READS | loads)}")
    assert found == []


def test_a_metric_never_knows_which_dataset_it_is_scoring() -> None:
    """DESIGN "Layers": the metric layer imports nothing but itself and the base modules (no
    reader, no store)."""
    base = {"treerank"} | {f"treerank.{p.stem}" for p in SRC.glob("*.py")}
    found = [
        f"{_rel(p)}:{line}: {mod}"
        for p in _files("metrics")
        for line, mod in imports_of(p)
        if mod not in base and not mod.startswith("treerank.metrics")
    ]
    assert found == []


# -- pipeline -------------------------------------------------------------------------------

GRAPH_MODULES = ["pipeline/experiment.py", "pipeline/runs.py", "pipeline/identity.py", *(
    _rel(p) for p in _files("pipeline/stages"))]  # fmt: skip


def test_the_stage_graph_never_renders_a_ckpt_string() -> None:
    """DESIGN "How to add a system kind": the run builds a trained run's node directly
    (``CheckpointSpec(path)``), never a ``ckpt:`` string."""
    found = []
    for rel in GRAPH_MODULES:
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("ckpt:") and not _is_docstring(node, rel):
                    found.append(f"{rel}:{node.lineno}")
    assert found == []


def _is_docstring(node: ast.Constant, rel: str) -> bool:
    tree = _tree(rel)
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    return id(node) in docs


def test_the_crash_points_are_the_listed_ones() -> None:
    """DESIGN "Crash hook": the ``crash_point(stage, point)`` calls in the source are the points
    it lists (``<kind>:before-stage-json`` is the one with a variable stage)."""
    text = DESIGN.read_text(encoding="utf-8").split("### Crash hook", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"`([a-z<>]+:[a-z-]+)`", text))
    found = set()
    for path in _files("."):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "crash_point":
                stage, point = node.args[:2]
                name = stage.value if isinstance(stage, ast.Constant) else "<kind>"
                assert isinstance(point, ast.Constant), f"{_rel(path)}:{node.lineno}"
                found.add(f"{name}:{point.value}")
    assert found == listed
