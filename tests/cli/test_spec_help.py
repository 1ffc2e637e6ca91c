"""``--help`` reads the system kinds from the kind table, and no option shows a raw type name."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from treerank.cli.main import _SUBCOMMANDS, app

SPEC_COMMANDS = ["evaluate", "search", "serve", "audit"]


@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_help_lists_every_registered_kind(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import dataclass
    from typing import ClassVar

    from treerank.search.specs import SYSTEM_KINDS, SystemSpec

    @dataclass(frozen=True)
    class ToySpec(SystemSpec):
        kind: ClassVar[str] = "toy-kind"
        summary: ClassVar[str] = "a toy"
        syntax: ClassVar[str] = "toy-kind:<x>"

    # a kind registered after the CLI was built shows up too: the list is not written by hand
    monkeypatch.setitem(SYSTEM_KINDS, "toy-kind", ToySpec)
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    kinds = res.output.split("System kinds (SPEC = kind or kind:parameters):", 1)[1]
    listed = [ln.split()[0] for ln in kinds.splitlines() if ln[:2] == "  " and ln[2:3].strip()]
    assert listed == list(SYSTEM_KINDS)
    for must in ("faiss", "rescore", "tuned-fusion", "adaptive-fusion", "toy-kind"):
        assert must in listed
    assert "a toy; toy-kind:<x>" in " ".join(kinds.split())


@pytest.mark.parametrize("command", [c for c in _SUBCOMMANDS if c != "index"] + ["index build"])
def test_no_python_type_metavars(command: str) -> None:
    res = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "<list[" not in res.output and "list[str]" not in res.output
