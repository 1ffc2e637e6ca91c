"""The diagnostics report: Markdown with tables, the seed's decision rules and PNG plots.

Pure rendering of the results dict built by :func:`treerank.diagnostics.procedure.run_diagnostics`
(nothing is computed here beyond formatting). Plots use matplotlib's Agg backend and are written
atomically; so is ``report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_savefig, atomic_write_text

REPORT_FILE = "report.md"


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if np.isnan(v) else f"{v:.{nd}f}"
    return str(v)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _where(results: dict[str, Any]) -> str:
    """``"scifact/test: "``: the dataset and split a diagnostics plot is about (its title)."""
    meta = results.get("meta") or {}
    store = Path(str(meta.get("store") or ""))
    split = meta.get("split") or store.name
    data = store.parent.name if store.name == split else store.name
    label = "/".join(x for x in (data, split) if x)
    return f"{label}: " if label else ""


def plot_variants(results: dict[str, Any], path: Path) -> Path:
    """Bar chart of every scoring variant's mean ``metric`` (baseline drawn as a line)."""
    plt = _plt()
    metric = results["meta"]["metric"]
    var = results["variants"]["variants"]
    names = list(var)
    vals = [var[n]["mean"][metric] for n in names]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(names)), 4))
    ax.bar(names, vals, color=["C1" if n == "learned" else "C0" for n in names])
    ax.axhline(
        results["baseline"]["mean"][metric], color="k", ls="--", label=results["meta"]["baseline"]
    )
    ax.set_ylabel(metric)
    ax.set_title(f"{_where(results)}DRT scoring variants (no retraining)")
    ax.tick_params(axis="x", rotation=45)
    # outside the axes: a legend inside covered the top of a bar
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100, bbox_inches="tight")
    return path


def plot_probes(results: dict[str, Any], path: Path) -> Path:
    """Grouped bars: probe accuracy per representation, one group per task, majority as ticks."""
    plt = _plt()
    rs = [r for r in results["probes"]["results"] if r.get("skipped") is None]
    tasks = list(dict.fromkeys(r["task"] for r in rs))
    reps = list(dict.fromkeys(r["representation"] for r in rs))
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(tasks) * max(1, len(reps)) * 0.35), 4))
    width = 0.8 / max(1, len(reps))
    for j, rep in enumerate(reps):
        xs, ys = [], []
        for i, task in enumerate(tasks):
            hit = [r for r in rs if r["task"] == task and r["representation"] == rep]
            if hit:
                xs.append(i + j * width)
                ys.append(hit[0]["accuracy"])
        ax.bar(xs, ys, width, label=rep)
    for i, task in enumerate(tasks):
        maj = next(r["majority"] for r in rs if r["task"] == task)
        ax.hlines(maj, i - width / 2, i + 0.8 - width / 2, colors="k", linestyles="--")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks)
    ax.set_ylabel("held-out accuracy (dashed: majority)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{_where(results)}linear probes per representation")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100, bbox_inches="tight")
    return path


