"""``treerank run``: the whole loop from raw data to a comparison report."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import ExitCode, fail, print_error
from treerank.lock import LockHeldError


def run(
    experiment: Path = typer.Argument(..., help="Experiment YAML (see configs/sample.yaml)."),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Merge the file's `quick:` profile: fewer steps and models, every stage.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output directory (default: the file's output_dir)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Re-run every stage even if its inputs are unchanged."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """Embed -> BM25 + cosine -> train heads, forest, DRT -> evaluate on the full split ->
    significance -> diagnostics -> one report (report.md + report.json)."""
    from rich.console import Console
    from rich.markup import escape

    from treerank.pipeline.config import ConfigError, load_experiment
    from treerank.pipeline.experiment import run_experiment
    from treerank.pipeline.stages import StageError, StageInterrupted

    console = Console(stderr=True, soft_wrap=True)
    try:
        cfg = load_experiment(experiment, quick=quick, output_dir=out)
        res = run_experiment(
            cfg,
            quick=quick,
            force=force,
            progress=progress,
            log=lambda line: console.print(line, markup=False, highlight=False),
        )
    except (ConfigError, FileNotFoundError, LockHeldError) as exc:
        raise fail(exc) from exc
    except StageError as exc:
        print_error(exc, console)
        console.print(
            "Finished stages are kept; fix the cause and re-run the same command to continue."
        )
        raise typer.Exit(ExitCode.FAILED) from exc
    except StageInterrupted as exc:
        console.print(f"[yellow]interrupted[/yellow]: {escape(exc.advice())}", highlight=False)
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    except KeyboardInterrupt:
        console.print(
            "[yellow]interrupted[/yellow] between stages; every finished stage is kept. "
            "Re-run the same command to continue.",
            highlight=False,
        )
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    for name, o in res.datasets.items():
        typer.echo(f"\n## {name} ({o.eval_split} split, all passages)\n")
        typer.echo(o.comparison_markdown.strip())
        if o.overlap_markdown:
            typer.echo("\nSeen vs unseen positives (train/test overlap):\n")
            typer.echo(o.overlap_markdown.strip())
    from treerank.metrics.metrics import headline_metric
    from treerank.pipeline.report import summary_lines

    metric = headline_metric(res.config.evaluate.metrics)
    typer.echo("\nSummary:")
    for name, o in res.datasets.items():
        for line in summary_lines(name, o, metric, res.config.evaluate.baselines[0]):
            typer.echo(line.replace("**", "").replace("`", ""))
    skipped = [r for r in res.stages if r.skipped is not None]
    if skipped:
        typer.echo("\nSkipped (nothing to do):")
        for r in skipped:
            typer.echo(f"- {r.name}: {r.skipped}")
    typer.echo("")
    typer.echo(f"report: {res.report_md}")
    typer.echo(f"numbers: {res.report_json}")
    typer.echo(f"total: {res.seconds:.1f} s")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
