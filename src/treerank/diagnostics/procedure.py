"""The DRT seed's four-step diagnostic procedure on one checkpoint: :func:`run_diagnostics`.

1. Scoring variants (:mod:`~treerank.diagnostics.variants`), DRT checkpoints only.
2. Probes (:mod:`~treerank.diagnostics.probes`): per DRT slot, the concatenation, the attention
   weights, the model's query vectors and the frozen baseline embeddings.
3. Failures (:mod:`~treerank.diagnostics.failures`): the checkpoint's system against the
   baseline system, per query.
4. Linear CKA (:mod:`~treerank.diagnostics.cka`): each query representation against the frozen
   query embeddings (and against the baseline's own representation when the baseline is another
   dense model).

Steps 2-4 run for any dense checkpoint (linear, mlp, ...): the slot-level rows are simply absent;
step 3 also runs for a forest. The seed's decision rules are evaluated next to the numbers
(:func:`decision_rules`). Output: ``variants.json``, ``probes.json``, ``failures.json``,
``cka.json``, ``diagnostics.json`` (everything) and ``report.md`` with PNG plots
(:mod:`~treerank.diagnostics.report`). Used by ``treerank diagnose`` and ``treerank run``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from treerank.atomic import atomic_write_text
from treerank.diagnostics.cka import linear_cka
from treerank.diagnostics.failures import failure_analysis
from treerank.diagnostics.labels import query_labels
from treerank.diagnostics.probes import run_probes, slot_specialisation
from treerank.diagnostics.settings import DiagnosticsSettings
from treerank.diagnostics.variants import evaluate_variants, l2_normalize
from treerank.encoders.precision import vector_precision
from treerank.evaluation.significance import N_PERMUTATIONS
from treerank.families import CHECKPOINTS
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.lock import writes_dir
from treerank.search.specs import BuildContext, CheckpointSpec, SystemSpec, build_system, parse_spec
from treerank.storelike import StoreLike

if TYPE_CHECKING:
    from treerank.metrics.qrels import Qrels

MAX_REPRESENTATION_FLOATS = 50_000_000
"""Cap on ``n_queries * width`` of a model's query representation in steps 2 and 4 (200 MB);
a forest's match-count features (``2 * M * C`` wide) can exceed it."""
STEP_FILES = {
    "variants": "variants.json",
    "probes": "probes.json",
    "failures": "failures.json",
    "cka": "cka.json",
}


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    *,
    n_resamples: int = N_PERMUTATIONS,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, float]:
    """Mean of ``a - b`` over the queries where both are defined, with a paired bootstrap CI.

    Args:
        a, b: ``float (nq,)`` per-query values (NaN = query left out).
        n_resamples: bootstrap resamples of the queries.
        seed: ``numpy.random.default_rng(seed)``.
        alpha: ``0.05`` gives the 95% percentile interval.

    Returns:
        ``{"mean_a", "mean_b", "delta", "ci_low", "ci_high", "n"}``.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ok = ~(np.isnan(a) | np.isnan(b))
    d = a[ok] - b[ok]
    if d.size == 0:
        nan = float("nan")
        return {"mean_a": nan, "mean_b": nan, "delta": nan, "ci_low": nan, "ci_high": nan, "n": 0}
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for s in range(0, n_resamples, 1000):  # blocks bound memory at 1000 x n
        m = min(1000, n_resamples - s)
        means[s : s + m] = d[rng.integers(0, d.size, size=(m, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return {
        "mean_a": float(a[ok].mean()),
        "mean_b": float(b[ok].mean()),
        "delta": float(d.mean()),
        "ci_low": float(lo),
        "ci_high": float(hi),
        "n": int(d.size),
    }


def to_json(doc: Any) -> Any:
    """``doc`` with NumPy values made plain and non-finite floats made ``None`` (strict JSON)."""
    if isinstance(doc, dict):
        return {str(k): to_json(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [to_json(v) for v in doc]
    if isinstance(doc, np.ndarray):
        return to_json(doc.tolist())
    if isinstance(doc, np.generic):
        doc = doc.item()
    if isinstance(doc, float) and not np.isfinite(doc):
        return None
    if isinstance(doc, Path):
        return str(doc)
    return doc


def _dump(path: Path, doc: Any) -> None:
    atomic_write_text(path, json.dumps(to_json(doc), indent=2, allow_nan=False))


def _run_ids(spec: SystemSpec, store: StoreLike, k: int, device: Device) -> np.ndarray:
    """Top-``k`` ids of a system spec, built by the systems table (``cosine`` L2-normalises
    the stored vectors exactly as the ``cosine`` system of ``treerank evaluate`` does)."""
    ctx = BuildContext(device=device, checkpoints=CHECKPOINTS)  # every family, the forest too
    return np.asarray(build_system(spec, ctx).retrieve(store, k).ids)


def decision_rules(
    results: dict[str, Any],
    *,
    metric: str,
    probe_tol: float = 0.01,
    cka_high: float = 0.8,
    equal_margin: float = 0.01,
) -> list[dict[str, Any]]:
    """The seed's four decision rules evaluated on the results of :func:`run_diagnostics`.

    * concat-cosine == full DRT  ->  the representation, not the scoring function, is the
      bottleneck ("equal": the paired 95% bootstrap CI of the difference contains 0, or the
      difference is within ``equal_margin``, 0.01 of the metric, the seed's 1% read as
      percentage points);
    * learned == uniform alpha   ->  the attention head learned nothing (same test);
    * slot probe accuracies within ``probe_tol`` (1%) of each other  ->  no specialisation
      (with a resolution guard, see :func:`~treerank.diagnostics.probes.slot_specialisation`);
    * CKA(model, frozen embeddings) >= ``cka_high``  ->  drift, not damage.

    Returns:
        One dict per applicable rule: ``{"rule", "numbers", "holds", "conclusion"}``.
    """
    rules: list[dict[str, Any]] = []
    var = results.get("variants")
    if var:
        pairs = var.get("paired", {})
        for other, rule, yes, no_better, no_worse in _EQUALITY_RULES:
            p = pairs.get(other)
            if p is not None:
                rules.append(
                    _equality_rule(p, other, metric, equal_margin, rule, yes, no_better, no_worse)
                )
    probes = results.get("probes")
    if probes and probes.get("specialisation"):
        rules.append(_specialisation_rule(probes["specialisation"], probe_tol))
    cka = results.get("cka")
    if cka and cka.get("model_vs_frozen") is not None:
        v = float(cka["model_vs_frozen"])
        high = bool(v >= cka_high)
        rules.append(
            {
                "rule": f"high CKA (>= {cka_high}) => drift, not damage",
                "numbers": f"linear CKA(model queries, frozen query embeddings) = {v:.3f}",
                "holds": high,
                "conclusion": (
                    "the model kept the frozen geometry (drift, not damage)"
                    if high
                    else "the model re-shaped the query geometry substantially"
                ),
            }
        )
    return rules


_EQUALITY_RULES = (
    (
        "concat-cosine",
        "concat-cosine == full DRT => the representation, not the scoring function, "
        "is the bottleneck",
        "the learned scoring function adds nothing over plain cosine of the slots: the "
        "representation is the bottleneck",
        "full DRT beats concat-cosine: the learned slot weighting carries signal",
        "concat-cosine beats full DRT: the learned scoring function hurts",
    ),
    (
        "uniform",
        "learned == uniform alpha => the attention head learned nothing",
        "learned alpha is indistinguishable from uniform: the attention head learned nothing",
        "learned alpha beats uniform: the attention head learned something useful",
        "uniform beats learned alpha: the attention head learned something harmful",
    ),
)
"""Step 1's two equality rules: (variant, rule, conclusion when equal, when full DRT is
better, when it is worse)."""


def _equality_rule(
    p: dict[str, Any],
    other: str,
    metric: str,
    equal_margin: float,
    rule: str,
    yes: str,
    no_better: str,
    no_worse: str,
) -> dict[str, Any]:
    """A step-1 rule from the paired test ``p`` of full DRT against the variant ``other``:
    equal when the 95% CI contains 0 or ``|delta| <= equal_margin``."""
    in_ci = bool(p["ci_low"] <= 0.0 <= p["ci_high"])
    equal = in_ci or abs(p["delta"]) <= equal_margin
    why = (
        "the 95% CI contains 0"
        if in_ci
        else f"|delta| <= {equal_margin} (practically equal, though the CI excludes 0)"
    )
    return {
        "rule": rule,
        "numbers": (
            f"{metric}: learned {p['mean_a']:.4f} vs {other} {p['mean_b']:.4f}, "
            f"delta {p['delta']:+.4f} (95% CI {p['ci_low']:+.4f} .. "
            f"{p['ci_high']:+.4f}, n={p['n']})"
        ),
        "holds": equal,
        "conclusion": f"{yes} ({why})" if equal else (no_better if p["delta"] > 0 else no_worse),
    }


def _specialisation_rule(spec: dict[str, Any], probe_tol: float) -> dict[str, Any]:
    """Step 2's rule from the probes' per-task specialisation verdicts: it holds (no
    specialisation) when every task's verdict is ``none``."""
    verdicts = {t: str(v["verdict"]) for t, v in spec.items()}
    none = all(v == "none" for v in verdicts.values())
    groups = {
        "specialised": "slots specialise on {}",
        "undetectable": "slots differ by more than the tolerance but within the probe's "
        "noise band on {} (no specialisation this probe set can resolve)",
        "inconclusive": "slots differ beyond the noise band on {} but none is clearly above "
        "the majority baseline (inconclusive)",
    }
    parts = []
    for verdict, text in groups.items():
        tasks = [t for t, v in verdicts.items() if v == verdict]
        if tasks:
            parts.append(text.format(", ".join(tasks)))
    return {
        "rule": f"slots within {probe_tol:.0%} on probes => no specialisation",
        "numbers": "; ".join(
            f"{t}: slot accuracy {s['min']:.3f}..{s['max']:.3f} (spread {s['spread']:.3f}, "
            f"best {s['best_slot']}; majority {s['majority']:.3f}; 95% noise band "
            f"{s['noise_band']:.3f} on {s['n_test']} queries)"
            for t, s in spec.items()
        ),
        "holds": none,
        "conclusion": "no slot specialises on any probed property" if none else "; ".join(parts),
    }


