"""The ``treerank`` command: thin shells over the library API (no logic lives here)."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="treerank",
    help="Dense-retrieval research over frozen text embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each subcommand lives in its own module `treerank.cli.<name>` exposing `register(app)`.
_SUBCOMMANDS = (
    "embed",
    "evaluate",
    "train",
    "diagnose",
    "run",
    "sweep",
    "audit",
    "index",
    "search",
    "serve",
)
for _name in _SUBCOMMANDS:
    try:
        _mod = importlib.import_module(f"treerank.cli.{_name}")
    except ModuleNotFoundError as exc:  # a subcommand not written yet
        if exc.name != f"treerank.cli.{_name}":
            raise
        continue
    _mod.register(app)


if __name__ == "__main__":
    app()
