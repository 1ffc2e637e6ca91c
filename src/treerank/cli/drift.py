"""``treerank drift``: linear CKA and neighbour overlap between two stores of the same split."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import fail


def drift(
    a: Path = typer.Argument(..., help="Store split directory (e.g. the frozen one).", metavar="A"),
    b: Path = typer.Argument(
        ..., help="Store split of the same data (e.g. re-embedded).", metavar="B"
    ),
    k: int = typer.Option(10, "--k", help="Neighbours compared per query."),
    passages: bool = typer.Option(True, "--passages/--no-passages", help="Also the passages' CKA."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the result as JSON here."),
) -> None:
    """Drift between two stores of the same split: linear CKA of the query (and passage)
    vectors and nearest-neighbour overlap@k. Exits 2 when the stores hold different data."""
    import json

    from treerank.atomic import atomic_write_json
    from treerank.diagnostics.drift import store_drift
    from treerank.store import EmbeddingStore, StoreFormatError

    try:
        res = store_drift(EmbeddingStore.open(a), EmbeddingStore.open(b), k=k, passages=passages)
    except (ValueError, FileNotFoundError, StoreFormatError) as exc:
        raise fail(str(exc)) from exc
    if out is not None:
        atomic_write_json(out, res)
    typer.echo(json.dumps(res, indent=2))


def register(app: typer.Typer) -> None:
    """Add the ``drift`` command to ``app``."""
    app.command("drift")(drift)
