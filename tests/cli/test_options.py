"""Shared CLI options: one ``--overwrite``, ``--device`` where a command computes on torch, and
the settings options generated from the records' field help."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.cli.options import OVERWRITE_HELP, field_option
from treerank.diagnostics.settings import DiagnosticsSettings
from treerank.evaluation.settings import EvaluationSettings

COMMAND = get_command(app)


def _options(*path: str) -> dict[str, Any]:
    """The command's options by parameter name (typer's own click options)."""
    cmd: Any = COMMAND
    for name in path:
        cmd = cmd.commands[name]
    return {p.name: p for p in cmd.params if p.param_type_name == "option" and p.name}


@pytest.mark.parametrize("command", ["train", "evaluate", "diagnose"])
def test_overwrite_is_one_option_with_one_help(command: str) -> None:
    opt = _options(command)["overwrite"]
    assert opt.opts == ["--overwrite"] and opt.default is False and opt.is_flag
    assert opt.help == OVERWRITE_HELP


# diagnose option -> DiagnosticsSettings field
DIAGNOSE_FIELDS = {
    "baseline": "baseline",
    "metric": "metric",
    "k": "k",
    "top_n": "top_n",
    "examples": "n_examples",
    "plots": "plots",
}


def test_diagnose_options_take_default_and_help_from_the_settings_fields() -> None:
    opts = _options("diagnose")
    fields = {f.name: f for f in dataclasses.fields(DiagnosticsSettings)}
    for option, name in DIAGNOSE_FIELDS.items():
        assert opts[option].help == fields[name].metadata["help"], option
        assert opts[option].default == fields[name].default, option
    # every diagnose option that shares a name with a field is generated from it
    shared = (set(opts) & set(fields)) | {"examples"}
    assert shared == set(DIAGNOSE_FIELDS)


# evaluate option -> EvaluationSettings field; ``metrics`` stays hand-written: its default (none
# named: the defaults less those deeper than --k) is the CLI's, not the record's
EVALUATE_FIELDS = {
    "baseline": "baseline",
    "second_baseline": "second_baseline",
    "k": "k",
    "threshold": "relevance_threshold",
    "gain": "gain",
    "permutations": "n_permutations",
    "seed": "seed",
    "sample_queries": "sample_queries",
    "sample_seed": "sample_seed",
    "ignore_identical_ids": "ignore_identical_ids",
}


def test_evaluate_options_take_default_and_help_from_the_settings_fields() -> None:
    opts = _options("evaluate")
    fields = {f.name: f for f in dataclasses.fields(EvaluationSettings)}
    for option, name in EVALUATE_FIELDS.items():
        assert opts[option].help == fields[name].metadata["help"], option
        assert opts[option].default == fields[name].default, option
    assert set(fields) - set(EVALUATE_FIELDS.values()) == {"metrics"}


def test_field_option_refuses_a_field_without_help_or_default() -> None:
    @dataclasses.dataclass(frozen=True)
    class Settings:
        bare: int
        plain: int = 3
        helped: int = dataclasses.field(default=2, metadata={"help": "Two."})

    assert field_option(Settings, "helped", "--helped").help == "Two."
    for name in ("bare", "plain", "missing"):
        with pytest.raises(KeyError, match=f"Settings.{name}"):
            field_option(Settings, name, "--x")


@pytest.mark.parametrize(("path", "device"), [(("search",), True), (("serve",), True)])
def test_commands_that_encode_or_score_take_device(path: tuple[str, ...], device: bool) -> None:
    assert ("device" in _options(*path)) is device


def test_index_build_says_why_it_takes_no_device() -> None:
    assert "device" not in _options("index", "build")
    res = CliRunner().invoke(app, ["index", "build", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "Runs on the CPU, hence no --device" in " ".join(res.output.split())


def test_diagnose_runs_with_its_generated_options(tmp_path) -> None:
    """``treerank diagnose`` end to end on a small store: the options become one
    ``DiagnosticsSettings`` (its baseline included), and a bad baseline is exit 2."""
    import json

    from tests.pipeline.test_training import write_store
    from treerank.models.checkpoint import save_checkpoint
    from treerank.models.linear import LinearHead

    store = write_store(tmp_path / "s" / "test")
    head = LinearHead(store.dim)
    save_checkpoint(tmp_path / "lin", head.to_checkpoint("toy", store.encoder_fingerprint))
    args = ["diagnose", str(tmp_path / "lin"), "--store", str(store.path), "--no-plots"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "d"), "--k", "50"])
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "d" / "diagnostics.json").read_text())["meta"]
    assert meta["baseline"] == "cosine" and meta["k"] == 50
    bad = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "e"), "--baseline", "nope:x"])
    assert bad.exit_code == 2 and "nope" in bad.output
