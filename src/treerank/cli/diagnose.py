"""``treerank diagnose``: the DRT seed's four diagnostics on one checkpoint (a thin shell over
:func:`treerank.tasks.diagnose.diagnose`)."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import fail
from treerank.cli.options import cli_device, device_option, field_option, overwrite_option
from treerank.diagnostics.settings import DiagnosticsSettings
from treerank.lock import LockHeldError


def diagnose(
    checkpoint: Path = typer.Argument(
        ...,
        help="Checkpoint directory (DRT: all four steps; any dense head: probes, failures, CKA).",
    ),
    store: Path = typer.Option(
        ...,
        "--store",
        "-s",
        help="Store split directory to evaluate on (e.g. stores/scifact/test).",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output directory: JSON per step, report.md, PNG plots."
    ),
    # the settings' options: default and help from DiagnosticsSettings's fields
    baseline: str = field_option(DiagnosticsSettings, "baseline", "--baseline"),
    metric: str = field_option(DiagnosticsSettings, "metric", "--metric"),
    k: int = field_option(DiagnosticsSettings, "k", "--k"),
    top_n: int = field_option(DiagnosticsSettings, "top_n", "--top-n"),
    examples: int = field_option(DiagnosticsSettings, "n_examples", "--examples"),
    plots: bool = field_option(DiagnosticsSettings, "plots", "--plots/--no-plots"),
    dim: int | None = typer.Option(
        None, "--dim", help="Vector dimension (only for Go-tool stores without meta.json)."
    ),
    probe_store: list[Path] = typer.Option(  # noqa: B006
        [],
        "--probe-store",
        metavar="DIR",
        help="More store splits (same encoder, e.g. the train split) whose queries join the "
        "probes and CKA for statistical power; repeatable.",
    ),
    overwrite: bool = overwrite_option(),
    device: str = device_option(),
) -> None:
    """Scoring variants, per-slot probes, per-query failures and linear CKA, with the seed's
    decision rules printed next to the numbers."""
    from rich.console import Console
    from rich.table import Table

    from treerank.metrics.metrics import DEFAULT_METRICS
    from treerank.store import EmbeddingStore
    from treerank.tasks.diagnose import diagnose as diagnose_task

    dev = cli_device(device)  # refused before any work
    console = Console()
    metrics = tuple(dict.fromkeys([*DEFAULT_METRICS, metric]))
    from treerank.atomic import refuse_existing_output

    try:
        refuse_existing_output(out, overwrite, "earlier diagnostics")
        st = EmbeddingStore.open(store, dim=dim)
        extra = [EmbeddingStore.open(p, dim=dim) for p in probe_store]
        settings = DiagnosticsSettings(
            baseline=baseline,
            metric=metric,
            metrics=metrics,
            k=k,
            top_n=top_n,
            n_examples=examples,
            plots=plots,
        )
        res = diagnose_task(checkpoint, st, out, settings, probe_stores=extra, device=dev)
    except (FileNotFoundError, ValueError, KeyError, LockHeldError) as exc:
        raise fail(exc) from exc

    if res.get("variants"):
        t = Table(
            title=f"scoring variants ({res['meta']['split']}, "
            f"all {res['meta']['n_passages']} passages)"
        )
        t.add_column("variant")
        for m in metrics:
            t.add_column(m, justify="right")
        for name, v in res["variants"]["variants"].items():
            t.add_row(name, *[f"{v['mean'][m]:.4f}" for m in metrics])
        t.add_row(f"baseline: {baseline}", *[f"{res['baseline']['mean'][m]:.4f}" for m in metrics])
        console.print(t)
    r = Table(title="decision rules")
    for col in ("rule", "numbers", "holds", "conclusion"):
        r.add_column(col, overflow="fold")
    for rule in res["rules"]:
        r.add_row(
            rule["rule"], rule["numbers"], "yes" if rule["holds"] else "no", rule["conclusion"]
        )
    console.print(r)
    console.print(f"report: {Path(out) / res['files']['report']}")


def register(app: typer.Typer) -> None:
    """Add ``treerank diagnose`` to the CLI app."""
    app.command("diagnose")(diagnose)
