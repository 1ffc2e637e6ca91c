"""Generated docs pages equal what ``scripts/gen_docs.py`` writes from the code and results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_generated_page_is_current(tmp_path: Path) -> None:
    gen = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert gen.returncode == 0, gen.stderr
    pages = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.md"))
    assert Path("docs/cli.md") in pages and Path("README.md") in pages
    stale = [
        str(p)
        for p in pages
        if (REPO / p).read_text(encoding="utf-8") != (tmp_path / p).read_text(encoding="utf-8")
    ]
    assert not stale, f"stale generated pages {stale}: run python scripts/gen_docs.py"


def test_cli_page_names_every_command_and_option() -> None:
    """The page holds every option of every command (a failing generator cannot drop one)."""
    import typer

    from treerank.cli.main import app

    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="treerank")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert f"## `treerank {name}`" in text
        for p in getattr(cmd, "params", []):
            for opt in p.opts:
                if opt.startswith("-"):
                    assert opt in text, (name, opt)


def test_doc_links_resolve() -> None:
    """Every relative link of the README and docs/*.md names a file that exists."""
    import re

    bad = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                bad.append(f"{page.relative_to(REPO)} -> {target}")
    assert not bad, bad


def test_models_page_names_every_family() -> None:
    from treerank.families import family_names

    text = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    for name in family_names():
        assert f"| `{name}` |" in text, name


def test_format_names_of_the_readme_are_the_readers() -> None:
    """README's "Your own data" names formats as ``treerank.readers.detect.FORMATS`` does, with
    their default splits."""
    import re

    from treerank.readers.detect import FORMATS

    text = (REPO / "README.md").read_text(encoding="utf-8")
    pairs = re.findall(r"\(`--format (\S+)`, default split `(\S+)`", text)
    assert {n for n, _ in pairs} >= {"beir", "msmarco", "tsv"}
    for name, split in pairs:
        assert FORMATS[name][1] == split, name
