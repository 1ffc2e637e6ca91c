"""``treerank search``: query texts in, ranked passages out (table, JSON or a TREC run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from treerank.cli.errors import fail
from treerank.cli.options import cli_device, device_option
from treerank.cli.spec_help import SEE_KINDS, RegistryHelpCommand


def query_precision_option() -> Any:
    """The ``--precision`` option of the commands that encode queries (``search``, ``serve``)."""
    return typer.Option(
        None,
        "--precision",
        help="Query encoder precision on the torch backend: fp32, bf16 or auto (the measured "
        "fastest path the store allows; default: the store's). fp32 and bf16 mix; int8 only "
        "with int8.",
    )


def _read_queries(path: Path) -> tuple[list[str], list[str]]:
    """One query per line, or ``qid<TAB>text`` per line; blank lines skipped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: bytes that are not UTF-8, an empty text after the tab, a query id given
            twice (a TREC run could not tell the two apart), or no queries; names file and line.
    """
    from treerank.readers.errors import decode_utf8, split_lines

    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    ids: list[str] = []
    texts: list[str] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(split_lines(decode_utf8(path.read_bytes(), path)), start=1):
        if not line.strip():
            continue
        qid, tab, text = line.partition("\t")
        if tab and not text.strip():
            raise ValueError(f"{path}:{n}: empty query text after the tab")
        qid = qid.strip() if tab else str(len(ids))
        if qid in first_line:
            raise ValueError(
                f"{path}:{n}: query id {qid!r} was already given on line {first_line[qid]}; "
                "each query needs its own id"
            )
        first_line[qid] = n
        ids.append(qid)
        texts.append(text.strip() if tab else line.strip())
    if not texts:
        raise ValueError(f"{path}: no queries")
    return ids, texts


def search(
    store: Path = typer.Option(..., "--store", "-s", help="Store split directory."),
    queries: list[str] = typer.Option(
        [], "--query", "-q", metavar="TEXT", help="Query text (repeatable)."
    ),
    queries_file: Path | None = typer.Option(
        None, "--queries", help="File of queries: one per line, or qid<TAB>text."
    ),
    systems: list[str] = typer.Option(
        ["cosine"],
        "--system",
        metavar="SPEC",
        help=f"System spec (one; `evaluate` compares several); {SEE_KINDS}.",
    ),
    k: int = typer.Option(10, "--k", "-k", help="Hits per query."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or trec."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
    encoder: str | None = typer.Option(
        None, "--encoder", help="Model to load instead of the store's (fingerprint must match)."
    ),
    backend: str | None = typer.Option(
        None,
        "--backend",
        help="Query encoder backend: torch, onnx, onnx-int8 or auto (default: the store's; int8 "
        "queries are refused against an fp32 store and the reverse).",
    ),
    device: str = device_option(),
    precision: str | None = query_precision_option(),
) -> None:
    """Encode queries with the store's encoder (pinned by its weights fingerprint) and search.

    The output names the system: a ``system: <spec>`` line above the tables, a ``system``
    field in each JSON query object, the run tag (last column) of a TREC run. A cross-encoder
    reranker (``scorer=ce:<dir>``) is loaded and its ``fingerprint=`` pin checked before the
    query encoder loads; its folder and weights fingerprint are a ``cross-encoder:`` line
    under the ``system:`` line, a ``cross_encoders`` list in each JSON query object, or a line
    on stderr beside a TREC run.
    """
    from treerank.families import CHECKPOINTS
    from treerank.kernels.topk import check_run_depth
    from treerank.search.ce_rescore import cross_encoders
    from treerank.search.query import load_store_encoder, search_texts
    from treerank.search.specs import BuildContext, build_system
    from treerank.store import EmbeddingStore

    dev = cli_device(device)  # before anything is read or loaded
    if fmt not in ("table", "json", "trec"):
        raise fail(f"--format must be table, json or trec, not {fmt!r}")
    if out is not None and (out.is_dir() or out.parent.is_file()):  # before the encoder loads
        raise fail(
            f"{out}: cannot be written: --out names a file, and this is a directory or "
            "lies under a file"
        )
    try:
        check_run_depth(k)
        for i, q in enumerate(queries, 1):
            if not q.strip():  # the HTTP API refuses an empty query too (422)
                raise ValueError(f"--query {i} is empty; give a query text")
        qids = [str(i) for i in range(len(queries))]
        texts = list(queries)
        if len(systems) != 1:  # typer would keep the last one without a word
            raise ValueError(
                f"--system given {len(systems)} times ({', '.join(systems)}); search ranks with "
                "one system: run it once per system, or compare them with treerank evaluate"
            )
        system = systems[0]
        if queries_file is not None:
            fids, ftexts = _read_queries(queries_file)
            qids += fids
            texts += ftexts
        if not texts:
            raise ValueError("give --query TEXT (repeatable) or --queries FILE")
        # a bad spec fails here, before the encoder loads (~5 s)
        built = build_system(system, BuildContext(device=dev, checkpoints=CHECKPOINTS))
        # a reranker's cross-encoder loads and its pin is checked before the encoder loads
        rerankers = [ce.identity().to_dict() for ce in cross_encoders(built)]
        st = EmbeddingStore.open(store)
        enc = load_store_encoder(st, encoder, backend, device=dev.concrete(), precision=precision)
        run, hits = search_texts(st, built, enc, texts, k)
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise fail(exc) from None
    _write_hits(fmt, system.strip(), qids, texts, hits, rerankers, out)


def _write_hits(
    fmt: str,
    spec: str,
    qids: list[str],
    texts: list[str],
    hits: list,
    rerankers: list[dict[str, Any]],
    out: Path | None,
) -> None:
    """Write the hits as ``fmt`` (json, trec or table) to ``out`` (stdout when None), with each
    cross-encoder reranker's identity (a JSON field, a stderr line beside TREC, table notes)."""
    if fmt == "json":
        extra = {"cross_encoders": rerankers} if rerankers else {}
        doc = [
            {"query_id": q, "query": t, "system": spec, **extra, "hits": [h.to_dict() for h in hs]}
            for q, t, hs in zip(qids, texts, hits, strict=True)
        ]
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    elif fmt == "trec":
        tag = spec.replace(" ", "_")
        text = "".join(
            f"{q} Q0 {h.source_id} {h.rank} {h.score:.6g} {tag}\n"
            for q, hs in zip(qids, hits, strict=True)
            for h in hs
        )
        for ce in rerankers:  # a TREC run has no room for it
            typer.echo(_ce_line(ce), err=True)
    else:
        _print_table(spec, qids, texts, hits, out, tuple(_ce_line(ce) for ce in rerankers))
        return
    if out is not None:
        from treerank.atomic import atomic_write_text

        atomic_write_text(out, text)
    else:
        typer.echo(text, nl=False)


