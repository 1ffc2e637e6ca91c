"""``evaluate``: the one library call behind ``treerank evaluate`` and the ``evaluate:`` stage.

Both hand it the same typed :class:`~treerank.evaluation.settings.EvaluationSettings`; it makes
the decisions before the comparison with
:func:`~treerank.evaluation.settings.resolve_evaluation` (default metrics deeper than ``k``
left out when none was named, the baselines put first, the seen / unseen training split found)
and then runs :func:`~treerank.evaluation.compare.compare_systems` under
:func:`~treerank.distributed.context.launch`: under ``torchrun`` every rank searches a
contiguous passage shard and only rank 0 writes ``out_dir``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from treerank.distributed.context import launch
from treerank.evaluation.compare import Comparison, compare_systems
from treerank.evaluation.settings import EvaluationPlan, EvaluationSettings, resolve_evaluation
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.search.systems import System
from treerank.store import EmbeddingStore

__all__ = ["Evaluation", "evaluate"]


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` produced.

    Attributes:
        plan: :func:`~treerank.evaluation.settings.resolve_evaluation`'s decisions (the
            settings actually evaluated, the metrics left out, the training split).
        comparison: the :class:`~treerank.evaluation.compare.Comparison` (on every rank).
        main: this process writes (rank 0 under ``torchrun``, or a single process).
    """

    plan: EvaluationPlan
    comparison: Comparison
    main: bool


def evaluate(
    store: EmbeddingStore,
    systems: Sequence[str] | Mapping[str, System],
    settings: EvaluationSettings,
    *,
    metrics_given: bool,
    train_store: str | Path | None = None,
    train_dim: int | None = None,
    overlap: bool = True,
    out_dir: str | Path | None = None,
    progress: bool = True,
    seed_groups: Mapping[str, Mapping[str, int]] | None = None,
    device: Device = DEFAULT_DEVICE,
) -> Evaluation:
    """Compare ``systems`` on every passage of the split ``store``.

    Args:
        store: the evaluated split.
        systems: system specs as given (``--system``; the baselines are added first when
            missing), or name -> built :class:`~treerank.search.systems.System` (the pipeline,
            which builds a trained run's system from its train stage's checkpoint; the
            baselines are among them).
        settings: the evaluation settings as given.
        metrics_given: False when no metric was named: the default metrics deeper than
            ``settings.k`` are left out (``plan.dropped_metrics``).
        train_store: the training split of the seen / unseen breakdown (None: the sibling
            ``train/`` of the evaluated split when there is one); ``train_dim``: its vector
            dimension for a Go-tool store without ``meta.json``.
        overlap: False: no seen / unseen breakdown.
        out_dir: where rank 0 writes the results (None: nothing is written).
        progress: progress bars (rank 0 only). seed_groups: see ``compare_systems``.
        device: where systems encode and score (a parsed ``Device``).

    Returns:
        The :class:`Evaluation`.

    Raises:
        ValueError: no metric named and ``k`` below every default metric's cutoff, a metric
            deeper than ``k``, a bad system spec (``compare_systems``).
        FileNotFoundError / StoreFormatError: the training split cannot be opened.
    """
    plan = resolve_evaluation(
        store.path,
        list(systems),
        settings,
        n_passages=int(store.n_passages),
        metrics_given=metrics_given,
        train_store=train_store,
        overlap=overlap,
    )
    train = None if plan.train_dir is None else EmbeddingStore.open(plan.train_dir, dim=train_dim)
    compared: Sequence[str] | Mapping[str, System] = (
        systems if isinstance(systems, Mapping) else list(plan.systems)
    )
    with launch() as dist:
        main = dist is None or dist.is_main
        comp = compare_systems(
            store,
            compared,
            settings=plan.settings,
            out_dir=out_dir if main else None,
            progress=progress and main,
            train_store=train,
            seed_groups=seed_groups,
            device=device,
            shard=dist,
        )
    return Evaluation(plan, comp, main)