@writes_dir("out_dir", "diagnose")
def run_diagnostics(
    checkpoint_dir: str | Path,
    store: StoreLike,
    out_dir: str | Path,
    *,
    settings: DiagnosticsSettings | None = None,
    probe_stores: Sequence[Any] = (),
    progress: bool = False,
    device: Device = DEFAULT_DEVICE,
) -> dict[str, Any]:
    """Run the four diagnostics of one checkpoint on one store and write the report.

    Args:
        checkpoint_dir: a treerank checkpoint (DRT for all four steps; any dense model for steps
            2-4; a forest for step 3).
        store: the evaluation ``EmbeddingStore`` (its every passage is searched).
        out_dir: where the JSON files, plots and ``report.md`` go (created).
        settings: the :class:`DiagnosticsSettings`, the one way to give every setting: the
            ``baseline`` system spec (``cosine``, ``bm25``, ``ckpt:<dir>``, ...), metric,
            metrics, k, failure-analysis sizes, probe and bootstrap seeds, decision-rule
            thresholds, plots (see its fields); default: the defaults.
        progress: tqdm bars in the DRT variants' search.
        device: where the baseline's, the checkpoint's and every DRT variant's search run.
        probe_stores: more stores embedded with the same encoder (e.g. the train split) whose
            queries join the probes and CKA (steps 2 and 4) for statistical power; steps 1 and 3
            always use ``store`` alone.

    Returns:
        The results as plain JSON types (``diagnostics.json`` holds the same): ``meta``,
        ``baseline``, ``model``, ``variants`` (or None), ``probes``, ``failures``, ``cka``,
        ``rules``, ``files``.

    Raises:
        FileNotFoundError / EncoderMismatchError / UnknownModelClassError: see
            :func:`treerank.families.load_model`.
        ValueError: ``metric`` not in ``metrics``, or a bad ``baseline`` spec (both before
            any work).
    """
    from treerank.metrics.metrics import evaluate_run
    from treerank.metrics.qrels import Qrels
    from treerank.models.base import SlotScorer

    cfg = settings or DiagnosticsSettings()
    baseline, metric, metrics, k = cfg.baseline, cfg.metric, tuple(cfg.metrics), cfg.k
    if metric not in metrics:
        raise ValueError(f"metric {metric!r} must be one of metrics {list(metrics)}")
    baseline_spec = parse_spec(baseline)  # a bad spec fails before any work
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = CHECKPOINTS.load(checkpoint_dir, store.encoder_fingerprint, vector_precision(store))
    is_drt = isinstance(model, SlotScorer)  # slot-level steps for any slot model (DRT)
    model_name = str(getattr(model, "name", "model"))
    qrels = Qrels.from_store(store)
    texts = _query_texts(store)
    labels = query_labels(texts, _query_types(store))
    rep_stores = [store, *probe_stores]  # queries of steps 2 and 4
    all_types, probe_labels, qx = _probe_queries(store, rep_stores)
    timings: dict[str, float] = {}

    # --- the two systems' per-query metrics -------------------------------------------------
    t = time.perf_counter()
    base_res = evaluate_run(_run_ids(baseline_spec, store, k, device), qrels, metrics=metrics)
    timings["baseline_run"] = time.perf_counter() - t

    results: dict[str, Any] = {
        "meta": _meta(checkpoint_dir, model, model_name, store, cfg),
        "baseline": {"mean": {m: float(base_res.mean[m]) for m in metrics}},
        "variants": None,
    }
    if is_drt:
        results["meta"]["drt"] = {"k": model.config.k, "slot_dim": model.config.slot_dim}

    # --- step 1: scoring variants (slot models) or the model's own run ----------------------
    t = time.perf_counter()
    results["variants"], model_pq = _step1_variants(
        model, checkpoint_dir, store, qrels, base_res.per_query, cfg, progress, device, out
    )
    results["model"] = {
        "mean": {m: float(np.nanmean(model_pq[m])) for m in metrics},
        "vs_baseline": paired_bootstrap(
            model_pq[metric],
            base_res.per_query[metric],
            n_resamples=cfg.n_resamples,
            seed=cfg.bootstrap_seed,
        ),
    }
    if is_drt:
        timings["variants"] = time.perf_counter() - t

    # --- query representations for steps 2 and 4 -----------------------------------------------
    reps, slot_names, results["meta"]["notes"] = _query_representations(model, qx, model_name)

    # --- step 2: probes -----------------------------------------------------------------------
    t = time.perf_counter()
    results["probes"] = _step2_probes(
        reps, slot_names, probe_labels, rep_stores, all_types, cfg.probe_seed, cfg.probe_tol
    )
    timings["probes"] = time.perf_counter() - t

    # --- step 3: failures ---------------------------------------------------------------------
    results["failures"] = failure_analysis(
        model_pq[metric],
        base_res.per_query[metric],
        texts,
        query_types=labels["query_type"],
        query_ids=store.query_ids(),
        groups={"entity": labels["entity"]},
        top_n=cfg.top_n,
        n_examples=cfg.n_examples,
        name_a=model_name,
        name_b=baseline,
        metric=metric,
    )

    # --- step 4: CKA --------------------------------------------------------------------------
    results["cka"] = _step4_cka(reps, qx, model_name, slot_names, baseline_spec, store)

    results["rules"] = decision_rules(
        results,
        metric=metric,
        probe_tol=cfg.probe_tol,
        cka_high=cfg.cka_high,
        equal_margin=cfg.equal_margin,
    )
    timings["total"] = time.perf_counter() - t0
    results["meta"]["seconds"] = {k_: round(v, 3) for k_, v in timings.items()}

    _write(results, out, cfg.plots)
    return to_json(results)  # plain JSON types, NaN -> None, as in diagnostics.json


