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
