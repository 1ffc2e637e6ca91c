"""``treerank serve``: the HTTP JSON search service over one store split."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import fail
from treerank.cli.options import cli_device, device_option
from treerank.cli.search import query_precision_option
from treerank.cli.spec_help import SEE_KINDS, RegistryHelpCommand


def serve(
    store: Path = typer.Option(..., "--store", "-s", help="Store split directory."),
    systems: list[str] = typer.Option(
        [],
        "--system",
        metavar="SPEC",
        help=f"System spec a request may name (repeatable; first = default); {SEE_KINDS}.",
    ),
    index: Path | None = typer.Option(
        None, "--index", help="A prebuilt index directory to serve (checked against the store)."
    ),
    encoder: str | None = typer.Option(
        None, "--encoder", help="Model to load instead of the store's (fingerprint must match)."
    ),
    backend: str | None = typer.Option(
        None,
        "--backend",
        help="Query encoder backend: torch, onnx, onnx-int8 or auto (default: the store's; int8 "
        "queries are refused against an fp32 store and the reverse).",
    ),
    precision: str | None = query_precision_option(),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    max_k: int = typer.Option(1000, "--max-k", help="Largest k a request may ask for."),
    max_batch: int = typer.Option(256, "--max-batch", help="Most queries per request."),
    max_body_bytes: int = typer.Option(
        1 << 20, "--max-body-bytes", help="Largest request body in bytes (larger: 413)."
    ),
    max_query_chars: int = typer.Option(
        4096, "--max-query-chars", help="Longest query text in characters (longer: 422)."
    ),
    timeout: float = typer.Option(
        30.0, "--timeout", help="Seconds a request may wait for its answer (then 504)."
    ),
    batch_window_ms: float = typer.Option(
        2.0, "--batch-window-ms", help="Milliseconds the micro-batcher waits for more requests."
    ),
    batch_queries: int = typer.Option(
        64, "--batch-queries", help="Most query texts per encoder + search call."
    ),
    device: str = device_option(
        help="Where queries are encoded (torch backend) and searched: auto, cpu, cuda or cuda:N."
    ),
    batch_invariant: bool = typer.Option(
        True,
        "--batch-invariant/--no-batch-invariant",
        help="Encode and search each query alone, so its ranking never depends on the other "
        "requests of its micro-batch (default); --no-batch-invariant encodes a batch together "
        "(more throughput; near-ties may then swap with the traffic).",
    ),
) -> None:
    """Serve POST /search, GET /health, GET /info; refuses mismatched encoder/store/index.

    Exit codes: 0 after a clean shutdown (Ctrl-C / SIGTERM: in-flight requests are answered
    first); 2 when the port is already in use or any input is refused (before anything is
    loaded or printed as served).
    """
    from treerank.serve.app import PortInUseError, bind_socket
    from treerank.serve.app import serve as run_server
    from treerank.serve.service import SearchService, ServiceConfig
    from treerank.store import StoreFormatError

    dev = cli_device(device)  # before the port is bound or anything is loaded
    if not systems and index is None:
        systems = ["cosine"]
    try:
        config = ServiceConfig(
            store=store,
            systems=tuple(systems),
            index=index,
            encoder=encoder,
            max_k=max_k,
            max_batch=max_batch,
            max_body_bytes=max_body_bytes,
            max_query_chars=max_query_chars,
            request_timeout_s=timeout,
            batch_window_s=batch_window_ms / 1000,
            batch_queries=batch_queries,
            batch_invariant=batch_invariant,
            backend=backend,
            device=dev,
            precision=precision,
        )
        sock = bind_socket(host, port)  # a taken port fails here, before loading the store
    except (ValueError, PortInUseError) as exc:
        raise fail(exc) from None
    port = sock.getsockname()[1]  # the port really bound (--port 0: one the system chose)
    try:
        service = SearchService(config)
    except (ValueError, FileNotFoundError, OSError, StoreFormatError) as exc:
        sock.close()
        raise fail(exc) from None
    typer.echo(
        f"serving {service.store.path} ({service.store.n_passages:,} passages) with "
        f"{', '.join(service.systems)} on http://{host}:{port}",
        err=True,
    )
    run_server(service, host=host, port=port, sock=sock)


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to the ``treerank`` app."""
    app.command(
        "serve", help="HTTP JSON search service over a store split.", cls=RegistryHelpCommand
    )(serve)
