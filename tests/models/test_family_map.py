"""docs/families.md is the family table's module map, kept current by this test."""

from __future__ import annotations

from pathlib import Path

import pytest

from treerank.families import MODULE_ROLES, ModelFamily, all_families, family, trainable_families
from treerank.families.family_map import PACKAGE_DIR, render_family_map

DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"


def test_the_page_is_current() -> None:
    built_in = {n: f for n, f in all_families().items() if f.modules}
    assert DOC.read_text(encoding="utf-8") == render_family_map(built_in), (
        "docs/families.md is out of date: run `python -m treerank.families.family_map`"
    )


def test_every_listed_module_exists_with_a_known_role() -> None:
    for fam in all_families().values():
        for role, path in fam.modules:
            assert (PACKAGE_DIR / path).is_file(), f"{fam.name}: {path} does not exist"
            assert set(role.split(" + ")) <= set(MODULE_ROLES), (fam.name, role)


def test_trainable_families_map_their_model_config_and_trainer() -> None:
    for name in trainable_families():
        roles = {r for role, _ in family(name).modules for r in role.split(" + ")}
        assert {"model", "config", "trainer"} <= roles, name


def test_every_forest_module_is_on_the_forest_map() -> None:
    listed = {path for _, path in family("forest").modules}
    found = {
        p.relative_to(PACKAGE_DIR).as_posix()
        for p in (PACKAGE_DIR / "forest").glob("*.py")
        if p.name != "__init__.py"
    }
    assert len(found) == 13
    assert found <= listed, f"add to the forest's modules: {sorted(found - listed)}"


def test_a_missing_module_or_a_bad_role_is_an_error(tmp_path) -> None:
    gone = ModelFamily("x", object, modules=(("model", "models/nowhere.py"),))
    with pytest.raises(FileNotFoundError):
        render_family_map({"x": gone})
    bad = ModelFamily("x", object, modules=(("widget", "models/cosine.py"),))
    with pytest.raises(ValueError, match="unknown module role"):
        render_family_map({"x": bad})
