"""What a diagnostics run is asked to do, as one record: :class:`DiagnosticsSettings`.

The one way to give :func:`treerank.diagnostics.procedure.run_diagnostics` its settings, the
baseline included (as :class:`~treerank.evaluation.settings.EvaluationSettings` is for
``compare_systems``). Each field carries its help text (``metadata["help"]``), from which
``treerank diagnose`` generates its options' defaults and help. Light: it imports no model,
search or torch code, so the CLI can read it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from treerank.evaluation.settings import DEFAULT_BASELINE
from treerank.evaluation.significance import N_PERMUTATIONS
from treerank.kernels.topk import RUN_DEPTH
from treerank.metrics.metrics import DEFAULT_METRICS, HEADLINE_METRIC

__all__ = ["DiagnosticsSettings"]


@dataclass(frozen=True)
class DiagnosticsSettings:
    """Settings of :func:`~treerank.diagnostics.procedure.run_diagnostics` (each field's
    ``metadata["help"]`` says what it is; ``treerank diagnose``'s options are generated from
    it)."""

    baseline: str = field(
        default=DEFAULT_BASELINE,
        metadata={"help": "Comparison system: cosine, bm25, rrf:bm25+cosine, ckpt:<dir>, ..."},
    )
    """A system spec; ``cosine`` needs nothing beyond the store."""
    metric: str = field(
        default=HEADLINE_METRIC,
        metadata={"help": "Metric of the failure analysis and the decision rules."},
    )
    metrics: tuple[str, ...] = field(
        default=DEFAULT_METRICS, metadata={"help": "Metrics computed for every variant / system."}
    )
    k: int = field(default=RUN_DEPTH, metadata={"help": "Run depth (top-k passages per query)."})
    top_n: int = field(
        default=10, metadata={"help": "Top wins / losses profiled in the failure analysis."}
    )
    n_examples: int = field(
        default=5, metadata={"help": "Example queries listed for wins and for losses."}
    )
    probe_seed: int = field(
        default=42, metadata={"help": "The probes' 70/30 split seed (42 = the seed's)."}
    )
    bootstrap_seed: int = field(default=0, metadata={"help": "Seed of the paired bootstrap CIs."})
    n_resamples: int = field(
        default=N_PERMUTATIONS, metadata={"help": "Paired bootstrap resamples."}
    )
    probe_tol: float = field(
        default=0.01, metadata={"help": "Slot probes within this accuracy: no specialisation."}
    )
    cka_high: float = field(
        default=0.8, metadata={"help": "CKA to the frozen embeddings at least this: drift."}
    )
    equal_margin: float = field(
        default=0.01, metadata={"help": "|delta| within this: practically equal."}
    )
    plots: bool = field(default=True, metadata={"help": "Write PNG plots."})
