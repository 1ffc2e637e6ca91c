"""``treerank train``: train a model on a store from a config file and write its checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import fail
from treerank.cli.options import cli_device, device_option, overwrite_option
from treerank.families import trainable_families
from treerank.lock import LockHeldError
from treerank.names import unknown_name


def train(
    model: str = typer.Option(
        ..., "--model", "-m", help=f"Model family: {', '.join(trainable_families())}."
    ),
    store: Path = typer.Option(
        ..., "--store", "-s", help="Store split directory, or a store root holding <split>/."
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML config: seed + model/data/trainer/validation sections (configs/heads/*.yaml).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Checkpoint directory to write."),
    split: str = typer.Option("train", "--split", help="Split used when --store is a root."),
    dim: int | None = typer.Option(
        None, "--dim", help="Vector dimension (only for Go-tool stores without meta.json)."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Override the config's seed."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    overwrite: bool = overwrite_option(),
    device: str = device_option(),
) -> None:
    """Train MODEL on the store's queries and save a checkpoint (+ training log and curves).

    A share of the training queries is held out (config ``validation.fraction``) and scored
    against every passage of the split for early stopping. Exits 2 on a bad config or store.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    from rich.table import Table

    from treerank.config import ConfigError, load_yaml
    from treerank.distributed.context import launch
    from treerank.tasks.train import open_train_store, train_model

    console = Console()
    if model not in trainable_families():
        raise fail(unknown_name("model family", model, trainable_families()))
    cfg: dict = {}
    if config is not None:
        try:
            cfg = load_yaml(config)
        except (OSError, ConfigError) as exc:
            raise fail(str(exc)) from exc
    if seed is not None:
        cfg["seed"] = seed
    dev = cli_device(device)  # a bad or unavailable device is refused before the store
    from treerank.atomic import OutputPathError, refuse_existing_output

    try:
        refuse_existing_output(out, overwrite, "a model directory or other files")
    except OutputPathError as exc:
        raise fail(str(exc)) from exc
    try:
        st = open_train_store(store, split, dim=dim)
        with launch() as ctx:  # torchrun: data-parallel (treerank.distributed.training)
            res = train_model(
                model,
                st,
                cfg,
                out,
                progress=progress,
                where=str(config or "config"),
                device=dev,
            )
            if ctx is not None and not ctx.is_main:
                return
    except (ValueError, KeyError, FileNotFoundError, LockHeldError) as exc:
        raise fail(str(exc)) from exc
    s = res.summary
    table = Table(title=f"train {model} -> {res.checkpoint}", title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("store", str(getattr(st, "path", store)))
    for key in ("steps", "epochs", "best_step", "kept_initialisation", "stopped_early", "seconds"):
        if key in s:
            table.add_row(key, str(s[key]))
    table.add_row("training queries", str(s.get("training_queries", "?")))
    table.add_row("positive pairs", str(s.get("positive_pairs", "?")))
    table.add_row("held-out queries", str(res.heldout_rows.size))
    if dn := s.get("denoised_negatives"):  # data.denoise: what the cross-encoder flagged
        flagged = f"{dn['flagged']:,} of {dn['negatives']:,} ({dn['share']:.2%}) dropped"
        table.add_row("denoised negatives", f"{flagged}; {dn['queries']:,} queries scored")
    if s.get("split_groups"):
        table.add_row("split groups", str(s["split_groups"]))
    for k, v in (s.get("best_metrics") or {}).items():
        table.add_row(f"held-out {k}", f"{v:.4f}")
    if res.log_path is not None:
        table.add_row("log", str(res.log_path))
    if res.curves_path is not None:
        table.add_row("curves", str(res.curves_path))
    console.print(table)
    if s.get("split_groups"):
        console.print(
            f"note: whole passage-connected groups would have held out far more than "
            f"validation.fraction of the queries, so {s['split_groups']} group(s) were split "
            "(some held-out queries share a relevant passage with a training query)",
            highlight=False,
        )
    if s.get("kept_initialisation"):
        console.print(
            "[yellow]warning:[/yellow] no training step beat step 0 on the held-out queries, so "
            f"the saved model {res.checkpoint} is its untrained initialisation (a head "
            "initialised to the identity scores exactly like cosine); train on more queries, "
            "lower the learning rate or raise trainer.patience",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    """Add ``treerank train`` to the CLI."""
    app.command("train")(train)