def _query_texts(store: StoreLike) -> list[str]:
    """Query texts, or empty strings for a store without text tables (Go-tool stores): the
    text-based probe labels then have one class and those probes are skipped."""
    if getattr(store, "has_texts", True):
        return list(store.query_texts())
    return [""] * int(store.n_queries)


def _query_types(store: StoreLike) -> list[str] | None:
    return store.query_types() if getattr(store, "has_texts", True) else None


def _count(values: Sequence[str]) -> dict[str, int]:
    c: dict[str, int] = {}
    for v in values:
        c[v] = c.get(v, 0) + 1
    return c


def _step1_variants(
    model: object,
    checkpoint_dir: str | Path,
    store: StoreLike,
    qrels: Qrels,
    base_per_query: dict[str, np.ndarray],
    cfg: DiagnosticsSettings,
    progress: bool,
    device: Device,
    out: Path,
) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """Step 1: a slot model's scoring variants, each paired against the learned scoring and
    against the baseline (``variants_per_query.npz`` written beside the report), or, for any
    other model, its own run through the systems registry (written nowhere).

    Returns ``(variants, model_per_query)``: ``variants`` is None for a model without slots;
    ``model_per_query`` maps each metric to the model's per-query values, shape ``(n_q,)``.
    """
    from treerank.metrics.metrics import evaluate_run
    from treerank.models.base import SlotScorer

    metric, metrics, k, seed = cfg.metric, tuple(cfg.metrics), cfg.k, cfg.bootstrap_seed
    if not isinstance(model, SlotScorer):  # the systems registry picks the search
        run = _run_ids(CheckpointSpec(Path(checkpoint_dir)), store, k, device)
        return None, evaluate_run(run, qrels, metrics=metrics).per_query
    var = evaluate_variants(
        model, store, k=k, metrics=metrics, qrels=qrels, progress=progress, device=device
    )
    per_query = var.pop("per_query")
    learned = per_query["learned"][metric]
    var["paired"] = {
        name: paired_bootstrap(learned, pq[metric], n_resamples=cfg.n_resamples, seed=seed)
        for name, pq in per_query.items()
        if name != "learned"
    }
    var["vs_baseline"] = {
        name: paired_bootstrap(
            pq[metric], base_per_query[metric], n_resamples=cfg.n_resamples, seed=seed
        )
        for name, pq in per_query.items()
    }
    np.savez_compressed(
        out / "variants_per_query.npz",
        **{f"{n}/{m}": v for n, pq in per_query.items() for m, v in pq.items()},
    )
    return var, per_query["learned"]