def plot_failures(results: dict[str, Any], path: Path) -> Path:
    """Sorted per-query delta of the metric (model minus baseline)."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    f = results["failures"]
    s = f["summary"]
    d = np.array([x for x in f["delta"] if x is not None], dtype=np.float64)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(np.sort(d)[::-1], drawstyle="steps-mid")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("queries, sorted by delta")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # query positions: whole numbers
    ax.set_ylabel(f"delta {f['metric']}")
    ax.set_title(
        f"{_where(results)}{f['system_a']} - {f['system_b']}: {s['wins']} wins, "
        f"{s['losses']} losses, {s['ties']} ties"
    )
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    return path


def plot_cka(results: dict[str, Any], path: Path) -> Path:
    """Bars of linear CKA of each query representation against the frozen embeddings."""
    plt = _plt()
    c = results["cka"]["vs_frozen"]
    names = list(c)
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(names)), 3.5))
    ax.bar(names, [c[n] if c[n] is not None else 0.0 for n in names])
    ax.set_ylim(0, 1)
    ax.set_ylabel("linear CKA vs frozen")
    ax.tick_params(axis="x", rotation=45)
    ax.set_title(f"{_where(results)}representation similarity (Kornblith et al., 2019)")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    return path


def render_markdown(results: dict[str, Any], plots: dict[str, str]) -> str:
    """The report text (see the module docstring): the header and decision rules, then the
    four steps, then the timings."""
    md = [
        *_render_header(results, plots),
        *_render_variants(results, plots),
        *_render_probes(results, plots),
        *_render_failures(results, plots),
        *_render_cka(results, plots),
    ]
    secs = results["meta"].get("seconds", {})
    if secs:
        md.append("\nTimings (s): " + ", ".join(f"{k_} {v:.1f}" for k_, v in secs.items()) + "\n")
    return "\n".join(md) + "\n"


def _render_header(results: dict[str, Any], plots: dict[str, str]) -> list[str]:
    """The title, what was diagnosed, the decision rules, model vs baseline."""
    md: list[str] = []
    meta = results["meta"]
    metric = meta["metric"]
    md.append(f"# Diagnostics: `{meta['model_name']}` ({meta['model_type']})\n")
    md.append(
        f"Checkpoint `{meta['checkpoint']}` on store `{meta['store']}` (split `{meta['split']}`): "
        f"{meta['n_queries']} queries searched against all {meta['n_passages']} passages. "
        f"Encoder `{meta['encoder']}` (fingerprint `{str(meta['encoder_fingerprint'])[:12]}`). "
        f"Baseline: `{meta['baseline']}`. Decision metric: {metric}.\n"
    )
    for note in meta.get("notes") or []:
        md.append(f"Note: {note}\n")
    md.append("## Decision rules (the DRT seed's)\n")
    if results["rules"]:
        md.append(
            _table(
                ["rule", "numbers", "holds?", "conclusion"],
                [
                    [r["rule"], r["numbers"], "yes" if r["holds"] else "no", r["conclusion"]]
                    for r in results["rules"]
                ],
            )
        )
    else:
        md.append("No rule applies to this model type.")
    mv = results["model"]["vs_baseline"]
    md.append(
        f"\nModel vs baseline on {metric}: {mv['mean_a']:.4f} vs {mv['mean_b']:.4f}, delta "
        f"{mv['delta']:+.4f} (paired bootstrap 95% CI {mv['ci_low']:+.4f} .. "
        f"{mv['ci_high']:+.4f}).\n"
    )
    return md


def _render_variants(results: dict[str, Any], plots: dict[str, str]) -> list[str]:
    """Step 1: the scoring variants of a slot model (else a one-line note)."""
    md: list[str] = []
    meta = results["meta"]
    metric = meta["metric"]
    metrics = meta["metrics"]
    var = results.get("variants")
    md.append("## 1. Scoring variants (same checkpoint, no retraining)\n")
    if var:
        rows = []
        for name, v in var["variants"].items():
            p = var["paired"].get(name)
            rows.append(
                [
                    name,
                    *[v["mean"][m] for m in metrics],
                    "-"
                    if p is None
                    else f"{-p['delta']:+.4f} [{-p['ci_high']:+.4f}, {-p['ci_low']:+.4f}]",
                    v["description"],
                ]
            )
        rows.append(
            [
                f"baseline ({meta['baseline']})",
                *[results["baseline"]["mean"][m] for m in metrics],
                "",
                "",
            ]
        )
        md.append(
            _table(["variant", *metrics, f"delta {metric} vs learned [95% CI]", "score"], rows)
        )
        md.append(
            "\nSlots are unit vectors, so `concat-cosine` equals `uniform` exactly (cos of the "
            "concatenation = mean slot cosine); `concat-raw-cosine` uses the slots before "
            "normalisation.\n"
        )
        a = var["alpha"]
        md.append(
            f"Attention: mean alpha per slot {', '.join(f'{x:.3f}' for x in a['mean'])}; "
            "share of queries whose largest alpha is each slot "
            f"{', '.join(f'{x:.2f}' for x in a['argmax_share'])}; "
            f"mean entropy {a['entropy_mean']:.3f} (uniform = {a['entropy_max']:.3f}).\n"
        )
        if "variants" in plots:
            md.append(f"![variants]({plots['variants']})\n")
    else:
        md.append("Not a DRT checkpoint: no slot-level scoring variants.\n")
    return md


def _render_probes(results: dict[str, Any], plots: dict[str, str]) -> list[str]:
    """Step 2: probe accuracy per representation and task, the majority baseline."""
    md: list[str] = []
    pr = results["probes"]
    seed = results.get("meta", {}).get("probe_seed", "unrecorded")
    md.append(f"## 2. Probes (logistic regression, 70/30 stratified split, seed {seed})\n")
    if len(pr.get("queries", {})) > 1:
        md.append(
            "Probe queries (and CKA rows): "
            + ", ".join(f"`{p}` ({n})" for p, n in pr["queries"].items())
            + "\n"
        )
    md.append(
        "Labels: "
        + "; ".join(f"{t} ({pr['label_source'][t]}): {pr['labels'][t]}" for t in pr["labels"])
        + "\n"
    )
    tasks = list(pr["labels"])
    reps = list(dict.fromkeys(r["representation"] for r in pr["results"]))
    rows = []
    for rep in reps:
        row: list[Any] = [rep]
        for t in tasks:
            hit = next(r for r in pr["results"] if r["task"] == t and r["representation"] == rep)
            row.append("skipped" if hit["skipped"] else f"{hit['accuracy']:.3f}")
        rows.append(row)
    maj_row: list[Any] = ["majority baseline"]
    for t in tasks:
        hit = next(r for r in pr["results"] if r["task"] == t)
        maj_row.append("-" if hit["skipped"] else f"{hit['majority']:.3f}")
    rows.append(maj_row)
    md.append(_table(["representation", *tasks], rows))
    skipped = {r["task"]: r["skipped"] for r in pr["results"] if r["skipped"]}
    for t, why in skipped.items():
        md.append(f"\n- `{t}` skipped: {why}")
    n_test = next((r["n_test"] for r in pr["results"] if not r["skipped"]), 0)
    if n_test:
        md.append(
            f"\nHeld-out probe set: {n_test} queries (one query = {1 / n_test:.3f} accuracy).\n"
        )
    if "probes" in plots:
        md.append(f"![probes]({plots['probes']})\n")
    return md


def _render_failures(results: dict[str, Any], plots: dict[str, str]) -> list[str]:
    """Step 3: wins and losses per query, their profiles and examples."""
    md: list[str] = []
    f = results["failures"]
    s = f["summary"]
    md.append(f"## 3. Failures: `{f['system_a']}` vs `{f['system_b']}` per query ({f['metric']})\n")
    md.append(
        f"{s['n_evaluated']} queries evaluated ({s['n_left_out']} left out): {s['wins']} wins, "
        f"{s['losses']} losses, {s['ties']} ties; mean delta {s['mean_delta']:+.4f}.\n"
    )
    for label, block in (("top wins", f["top_wins"]), ("top losses", f["top_losses"])):
        md.append(f"### {label.capitalize()} ({block['n']})\n")
        for dim in block["profile"]:
            prof = block["profile"].get(dim)
            if not prof:
                continue
            ref = f["all"].get(dim, {})
            md.append(
                _table(
                    [dim, "n", "share", "share among all queries", "mean delta"],
                    [
                        [g, v["n"], v["share"], ref.get(g, {}).get("share"), v["mean_delta"]]
                        for g, v in prof.items()
                    ],
                )
                + "\n"
            )
        if block["examples"]:
            md.append(
                _table(
                    ["query", f["system_a"], f["system_b"], "delta", "length", "type"],
                    [
                        [
                            e["query"].replace("|", "/"),
                            e[f["system_a"]],
                            e[f["system_b"]],
                            e["delta"],
                            e["length"],
                            e.get("type", ""),
                        ]
                        for e in block["examples"]
                    ],
                )
                + "\n"
            )
    if "failures" in plots:
        md.append(f"![failures]({plots['failures']})\n")
    return md


def _render_cka(results: dict[str, Any], plots: dict[str, str]) -> list[str]:
    """Step 4: linear CKA against the frozen vectors, the baseline, slot vs slot."""
    md: list[str] = []
    meta = results["meta"]
    c = results["cka"]
    md.append("## 4. Linear CKA (Kornblith et al., 2019) between query representations\n")
    md.append(
        _table(
            ["representation", "CKA vs frozen embeddings"],
            [[n, v] for n, v in c["vs_frozen"].items()],
        )
    )
    if c.get("vs_baseline"):
        md.append(
            "\n"
            + _table(
                ["representation", f"CKA vs {meta['baseline']}"],
                [[n, v] for n, v in c["vs_baseline"].items()],
            )
        )
    if c.get("slot_vs_slot"):
        k = len(c["slot_vs_slot"])
        md.append(
            "\nSlot vs slot:\n\n"
            + _table(
                ["", *[f"slot-{j}" for j in range(k)]],
                [[f"slot-{i}", *row] for i, row in enumerate(c["slot_vs_slot"])],
            )
        )
    if "cka" in plots:
        md.append(f"\n![cka]({plots['cka']})\n")
    return md


def write_report(
    results: dict[str, Any], out_dir: str | Path, *, plots: bool = True
) -> dict[str, str]:
    """Write the plots and ``report.md`` into ``out_dir``.

    Returns:
        ``name -> file name`` (relative to ``out_dir``) of everything written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    if plots:
        makers = {
            "variants": plot_variants if results.get("variants") else None,
            "probes": plot_probes
            if any(r.get("skipped") is None for r in results["probes"]["results"])
            else None,
            "failures": plot_failures,
            "cka": plot_cka,
        }
        for name, fn in makers.items():
            if fn is not None:
                fn(results, out / f"{name}.png")
                written[name] = f"{name}.png"
    text = render_markdown(results, written)
    atomic_write_text(out / REPORT_FILE, text)
    written["report"] = REPORT_FILE
    return written
