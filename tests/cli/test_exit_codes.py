"""The exit-code table (issue 22): one table in code, the docs page rendered from it, and no
command exiting with a number of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from treerank.cli import errors
from treerank.cli.errors import EXIT_CODES, ExitCode, exit_codes_markdown

REPO = Path(__file__).resolve().parents[2]
CLI = Path(errors.__file__).parent


def test_docs_page_is_rendered_from_the_table() -> None:
    assert (REPO / "docs" / "exit-codes.md").read_text(encoding="utf-8") == exit_codes_markdown()
    assert [r.code for r in EXIT_CODES] == list(ExitCode)


def test_commands_exit_only_with_codes_of_the_table() -> None:
    """Every ``typer.Exit(...)`` / ``fail(..., code)`` / ``sys.exit(...)`` in ``treerank.cli``
    passes an ``ExitCode`` member (or forwards a variable), never a bare number."""
    bad = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            args = {"Exit": node.args[:1], "exit": node.args[:1], "fail": node.args[1:2]}.get(
                name, []
            )
            args += [k.value for k in node.keywords if k.arg == "code"]
            bad += [
                f"{path.name}:{node.lineno}"
                for a in args
                if isinstance(a, ast.Constant) and isinstance(a.value, int)
            ]
    assert bad == []