def _query_representations(
    model: object, qx: np.ndarray, model_name: str
) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """The query representations steps 2 and 4 probe and compare: a slot model's unit slots
    (``slot-<i>``, each ``(n_q, slot_dim)``), their concatenation and its slot weights
    (``alpha``), a dense model's own query vectors (left out, with a note, when wider than
    ``MAX_REPRESENTATION_FLOATS`` allows), and the frozen vectors ``qx``, float32 ``(n_q, d)``.

    Returns ``(reps, slot_names, notes)``.
    """
    from treerank.models.base import DenseScorer, SlotScorer

    reps: dict[str, np.ndarray] = {}
    slot_names: list[str] = []
    if isinstance(model, SlotScorer):
        q_slots = l2_normalize(model.query_raw_slots(qx))
        for i in range(model.config.k):
            reps[f"slot-{i}"] = q_slots[:, i]
            slot_names.append(f"slot-{i}")
        reps["concat"] = q_slots.reshape(q_slots.shape[0], -1)
        reps["alpha"] = model.query_alpha(qx)
    notes: list[str] = []
    if isinstance(model, DenseScorer):
        width = int(model.encode_queries(qx[:1]).shape[1])
        if width * qx.shape[0] <= MAX_REPRESENTATION_FLOATS:
            reps[model_name] = model.encode_queries(qx)
        else:
            notes.append(
                f"{model_name}'s query representation ({width} dims) is too wide for probes and "
                f"CKA on {qx.shape[0]} queries; left out"
            )
    reps["frozen"] = qx
    return reps, slot_names, notes


