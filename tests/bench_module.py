"""Load a benchmark script of ``bench/`` or an experiment report of ``scripts/experiments/`` as a
module (neither folder is a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"
EXPERIMENTS = Path(__file__).resolve().parents[1] / "scripts" / "experiments"


def load_experiment_script(name: str) -> ModuleType:
    """``scripts/experiments/<name>.py`` imported as a module (for its ``table`` renderers)."""
    return load_bench(name, EXPERIMENTS)


def load_bench(name: str, folder: Path = BENCH) -> ModuleType:
    """``<folder>/<name>.py`` (``bench/`` by default) imported as module ``name`` (registered in
    ``sys.modules`` first, so that its dataclasses and pickles can find it)."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def missing_table_lines(script: str, result: Path, page: Path) -> list[str]:
    """The lines of ``scripts/experiments/<script>.py``'s ``table(doc)`` of the result JSON
    ``result`` that the Markdown ``page`` lacks (a page must quote its tables line for line)."""
    import json

    mod = load_experiment_script(script)
    doc = json.loads(result.read_text(encoding="utf-8"))
    text = page.read_text(encoding="utf-8")
    return [ln for ln in mod.table(doc).splitlines() if ln and ln not in text]
