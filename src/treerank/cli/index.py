"""``treerank index build | info``: build (or reuse) a cached FAISS index over a store split."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from treerank.cli.errors import fail
from treerank.cli.spec_help import IndexHelpCommand

index_app = typer.Typer(
    help="Build and inspect FAISS indexes cached under a store split.", no_args_is_help=True
)


@index_app.command("build", cls=IndexHelpCommand)
def build(
    store: Path = typer.Option(..., "--store", "-s", help="Store split directory."),
    spec: str = typer.Option(
        ...,
        "--index",
        "-i",
        help="Index spec, faiss:<kind>[:k=v,...], e.g. faiss:hnsw:M=32 or "
        "faiss:ivfpq:nlist=1024,m=48; the kinds are listed under 'Index kinds' below.",
    ),
    index_dir: Path | None = typer.Option(
        None, "--index-dir", help="Cache directory (default <store>/indexes)."
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild even when cached."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the index meta as JSON."),
) -> None:
    """Build the index (trained on a sample, filled chunk by chunk from the memory map).

    Runs on the CPU, hence no --device: FAISS trains and fills the index on the CPU, and an
    over=ckpt: head's passage tower runs there too (the library call takes no device).
    """
    from treerank.search.faiss_index import build_index, parse_index_spec
    from treerank.store import EmbeddingStore

    try:
        parsed = parse_index_spec(spec.removeprefix("faiss:"), spec, what="index spec")
    except ValueError as exc:
        raise fail(f"--index: {exc}") from None
    try:
        st = EmbeddingStore.open(store)
        index = build_index(st, parsed, index_dir=index_dir, progress=progress, force=force)
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise fail(exc) from None
    _print_meta(index.meta, index.path, as_json)


@index_app.command("info")
def info(
    path: Path = typer.Argument(..., help="An index directory, or a store split (lists all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show an index's kind, parameters, store signature, counts, size and build cost (reads
    its meta.json only; nothing is computed)."""
    from treerank.search.faiss_index import list_indexes, read_index_meta

    try:
        if (path / "index.faiss").is_file():
            metas = [(path, read_index_meta(path))]
        else:
            metas = list_indexes(path)
    except (ValueError, FileNotFoundError) as exc:
        raise fail(exc) from None
    if not metas:
        raise fail(f"{path}: no index found (build one with `treerank index build`)")
    if as_json:
        typer.echo(json.dumps([{"path": str(p), **m} for p, m in metas], indent=2))
        return
    for p, m in metas:
        _print_meta(m, p, False)


def _print_meta(meta: dict, path: Path | None, as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    if as_json:
        typer.echo(json.dumps({"path": str(path), **meta}, indent=2))
        return
    table = Table(title=str(path), show_header=False)
    # train_size is shown once, as the training sample actually drawn (train_rows); indexes
    # built before it was resolved record the default as train_size 0
    build = {k: v for k, v in (meta.get("build") or {}).items() if k != "train_size"}
    table.add_row("kind", json.dumps(meta.get("kind")))
    table.add_row("build", json.dumps(build))
    for key in ("over", "n_passages", "dim"):
        table.add_row(key, json.dumps(meta.get(key)))
    if meta.get("train_rows"):
        n = meta.get("n_passages") or 0
        table.add_row("training sample", f"{meta['train_rows']:,} of {n:,} passages")
    else:
        table.add_row("training sample", "none (this kind is not trained)")
    table.add_row("index size", f"{meta.get('index_bytes', 0) / 2**20:.1f} MiB")
    table.add_row("build time", f"{meta.get('build_seconds', 0):.1f} s")
    table.add_row("peak RSS at build", f"{meta.get('peak_rss_mib', 0):.0f} MiB")
    enc = meta.get("encoder") or {}
    table.add_row("encoder", f"{enc.get('name')} {enc.get('fingerprint')}")
    table.add_row("store", str(meta.get("store")))
    # a digest of the store's passage vectors; meta.json's "signature" is another hash (the
    # embed run's plan), so this one is never called a signature on screen
    table.add_row("store vectors digest", str(meta.get("store_signature")))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add the ``index`` command group to the ``treerank`` app."""
    app.add_typer(index_app, name="index")
