"""Every shipped fine-tune config (configs/finetune/*.yaml) parses strictly, with the family and
the one CPU budget its comment states."""

from __future__ import annotations

from pathlib import Path

import pytest

from treerank.config import load_yaml
from treerank.training.finetune_config import parse_finetune_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "finetune").glob("*.yaml"))


def test_there_are_shipped_configs() -> None:
    assert {p.stem for p in CONFIGS} >= {"squad_query_tower_cpu", "squad_cross_encoder"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_parses(path: Path) -> None:
    doc = load_yaml(path)
    cfg = parse_finetune_config(doc)
    assert cfg.family == doc["family"]


def test_cpu_budgets() -> None:
    by = {p.stem: parse_finetune_config(load_yaml(p)) for p in CONFIGS}
    qt = by["squad_query_tower_cpu"]
    assert (qt.family, qt.data.epochs, qt.trainer.precision) == ("query-tower", 1, "auto")
    assert by["squad_cross_encoder"].train.trainer.max_steps == 1200  # type: ignore[union-attr]
    assert by["squad_cross_encoder"].train.trainer.precision == "auto"  # type: ignore[union-attr]
    bi = by["squad_biencoder_cpu"]
    assert (bi.family, bi.trainer.max_steps, bi.trainer.precision) == ("biencoder", 150, "auto")
