"""``treerank export``: a trained head to sentence-transformers, a store split to Qdrant.

::

    treerank export ckpt:<dir> --to sentence-transformers OUT
    treerank export <store split> --to db:<folder or url>[:collection] [--head ckpt:<dir>]

The ``db:`` target is the same text as the ``db:`` system that searches it afterwards
(``treerank evaluate --store <split> --system db:<folder>:<collection>``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import fail
from treerank.search.specs import CheckpointSpec, DBSpec, SpecError, SystemSpec, parse_spec

ST_TARGET = "sentence-transformers"


def _node(text: str) -> SystemSpec | None:
    """The spec node ``text`` parses to, ``None`` when it is no spec (a store path)."""
    try:
        return parse_spec(text)
    except SpecError:
        return None


def _checkpoint(text: str, what: str, hint: str) -> CheckpointSpec:
    """``text`` parsed as ``ckpt:<dir>``; exit 2 naming ``what`` otherwise (``hint``: the fix).

    Raises:
        typer.Exit: code 2 (not a ``ckpt:`` spec, or no checkpoint in the directory).
    """
    try:
        node = parse_spec(text)
    except SpecError as exc:
        if exc.kind == CheckpointSpec.kind:  # ckpt:<dir> with no checkpoint in it
            raise fail(f"{what} {text!r}: {exc}") from None
        node = None
    if not isinstance(node, CheckpointSpec):
        raise fail(hint)
    return node


def export(
    source: str = typer.Argument(
        ..., help="ckpt:<dir> (a trained linear/MLP head) or a store split directory."
    ),
    to: str = typer.Option(
        ...,
        "--to",
        help=f"{ST_TARGET} (needs OUT) or db:<folder or http(s) url>[:collection] (Qdrant).",
    ),
    out: Path | None = typer.Argument(None, help="Output directory (sentence-transformers)."),
    head: str | None = typer.Option(
        None, "--head", help="db: store the passage tower of this head, ckpt:<dir>."
    ),
    base_model: str | None = typer.Option(
        None, "--base-model", help="Encoder the head was trained on (default all-MiniLM-L6-v2)."
    ),
    query_prompt: str | None = typer.Option(
        None,
        "--query-prompt",
        help="Query prompt, for a head whose store is not recorded (else the store's is carried; "
        "a different one is refused).",
    ),
    passage_prompt: str | None = typer.Option(
        None, "--passage-prompt", help="Passage prompt (as --query-prompt)."
    ),
    store: Path | None = typer.Option(
        None,
        "--store",
        help=f"{ST_TARGET}: the store split the head was trained on (default: the one the "
        "checkpoint records); its truncation, prompts and precision are carried or refused.",
    ),
    texts: bool = typer.Option(True, "--texts/--no-texts", help="db: passage texts in payload."),
    batch_size: int = typer.Option(512, "--batch-size", min=1, help="db: points per request."),
    dim: int | None = typer.Option(None, "--dim", help="Dimension of a Go-tool store."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing OUT."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar."),
) -> None:
    """Export a trained head (sentence-transformers) or a store split (vector database)."""
    target = None if to == ST_TARGET else _node(to)
    if to != ST_TARGET and not isinstance(target, DBSpec):
        raise fail(f"--to {to!r}: expected {ST_TARGET} or db:<folder or url>[:collection]")
    if target is None:
        ckpt = _checkpoint(
            source,
            "SOURCE",
            f"--to {ST_TARGET} exports a trained head, named ckpt:<dir>; SOURCE {source!r} "
            f"lacks the ckpt: prefix: treerank export ckpt:{source} --to {ST_TARGET} "
            f"{out or 'OUT'}",
        )
        if out is None:
            raise fail(
                f"--to {ST_TARGET} exports a head and needs OUT: "
                f"treerank export ckpt:<dir> --to {ST_TARGET} OUT"
            )
        if head is not None:
            raise fail(f"--head applies to --to db:...; the head of --to {ST_TARGET} is SOURCE")
        if store is not None and not (store / "meta.json").is_file():
            raise fail(f"--store {store}: no meta.json (not a store split directory)")
        from treerank.families import model_class
        from treerank.models.export_st import export_sentence_transformers

        try:
            res = export_sentence_transformers(
                ckpt.path,
                out,
                base_model=base_model,
                query_prompt=query_prompt,
                passage_prompt=passage_prompt,
                overwrite=overwrite,
                store=store,
                classes=model_class,
            )
        except (ValueError, RuntimeError, FileNotFoundError, FileExistsError, OSError) as exc:
            raise fail(exc) from None
        towers = "query/document towers (Router)" if res.asymmetric else "one shared tower"
        typer.echo(
            f"wrote {res.path}: {res.family} head, {towers}, {res.scoring}, dim {res.dim}, "
            f"max_seq_length {res.max_seq_length}, prompts {res.prompts or 'none'}"
        )
        return
    if isinstance(target, DBSpec):
        if out is not None:
            raise fail(f"--to {to}: takes no OUT argument (the location is in the target)")
        if _node(source) is not None:
            raise fail("--to db: exports a store split; pass the head as --head ckpt:<dir>")
        head_ckpt = (
            None
            if head is None
            else _checkpoint(head, "--head", f"--head {head!r}: expected ckpt:<dir>")
        )
        from treerank.families import model_class
        from treerank.search.vector_db import export_to_db
        from treerank.store import EmbeddingStore

        loc, collection = target.location, target.collection
        try:
            st = EmbeddingStore.open(source, dim=dim)
            name = collection or f"{st.source or 'store'}-{st.split}"
            res_db = export_to_db(
                st,
                loc,
                name,
                head=None if head_ckpt is None else head_ckpt.path,
                texts=texts,
                batch_size=batch_size,
                progress=progress,
                classes=model_class,
            )
        except ImportError as exc:
            raise fail(exc) from None
        except (ValueError, FileNotFoundError, OSError) as exc:
            raise fail(exc) from None
        except Exception as exc:  # the Qdrant client's errors: no server, refused, HTTP errors
            if not type(exc).__module__.startswith("qdrant_client"):
                raise
            raise fail(
                f"--to {to}: the Qdrant server at {loc} cannot be reached or refused the request "
                f"({type(exc).__name__}: {exc}); start it (e.g. docker run -p 6333:6333 "
                "qdrant/qdrant), or export to a local folder: --to db:<folder>[:collection]"
            ) from None
        state = "already complete" if res_db.reused else "written"
        typer.echo(
            f"{res_db.location}: collection {res_db.collection} -> {res_db.physical} "
            f"({res_db.n_points} points, dim {res_db.dim}, {state}); "
            f"search it with --system db:{res_db.location}:{res_db.collection}"
        )
        return


def register(app: typer.Typer) -> None:
    """Add ``export`` to the ``treerank`` command."""
    app.command("export")(export)
