"""``treerank evaluate``: run systems on a store split against all its passages and compare."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from treerank.cli.errors import ExitCode, exit_on_disk_full, fail
from treerank.cli.options import cli_device, device_option, field_option, overwrite_option
from treerank.cli.spec_help import SEE_KINDS, RegistryHelpCommand
from treerank.evaluation.settings import EvaluationSettings
from treerank.lock import LockHeldError
from treerank.store.format import StoreRootError

if TYPE_CHECKING:
    from rich.console import Console

    from treerank.store import EmbeddingStore
    from treerank.tasks.evaluate import Evaluation


def evaluate(
    store: Path = typer.Option(
        ..., "--store", "-s", help="Store split directory (e.g. stores/scifact/test)."
    ),
    split: str | None = typer.Option(
        None, "--split", help="Split under --store when --store is a store root (e.g. test)."
    ),
    systems: list[str] = typer.Option(
        ["cosine", "bm25"],
        "--system",
        metavar="SPEC",
        help=f"System spec, repeatable; {SEE_KINDS}.",
    ),
    # a settings field's option: default and help from EvaluationSettings's fields
    baseline: str = field_option(EvaluationSettings, "baseline", "--baseline", "-b"),
    second_baseline: str | None = field_option(
        EvaluationSettings, "second_baseline", "--second-baseline"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Write results.json, per_query.jsonl, runs/, plots/, table.md here (and "
        "overlap.json, the seen / unseen breakdown, when there is a training split).",
    ),
    k: int = field_option(EvaluationSettings, "k", "--k"),
    metrics: list[str] = typer.Option(
        [],
        "--metric",
        "-m",
        metavar="METRIC",
        help="Metric, repeatable (mrr@k, ndcg@k, recall@k, success@k, precision@k); a cutoff "
        "deeper than --k is refused. Default: mrr@10, ndcg@10, recall@100, recall@1000 "
        "(those no deeper than --k).",
    ),
    threshold: int | None = field_option(
        EvaluationSettings, "relevance_threshold", "--relevance-threshold"
    ),
    gain: str = field_option(EvaluationSettings, "gain", "--ndcg-gain"),
    permutations: int = field_option(EvaluationSettings, "n_permutations", "--permutations"),
    seed: int = field_option(EvaluationSettings, "seed", "--seed"),
    sample_queries: int | None = field_option(
        EvaluationSettings, "sample_queries", "--sample-queries", metavar="N"
    ),
    sample_seed: int = field_option(EvaluationSettings, "sample_seed", "--sample-seed"),
    train_store: Path | None = typer.Option(
        None,
        "--train-store",
        help="Training split store (e.g. stores/scifact/train): adds metrics on the queries "
        "with and without a training positive (memorisation check). Default: a sibling train/ "
        "of the evaluated split, when there is one.",
    ),
    overlap: bool = typer.Option(
        True,
        "--overlap/--no-overlap",
        help="Split queries by whether a relevant passage was a training positive.",
    ),
    dim: int | None = typer.Option(
        None, "--dim", help="Vector dimension (only for Go-tool stores without meta.json)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    device: str = device_option(),
    overwrite: bool = overwrite_option(),
    ignore_identical_ids: bool = field_option(
        EvaluationSettings, "ignore_identical_ids", "--ignore-identical-ids"
    ),
) -> None:
    """Evaluate systems on every passage of a split; print and write a comparison table."""
    from rich.console import Console

    from treerank.atomic import refuse_existing_output
    from treerank.kernels.topk import check_run_depth
    from treerank.store import EmbeddingStore
    from treerank.tasks.evaluate import evaluate as evaluate_task

    dev = cli_device(device)  # a bad or unavailable device is refused before any work
    console = Console(soft_wrap=True)
    advice = "files written before keep their earlier version; free space, then rerun"
    with exit_on_disk_full(advice):
        try:
            settings = EvaluationSettings(
                baseline=baseline,
                second_baseline=second_baseline,
                k=k,
                metrics=tuple(metrics),
                n_permutations=permutations,
                seed=seed,
                gain=gain,
                relevance_threshold=threshold,
                ignore_identical_ids=ignore_identical_ids,
                sample_queries=sample_queries,
                sample_seed=sample_seed,
            )
            if out is not None:
                refuse_existing_output(out, overwrite, "earlier evaluation results")
            check_run_depth(k)
            eval_dir = store / split if split else store
            st = EmbeddingStore.open(eval_dir, dim=dim)
            done = evaluate_task(
                st,
                systems,
                settings,
                metrics_given=bool(metrics),
                train_store=train_store,
                train_dim=dim,
                overlap=overlap,
                out_dir=out,
                progress=progress,
                device=dev,
            )
            main = done.main
        except StoreRootError as exc:
            raise fail(exc.advice("--split")) from None
        except (ValueError, FileNotFoundError, KeyError, LockHeldError) as exc:
            raise fail(exc) from None
    if main:
        _print_comparison(console, done, st, settings, out)


def _print_comparison(
    console: Console,
    done: Evaluation,
    st: EmbeddingStore,
    settings: EvaluationSettings,
    out: Path | None,
) -> None:
    """Print the finished comparison (tables, notes, warnings, the seen / unseen breakdown, the
    summary, the files written) on the main process.

    Raises:
        typer.Exit: ``ExitCode.FAILED`` when a system failed or none produced results.
    """
    from treerank.evaluation.compare import untrained_note
    from treerank.evaluation.overlap import overlap_markdown
    from treerank.evaluation.plots import dataset_label
    from treerank.evaluation.summary import headline as summary_lines
    from treerank.metrics.metrics import headline_metric

    plan, comp = done.plan, done.comparison
    train_dir = plan.train_dir
    k, baseline, second_baseline = settings.k, settings.baseline, settings.second_baseline
    permutations, seed = settings.n_permutations, settings.seed
    if plan.dropped_metrics:
        console.print(f"note: {', '.join(plan.dropped_metrics)} left out (deeper than --k {k})")
    for name, err in comp.failed.items():
        console.print(f"system {name} failed: {err}", markup=False, style="red", soft_wrap=True)
    for name in comp.untrained:
        console.print(f"warning: {untrained_note(name)}", markup=False, style="yellow")
    for leak in comp.leaks.values():
        console.print(f"warning: train/test leak: {leak['message']}", markup=False, style="yellow")
    if not comp.results:
        raise typer.Exit(ExitCode.FAILED)
    if baseline in comp.results:
        console.print(comp.rich())
    if second_baseline in comp.results:
        console.print(comp.rich(second_baseline))
    first = comp.results.get(baseline) or next(iter(comp.results.values()))
    console.print(
        f"{first.n_evaluated} queries evaluated, {first.n_left_out} left out "
        "(no relevant passage); "
        f"{st.n_passages:,} passages; relevance threshold {first.relevance_threshold}; "
        f"p: paired randomization test ({permutations} permutations, seed {seed})"
    )
    sample = comp.settings.get("sample")
    if sample:
        console.print(
            f"a seeded query sample: {sample['queries']:,} of {sample['of_queries']:,} queries "
            f"(--sample-seed {sample['seed']}), the same for every system"
        )
    for b, by_sys in comp.mcnemar.items():
        for s, r in by_sys.items():
            console.print(r.describe(s, b), markup=False, highlight=False, soft_wrap=True)
    if any(comp.departures.values()):
        console.print(
            "departures from the source: "
            + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in comp.departures.items())
        )
    headline = headline_metric(comp.metrics)
    if comp.overlap is not None:
        caveat = "; a trained model's gain on the first group can be memorised citations"
        console.print(
            f"\nSeen vs unseen positives (training split {train_dir}"
            f"{caveat if comp.trained else ''}):\n",
            markup=False,
        )
        console.print(overlap_markdown(comp.overlap, headline, baseline).strip())
        for name, where in comp.trained_on.items():
            if train_dir is None or not where.get("store"):
                continue
            if Path(str(where["store"])).resolve() != Path(train_dir).resolve():
                console.print(
                    f"note: {name} trained on {where['store']} (split {where['split']}), not on "
                    f"the training split {train_dir} of this breakdown",
                    markup=False,
                )
    doc = comp.to_dict()
    lines = summary_lines(dataset_label(st.path, st.split), doc, headline, baseline)
    if lines:
        console.print("\nSummary:", markup=False)
        for line in lines:
            console.print(line.replace("**", "").replace("`", ""), markup=False)
    if out is not None:
        extra = ", overlap.json" if comp.overlap is not None else ""
        console.print(f"wrote {out}/results.json, per_query.jsonl, table.md{extra}, runs/, plots/")
        for f in comp.removed_stale:
            console.print(f"removed {out / f} (left by an earlier comparison)", markup=False)
        for f in comp.kept_unknown:
            console.print(f"left {out / f} alone (not written by treerank)", markup=False)
    if comp.failed:
        raise typer.Exit(ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    """Add the ``evaluate`` command to the ``treerank`` app."""
    app.command(
        "evaluate",
        help="Evaluate systems against all passages of a store split.",
        cls=RegistryHelpCommand,
    )(evaluate)
