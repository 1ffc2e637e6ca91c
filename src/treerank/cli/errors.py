"""How every ``treerank`` command reports a failure: ``error: <message>`` on stderr.

The message is printed literally: rich markup would otherwise swallow bracketed text such as
``datasets[0]``, ``['_id']`` or ``bm25[:k1=..]`` that error messages quote.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape


def print_error(message: object, console: Console | None = None) -> None:
    """Print ``error: <message>`` (``str(message)``, markup escaped) to stderr."""
    (console or Console(stderr=True, soft_wrap=True)).print(
        f"[red]error:[/red] {escape(str(message))}", highlight=False
    )


def fail(message: object, code: int = 2) -> typer.Exit:
    """Print the error and return the ``typer.Exit(code)`` to raise."""
    print_error(message)
    return typer.Exit(code)