def _ce_line(ce: dict[str, Any]) -> str:
    """The ``cross-encoder:`` line of a reranker's identity (folder, fingerprint, pin)."""
    pin = f" (pinned {ce['pinned']})" if ce["pinned"] else ""
    return f"cross-encoder: {ce['path']} {ce['fingerprint']}{pin}"


def _print_table(
    spec: str,
    qids: list[str],
    texts: list[str],
    hits: list,
    out: Path | None,
    notes: tuple[str, ...] = (),
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=open(out, "w", encoding="utf-8") if out else None, width=160)
    console.print(f"system: {spec}", markup=False, highlight=False)
    for note in notes:
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    for q, t, hs in zip(qids, texts, hits, strict=True):
        table = Table(title=f"query {q}: {t}", title_justify="left")
        for col in ("rank", "passage id", "source id", "score", "text"):
            table.add_column(col, justify="right" if col in ("rank", "score") else "left")
        for h in hs:
            snippet = h.text if len(h.text) <= 100 else h.text[:97] + "..."
            table.add_row(str(h.rank), str(h.passage_id), h.source_id, f"{h.score:.4f}", snippet)
        console.print(table)
    if out:
        console.file.close()


def register(app: typer.Typer) -> None:
    """Add the ``search`` command to the ``treerank`` app."""
    app.command("search", help="Search a store split with query texts.", cls=RegistryHelpCommand)(
        search
    )
