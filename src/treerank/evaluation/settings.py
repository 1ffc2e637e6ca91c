"""What an evaluation is asked to do, as one record, and the decisions made before it runs.

:class:`EvaluationSettings` holds every setting of :func:`treerank.evaluation.compare.
compare_systems` that is not a store, a system or an output folder; each field carries its help
text (``dataclasses.fields(EvaluationSettings)[i].metadata["help"]``). :func:`resolve_evaluation`
is the library behind ``treerank evaluate`` (and the pipeline's evaluation stage): it puts the
baseline among the systems, drops the default metrics deeper than the run depth, and finds the
sibling training split for the seen / unseen breakdown, so the command only parses and prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TypedDict, Unpack

from treerank.evaluation.checks import too_deep
from treerank.evaluation.overlap import find_train_store
from treerank.evaluation.significance import N_PERMUTATIONS
from treerank.kernels.topk import RUN_DEPTH
from treerank.metrics.metrics import DEFAULT_METRICS

__all__ = ["EvaluationPlan", "EvaluationSettings", "resolve_evaluation"]


DEFAULT_BASELINE = "cosine"
"""The system every other one is tested against unless a baseline is given."""


class SettingsChanges(TypedDict, total=False):
    """The fields of :class:`EvaluationSettings` that :meth:`EvaluationSettings.with_` changes."""

    baseline: str
    second_baseline: str | None
    k: int
    metrics: tuple[str, ...]
    n_permutations: int
    seed: int
    gain: str
    relevance_threshold: int | None
    ignore_identical_ids: bool
    sample_queries: int | None
    sample_seed: int


@dataclass(frozen=True)
class EvaluationSettings:
    """Settings of one comparison (see :func:`~treerank.evaluation.compare.compare_systems`)."""

    baseline: str = field(
        default=DEFAULT_BASELINE, metadata={"help": "System the others are tested against."}
    )
    second_baseline: str | None = field(
        default=None, metadata={"help": "Also test every system against this one."}
    )
    k: int = field(
        default=RUN_DEPTH,
        metadata={"help": "Run depth: passages retrieved per query (at least 1)."},
    )
    metrics: tuple[str, ...] = field(
        default=DEFAULT_METRICS, metadata={"help": "Table metrics, e.g. mrr@10, ndcg@10."}
    )
    n_permutations: int = field(
        default=N_PERMUTATIONS,
        metadata={"help": "Randomization-test permutations and bootstrap resamples."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the significance tests."})
    gain: str = field(
        default="linear", metadata={"help": "nDCG gain: linear (trec_eval) or exp (2^g - 1)."}
    )
    relevance_threshold: int | None = field(
        default=None,
        metadata={"help": "Grade counted as relevant for MRR/Recall (default: the store's)."},
    )
    ignore_identical_ids: bool = field(
        default=False,
        metadata={
            "help": "Drop a retrieved document whose id is the query's id (BEIR's option for "
            "ArguAna / Quora, where queries are also corpus documents)."
        },
    )
    sample_queries: int | None = field(
        default=None,
        metadata={
            "help": "Evaluate a seeded sample of this many queries (among those with a "
            "relevant passage), the same for every system, against every passage (default: "
            "all queries); recorded in results.json."
        },
    )
    sample_seed: int = field(default=0, metadata={"help": "Seed of the query sample."})

    def __post_init__(self) -> None:
        if self.sample_queries is not None and (
            isinstance(self.sample_queries, bool)
            or not isinstance(self.sample_queries, int)
            or self.sample_queries < 1
        ):
            raise ValueError(
                f"the query sample (--sample-queries) must be a whole number >= 1, got "
                f"{self.sample_queries!r}"
            )
        if isinstance(self.n_permutations, bool) or not isinstance(self.n_permutations, int):
            raise ValueError(
                f"the number of permutations (--permutations) must be an integer, got "
                f"{self.n_permutations!r}"
            )
        if self.n_permutations < 1:
            raise ValueError(
                "the number of permutations (--permutations) must be at least 1 (the paired "
                f"randomization test and the bootstrap need resamples), got {self.n_permutations}"
            )

    @property
    def baselines(self) -> tuple[str, ...]:
        """The baseline, then the second baseline when there is one."""
        return (self.baseline,) + ((self.second_baseline,) if self.second_baseline else ())

    def with_(self, **changes: Unpack[SettingsChanges]) -> EvaluationSettings:
        """A copy with ``changes`` applied.

        Raises:
            TypeError: a key that is not a field (the message lists the fields).
        """
        names = {f.name for f in fields(self)}
        bad = sorted(set(changes) - names)
        if bad:
            raise TypeError(
                f"unknown evaluation setting(s) {', '.join(bad)}; known: {', '.join(sorted(names))}"
            )
        if "metrics" in changes:
            changes["metrics"] = tuple(changes["metrics"])
        return replace(self, **changes)


@dataclass(frozen=True)
class EvaluationPlan:
    """What :func:`resolve_evaluation` decided.

    Attributes:
        systems: the system specs, the baseline (and second baseline) first when missing.
        settings: the settings with the metrics actually evaluated.
        dropped_metrics: default metrics left out because their cutoff is deeper than ``k``.
        train_dir: the training split for the seen / unseen breakdown (None: no breakdown).
    """

    systems: tuple[str, ...]
    settings: EvaluationSettings
    dropped_metrics: tuple[str, ...] = ()
    train_dir: Path | None = None


def resolve_evaluation(
    eval_dir: str | Path,
    systems: Sequence[str],
    settings: EvaluationSettings,
    *,
    n_passages: int,
    metrics_given: bool = True,
    train_store: str | Path | None = None,
    overlap: bool = True,
) -> EvaluationPlan:
    """The decisions made before an evaluation runs (the library behind ``treerank evaluate``).

    Args:
        eval_dir: the evaluated store split's directory.
        systems: system specs as given.
        settings: the evaluation settings as given.
        n_passages: passages in the split (a run that ranks all of them serves every cutoff).
        metrics_given: False when the user named no metric: the defaults are used, less those
            deeper than ``settings.k`` (listed in ``dropped_metrics``); True: the metrics are
            kept as they are (a cutoff deeper than ``k`` is refused later by ``compare_systems``).
        train_store: the training split to compare against; None: the sibling ``train/`` of
            ``eval_dir`` when there is one (:func:`~treerank.evaluation.overlap.find_train_store`).
        overlap: False: no seen / unseen breakdown (``train_dir`` is None).

    Returns:
        The :class:`EvaluationPlan`.

    Raises:
        ValueError: no metric named and ``k`` below the cutoff of every default metric.
    """
    names = list(systems)
    for b in reversed(settings.baselines):
        if b not in names:
            names.insert(0, b)
    dropped: list[str] = []
    if not metrics_given:
        dropped = too_deep(settings.k, DEFAULT_METRICS, n_passages)
        kept = [m for m in DEFAULT_METRICS if m not in dropped]
        if not kept:
            raise ValueError(
                f"--k {settings.k} is below the cutoff of every default metric "
                f"({', '.join(DEFAULT_METRICS)}): raise --k or pass --metric with a "
                f"cutoff <= {settings.k}"
            )
        settings = settings.with_(metrics=tuple(kept))
    train_dir = None
    if overlap:
        train_dir = Path(train_store) if train_store is not None else find_train_store(eval_dir)
    return EvaluationPlan(tuple(names), settings, tuple(dropped), train_dir)
