"""``DiagnosticsSettings`` is ``run_diagnostics``'s interface: no ``**overrides``, one way to
give the baseline."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from treerank.diagnostics.procedure import run_diagnostics
from treerank.diagnostics.settings import DiagnosticsSettings


def test_run_diagnostics_takes_its_settings_as_one_record() -> None:
    params = inspect.signature(run_diagnostics).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert "baseline" not in params and "settings" in params
    assert params["settings"].kind is inspect.Parameter.KEYWORD_ONLY
    assert DiagnosticsSettings().baseline == "cosine"


def test_every_field_has_help() -> None:
    for f in dataclasses.fields(DiagnosticsSettings):
        assert f.metadata.get("help"), f.name


def test_a_setting_by_name_is_refused(tmp_path) -> None:
    with pytest.raises(TypeError, match="k"):
        run_diagnostics(tmp_path / "ckpt", object(), tmp_path / "out", k=10)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        run_diagnostics(tmp_path / "ckpt", object(), tmp_path / "out", "bm25")  # type: ignore[misc]
