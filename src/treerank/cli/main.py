"""The ``treerank`` command: thin shells over the library API (no logic lives here)."""

from __future__ import annotations

import importlib
import shutil

import typer


def help_width() -> int:
    """Columns for ``--help``: the terminal's width (``COLUMNS`` when set), 100 off a terminal.

    click caps help text at 80 columns unless told otherwise; option lines then wrap into a
    narrow column that is hard to read.
    """
    return max(shutil.get_terminal_size((100, 24)).columns, 60)


# Plain click help (rich_markup_mode=None): flags read as flags (``--resume``,
# ``--progress / --no-progress``) instead of rich's ``--resume <bool>`` type column.
app = typer.Typer(
    name="treerank",
    help="Dense-retrieval research over frozen text embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": help_width()},
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
    "export",
    "finetune",
    "drift",
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
