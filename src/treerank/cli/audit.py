"""``treerank audit``: the false-negative curve of negative miners on a labelled store split."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import fail
from treerank.cli.spec_help import SEE_KINDS, RegistryHelpCommand


def audit(
    store: Path = typer.Option(
        ..., "--store", "-s", help="Labelled store split directory (e.g. stores/scifact/train)."
    ),
    split: str | None = typer.Option(
        None, "--split", help="Split under --store when --store is a store root (e.g. train)."
    ),
    miners: list[str] = typer.Option(
        ["bm25", "cosine"],
        "--miner",
        metavar="SPEC",
        help=f"Miner (a system spec), repeatable; {SEE_KINDS}.",
    ),
    depth: int = typer.Option(100, "--depth", min=1, help="Miner ranks audited per query."),
    max_rate: float = typer.Option(
        0.02,
        "--max-rate",
        help="Guard depth = smallest d with f(r) <= this for every rank r > d.",
    ),
    max_queries: int | None = typer.Option(
        None, "--max-queries", help="Audit a seeded sample of at most N labelled queries."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the query sample."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write results.json, table.md and curve.png here."
    ),
    scorer: str | None = typer.Option(
        None,
        "--scorer",
        metavar="ce:DIR",
        help="Denoise: a cross-encoder (ce:<dir>, e.g. from treerank finetune) scores each "
        "miner's negatives and its labelled positives; the report counts the negatives it "
        "flags as positives, with examples.",
    ),
    denoise_depth: int = typer.Option(
        10, "--denoise-depth", min=1, help="Negatives per query scored by --scorer."
    ),
    denoise_threshold: float | None = typer.Option(
        None, "--denoise-threshold", help="Flag a negative whose --scorer logit is >= this."
    ),
    denoise_margin: float | None = typer.Option(
        0.05,
        "--denoise-margin",
        help="Flag a negative scored within this relative margin of the query's best "
        "labelled positive (score >= p - margin x |p|); a negative value turns it off.",
    ),
) -> None:
    """Fraction of each miner's rank-r passages that are labelled positives, and the guard depth.

    Each miner ranks all passages of the split for the labelled queries (labels not removed);
    f(r) is the share of queries whose rank-r passage is one of their labelled positives, F(r)
    the share over the top r. Labelled positives stand in for the unlabelled ones a miner
    would take as negatives.

    With --scorer ce:DIR, each miner's first --denoise-depth negatives per query (labelled
    passages removed) are scored with the cross-encoder, and those it scores as positives
    (--denoise-threshold, --denoise-margin) are counted and shown (RocketQA's denoising); a
    labelled positive is never a negative, so never flagged. Cost: queries x (depth +
    positives) pairs per miner (about 17 pairs per CPU-s on one core).
    """
    from rich.console import Console

    from treerank.diagnostics.false_negatives import audit_miners, write_audit
    from treerank.store import EmbeddingStore, StoreFormatError

    console = Console(soft_wrap=True)  # markdown rows are never wrapped
    margin = None if denoise_margin is None or denoise_margin < 0 else denoise_margin
    try:
        st = EmbeddingStore.open(store / split if split else store)
        result = audit_miners(
            st,
            miners,
            depth=depth,
            max_queries=max_queries,
            max_rate=max_rate,
            seed=seed,
            scorer=scorer,
            denoise_depth=denoise_depth,
            threshold=denoise_threshold,
            relative_margin=margin,
        )
        paths = write_audit(result, out) if out is not None else {}
    except (ValueError, FileNotFoundError, KeyError, StoreFormatError) as exc:
        raise fail(exc) from None
    console.print(result.table(), markup=False, highlight=False)
    if result.denoise:
        console.print(result.denoise_table(), markup=False, highlight=False)
    for p in paths.values():
        console.print(f"wrote {p}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` command to the ``treerank`` app."""
    app.command(
        "audit",
        help="False-negative audit of negative miners on a labelled split.",
        cls=RegistryHelpCommand,
    )(audit)