def _step2_probes(
    reps: dict[str, np.ndarray],
    slot_names: list[str],
    probe_labels: dict[str, Any],
    rep_stores: Sequence[StoreLike],
    all_types: list[list[str] | None],
    probe_seed: int,
    probe_tol: float,
) -> dict[str, Any]:
    """Step 2: linear probes of every representation for each label task, and which slots
    specialise (a slot beating the concatenation by more than ``probe_tol``)."""
    probe_results = run_probes(reps, probe_labels, seed=probe_seed)
    return {
        "seed": probe_seed,
        "queries": {str(getattr(s_, "path", "")): int(s_.n_queries) for s_ in rep_stores},
        "labels": {task: dict(sorted(_count(v).items())) for task, v in probe_labels.items()},
        "label_source": {
            "query_type": "store query_type" if all(all_types) else "factoid regex",
            "entity": "entity-bearing heuristic",
            "length": "word-count bucket",
        },
        "results": [r.to_dict() for r in probe_results],
        "specialisation": slot_specialisation(probe_results, slot_names, tol=probe_tol),
    }


def _step4_cka(
    reps: dict[str, np.ndarray],
    qx: np.ndarray,
    model_name: str,
    slot_names: list[str],
    baseline_spec: SystemSpec,
    store: StoreLike,
) -> dict[str, Any]:
    """Step 4: linear CKA (Kornblith et al. 2019) of every representation against the frozen
    query vectors, against a dense checkpoint baseline's query vectors, and slot against slot."""
    from treerank.models.base import DenseScorer

    cka: dict[str, Any] = {"reference": "frozen query embeddings", "vs_frozen": {}}
    for name, x in reps.items():
        if name != "frozen":
            cka["vs_frozen"][name] = linear_cka(x, qx)
    cka["model_vs_frozen"] = cka["vs_frozen"].get(model_name)
    if isinstance(baseline_spec, CheckpointSpec):
        other = CHECKPOINTS.load(
            baseline_spec.path, store.encoder_fingerprint, vector_precision(store)
        )
        if isinstance(other, DenseScorer):
            bq = other.encode_queries(qx)
            cka["vs_baseline"] = {n: linear_cka(x, bq) for n, x in reps.items()}
    if slot_names:
        slots = [reps[s] for s in slot_names]
        cka["slot_vs_slot"] = [[linear_cka(a, b) for b in slots] for a in slots]
    return cka


