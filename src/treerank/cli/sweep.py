"""``treerank sweep``: an experiment over a grid of settings, one table and one plot per key."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import ExitCode, fail, print_error


def sweep(
    experiment: Path = typer.Argument(
        ..., help="Experiment YAML (optionally with a `sweep:` section holding the grid)."
    ),
    grid: list[str] = typer.Option(
        [],
        "--grid",
        "-g",
        metavar="KEY=V1,V2",
        help="key.path=v1,v2 (dotted path into the YAML, list items by index); repeatable.",
    ),
    reference: str | None = typer.Option(
        None,
        "--reference",
        help="The setting every other is tested against, as key.path=value;key.path=value "
        "(default: the file's sweep.reference, else the first setting).",
    ),
    system: list[str] = typer.Option(
        [],
        "--system",
        "-s",
        metavar="NAME",
        help="Table rows (default: every system); repeatable.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output directory (default: <output_dir>-sweep)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Merge the file's `quick:` profile."),
    force: bool = typer.Option(False, "--force", help="Re-run every stage of every setting."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """Run `treerank run` for every setting of the grid, reusing every stage whose inputs did not
    change, and write sweep.md / sweep.json (mean, 95% CI, paired test against the reference
    setting) and plots/<key>.png.

    The file's `sweep:` section may hold grid, reference, systems, metric and design (`full`,
    the default: every combination; `half`: the 2^(k-1) half fraction of a grid of k >= 3
    two-valued keys, defining relation I = AB..K)."""
    from rich.console import Console

    from treerank.pipeline.config import ConfigError
    from treerank.pipeline.stages import StageError
    from treerank.pipeline.sweep import parse_value, run_sweep

    console = Console(stderr=True, soft_wrap=True)
    ref = None
    if reference:
        ref = {}
        for item in reference.split(";"):
            k, sep, v = item.partition("=")
            if not sep:
                raise fail(ValueError(f"bad --reference item {item!r}: expected key.path=value"))
            ref[k.strip()] = parse_value(v)
    try:
        res = run_sweep(
            experiment,
            grid,
            out=out,
            reference=ref,
            systems=system or None,
            quick=quick,
            force=force,
            progress=progress,
            log=lambda line: console.print(line, markup=False, highlight=False),
        )
    except (ConfigError, FileNotFoundError, FileExistsError) as exc:
        raise fail(exc) from exc
    except StageError as exc:
        print_error(exc, console)
        console.print("Finished stages are kept in the sweep's cache; re-run to continue.")
        raise typer.Exit(ExitCode.FAILED) from exc
    typer.echo(res.files["table"].read_text(encoding="utf-8"))
    typer.echo(f"table: {res.files['table']}")
    typer.echo(f"numbers: {res.files['json']}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
