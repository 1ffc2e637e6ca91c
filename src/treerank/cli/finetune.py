"""``treerank finetune``: fine-tune the store's encoder, re-embed its splits, evaluate."""

from __future__ import annotations

from pathlib import Path

import typer

from treerank.cli.errors import ExitCode, fail
from treerank.cli.options import cli_device, device_option
from treerank.lock import LockHeldError


def finetune(
    config: Path = typer.Argument(
        ...,
        help="YAML config: family + seed + model/data/trainer/validation "
        "(configs/finetune/*.yaml).",
        metavar="CONFIG",
    ),
    store: Path = typer.Option(
        ..., "--store", "-s", help="Store root holding the train and evaluation splits."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder of the run."),
    train_split: str = typer.Option("train", "--train-split", help="Split to train on."),
    eval_split: str = typer.Option("test", "--eval-split", help="Split to evaluate on."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest checkpoint in OUT/checkpoints."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Override the config's seed."),
    permutations: int | None = typer.Option(
        None, "--permutations", help="Randomization-test permutations (default 10,000)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    device: str = device_option(),
) -> None:
    """Fine-tune the encoder of STORE (biencoder, drt-e2e, query-tower or drt-query-tower) on
    its train split's labels, write re-embedded stores (OUT/stores/<split>/), evaluate against
    frozen cosine with paired tests and seen / unseen parts, and write OUT/results.json
    (metrics, drift, cost).

    With `family: cross-encoder` (configs/finetune/squad_cross_encoder.yaml) it trains a
    reranker on the train split instead (BM25-mined negatives; bce, listwise or margin-mse)
    and writes OUT/model, OUT/cross_encoder.json and OUT/results.json (steps, pairs, CPU
    seconds, pairs per CPU second, peak RSS); --eval-split is not read. Rerank with
    `treerank evaluate --system rescore:bm25:depth=20,scorer=ce:OUT/model`.

    Under torchrun (`torchrun --nproc_per_node=2 -m treerank.cli.main finetune ...`) the
    training is data-parallel: each batch of data.batch_size rows (a multiple of the number of
    processes) is split over the processes and every process's rows are the negatives of all,
    so the run trains on the one-process batches; rank 0 then re-embeds and evaluates.

    Exits 2 on a bad config or store (before any training), 130 when interrupted (rerun with
    --resume: training continues from the newest checkpoint, bit-identically).
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    from rich.table import Table

    from treerank.config import ConfigError, load_yaml
    from treerank.pipeline.finetune import run_finetune
    from treerank.store import StoreFormatError
    from treerank.training.finetune_config import parse_finetune_config

    err = Console(stderr=True)
    dev = cli_device(device)  # parsed and checked before any work
    try:
        doc = load_yaml(config)
        if seed is not None:
            doc["seed"] = seed
        cfg = parse_finetune_config(doc, str(config))
    except (OSError, ConfigError) as exc:
        raise fail(str(exc)) from exc
    ce = cfg.family == "cross-encoder"
    for split in (train_split,) if ce else (train_split, eval_split):
        if not (store / split / "meta.json").is_file():
            raise fail(f"{store / split}: no finished store split here (run treerank embed)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # torchrun: what cannot split is refused before the group forms
        from treerank.training.finetune import check_data_parallel

        try:
            check_data_parallel(cfg, world)
        except ValueError as exc:
            if os.environ.get("RANK", "0") != "0":  # every rank exits 2, rank 0 says why
                raise typer.Exit(ExitCode.BAD_INPUT) from None
            raise fail(str(exc)) from exc
    from treerank.distributed.context import launch

    try:
        # torchrun: the training is data-parallel, rank 0 re-embeds and evaluates while the
        # others wait at the group's last barrier (hence a long timeout)
        with launch(timeout_s=12 * 3600.0):
            res = run_finetune(
                cfg,
                store,
                out,
                train_split=train_split,
                eval_split=eval_split,
                resume=resume,
                progress=progress,
                n_permutations=permutations,
                device=dev,
                log=lambda m: err.print(m, highlight=False),
            )
        if res is None:  # a rank other than 0
            return
    except (ValueError, FileNotFoundError, FileExistsError, StoreFormatError, LockHeldError) as exc:
        raise fail(str(exc)) from exc
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted[/yellow]: rerun the same command with --resume to continue "
            "from the newest checkpoint"
        )
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if ce:
        c = res["cost"]["train"]
        Console().print(
            f"cross-encoder {res['training']['loss']}: {res['training']['steps']} steps, "
            f"{res['training']['pairs']} pairs, {c['cpu_seconds']:.1f} CPU-s "
            f"({c['pairs_per_cpu_second']} pairs per CPU-s, peak RSS {c['peak_rss_mib']} MiB) "
            f"-> {res['model_dir']}\nrerank: treerank evaluate --system "
            f"'{res['rerank_spec']}' --baseline bm25 --k 20",
            highlight=False,
            markup=False,
        )
        return
    table = Table(title=f"finetune {cfg.family} -> {out}", title_justify="left")
    table.add_column("system")
    for m in ("ndcg@10", "mrr@10", "recall@100"):
        table.add_column(m, justify="right")
    for name, metrics in res["systems"].items():
        table.add_row(
            name,
            *(f"{metrics.get(m, float('nan')):.4f}" for m in ("ndcg@10", "mrr@10", "recall@100")),
        )
    Console().print(table)
    t = res["paired_vs_cosine"].get("ndcg@10")
    if t is not None:
        Console().print(
            f"nDCG@10 vs cosine: {t['delta']:+.4f} (95% CI {t['ci_low']:+.4f} .. "
            f"{t['ci_high']:+.4f}, p {t['p']:.4f}); cost {_cost(res['cost']['total'])}",
            highlight=False,
        )


def _cost(c: dict) -> str:
    """``12.3 CPU-s, 15.0 s wall, peak RSS 1,472 MiB`` (this process's, rank 0's under
    torchrun)."""
    return (
        f"{c['cpu_seconds']:.1f} CPU-s, {c['wall_seconds']:.1f} s wall, "
        f"peak RSS {c['peak_rss_mib']:,.0f} MiB"
    )


def register(app: typer.Typer) -> None:
    """Add the ``finetune`` command to ``app``."""
    app.command("finetune")(finetune)