def _meta(
    checkpoint_dir: str | Path,
    model: object,
    model_name: str,
    store: StoreLike,
    cfg: DiagnosticsSettings,
) -> dict[str, Any]:
    """``diagnostics.json``'s ``meta``: what was diagnosed, on which store, with which settings."""
    meta = {
        "checkpoint": str(checkpoint_dir),
        "model_type": getattr(model, "model_type", type(model).__name__),
        "model_name": model_name,
        "store": str(getattr(store, "path", "")),
        "split": getattr(store, "split", ""),
        "n_queries": int(store.n_queries),
        "n_passages": int(store.n_passages),
        "encoder": store.encoder_name,
        "encoder_fingerprint": store.encoder_fingerprint,
        "baseline": cfg.baseline,
        "metric": cfg.metric,
        "metrics": list(cfg.metrics),
        "k": cfg.k,
        "probe_seed": cfg.probe_seed,
        "bootstrap_seed": cfg.bootstrap_seed,
        "n_resamples": cfg.n_resamples,
    }
    return meta


def _probe_queries(
    store: StoreLike, rep_stores: Sequence[StoreLike]
) -> tuple[list[list[str] | None], dict[str, Any], np.ndarray]:
    """The queries steps 2 and 4 read: the evaluation store's, then each probe store's.

    Returns ``(query_types per store, probe labels per task, frozen query vectors)``, the
    vectors float32 ``(sum of n_queries, d)``.

    Raises:
        ValueError: a probe store embedded with another encoder than ``store``.
    """
    for ps in rep_stores[1:]:
        if ps.encoder_fingerprint != store.encoder_fingerprint:
            raise ValueError(
                f"probe store {getattr(ps, 'path', ps)} was embedded with another encoder "
                f"({str(ps.encoder_fingerprint)[:12]} vs {str(store.encoder_fingerprint)[:12]})"
            )
    all_types: list[list[str] | None] = [_query_types(s_) for s_ in rep_stores]
    probe_types: list[str] | None = None
    if all(all_types):
        probe_types = [t for ts in all_types for t in (ts or [])]
    probe_labels = query_labels([t for s_ in rep_stores for t in _query_texts(s_)], probe_types)
    qx = np.concatenate([np.asarray(s_.queries, dtype=np.float32) for s_ in rep_stores])
    return all_types, probe_labels, qx


def _write(results: dict[str, Any], out: Path, plots: bool) -> None:
    """Each step's JSON file (with ``meta``), the report and its plots, then
    ``diagnostics.json`` (which lists the files under ``files``)."""
    from treerank.diagnostics.report import write_report

    files: dict[str, str] = {}
    for step, fname in STEP_FILES.items():
        if results.get(step) is not None:
            _dump(out / fname, {"meta": results["meta"], step: results[step]})
            files[step] = fname
    files.update(write_report(results, out, plots=plots))
    results["files"] = files
    _dump(out / "diagnostics.json", results)
