"""``--help`` of the commands that take system specs: the kinds, read from the kind table.

The table (:data:`treerank.search.systems.SYSTEM_KINDS`) is filled by importing the modules that
register kinds, and those import torch: too slow for every ``treerank`` start. So
:class:`RegistryHelpCommand` reads it only while ``--help`` is formatted, and appends a
"System kinds" section, one ``kind  help`` line per registered kind. A kind registered anywhere
(``faiss:``, ``rescore:``, ``tuned-fusion:``, a plugin's) shows up without editing any help text.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

SEE_KINDS = "the kinds are listed under 'System kinds' below"
"""For an option's help: where the spec kinds are described."""


def system_kinds() -> list[tuple[str, str]]:
    """``[(kind, help line)]`` of every registered system kind, in registration order."""
    from treerank.search.specs import kind_help

    return kind_help()


def index_kinds() -> list[tuple[str, str]]:
    """``[(kind, help line)]`` of every FAISS index kind, in table order
    (:data:`treerank.search.faiss_index.INDEX_KINDS`)."""
    from treerank.search.faiss_index import INDEX_KINDS

    return [(kind, k.help) for kind, k in INDEX_KINDS.items()]


class IndexHelpCommand(TyperCommand):
    """A command whose ``--help`` ends with the FAISS index kinds and their parameters."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Index kinds (faiss:<kind>[:k=v,...]; defaults shown)"):
            formatter.write_dl(index_kinds())


class RegistryHelpCommand(TyperCommand):
    """A command whose ``--help`` ends with the registered system kinds."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("System kinds (SPEC = kind or kind:parameters)"):
            formatter.write_dl(system_kinds())
