"""Generate ``docs/scale.md`` from ``bench/results/scale/results.json`` (``bench/bench_scale.py``).

Every number in the page comes from the JSON; extrapolations are computed here, each with its
rule stated in the page: search cost is linear in queries x passages (exact, the head's tower,
int8) or in queries x scanned lists (IVF-PQ, linear in passages at a fixed nprobe / nlist ratio);
exact search and training keep their peak RSS (chunk- and batch-bounded); an index held in memory
grows with the collection (its measured bytes per passage); a forest pair's cost is linear in its
steps and in the training rows, not in the collection.

    .venv/bin/python bench/scale_table.py [--results ...] [--out docs/scale.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

SEED_QUERIES = 100_000
SEED_COLLECTION = 8_800_000
SEED_TRAIN_QUERIES = 808_000
SEED_PAIRS = 2_000
SEED_FOREST_STEPS = 10 + 80 + 40  # configs/forest/seed_scale.yaml: steps_query/passage/joint
MACHINE_GIB = 24.0
MACHINE_CORES = 2
ONE_MACHINE_HOURS = 12.0
DIM = 3840
COMMAND = """\
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1
# the store (the fit store defaults to the cached SciFact test split under .cache/test-stores/)
nice -n 10 .venv/bin/python bench/bench_scale.py --root /tmp/scale-run \\
    --out /tmp/scale-results-data.json --stages data --keep
# then one run per stage, each with its own results file and a --timeout that ends it by the
# session's deadline (a stage stopped there is recorded as not finished, with how far it got)
ARGS="--root /tmp/scale-run --passages 1000000 --eval-queries 2000 --n-eval 2000 \\
    --train-queries 808000 --train-steps 100 --n-index-eval 200"
IVFPQ=faiss:ivfpq:nlist=256,m=48,opq=0,nprobe=16,train_size=10000
for s in exact flat-reference ivfpq train-linear eval-linear forest; do
  nice -n 10 .venv/bin/python bench/bench_scale.py $ARGS --ivfpq $IVFPQ \\
      --out /tmp/scale-results-$s.json --stages $s --keep --timeout $SECONDS_LEFT
done
rm -rf /tmp/scale-run
.venv/bin/python bench/scale_table.py --merge /tmp/scale-results-data.json \\
    /tmp/scale-results-{exact,flat-reference,ivfpq,train-linear,eval-linear,forest}.json \\
    --not-run "int8=$WHY"
# issue 34: a search-only 1M store (no training queries), stages rerun into the results
nice -n 10 .venv/bin/python bench/bench_scale.py --root /tmp/scale-1m --passages 1000000 \\
    --eval-queries 2000 --train-queries 0 --stages data --keep --out /tmp/s-data.json
nice -n 10 .venv/bin/python bench/bench_scale.py --root /tmp/scale-1m --passages 1000000 \\
    --eval-queries 2000 --train-queries 0 --n-eval $N --stages exact --keep \\
    --out /tmp/s-exact.json --timeout $SECONDS_LEFT
.venv/bin/python bench/scale_table.py --update /tmp/s-exact.json --not-run "int8=$WHY"
# the exact stage's memory by kind and phase, before and after (100K passages, same generator)
ARGS100K="--passages 100000 --eval-queries 2000 --train-queries 100000"
nice -n 10 .venv/bin/python bench/bench_scale.py --root /tmp/s100k $ARGS100K --stages data --keep
.venv/bin/python bench/scale_rss_probe.py --root /tmp/s100k --queries 2000 \\
    --out bench/results/scale/exact-rss-100k.json --label after
# the forest memory model: forest stage runs (--forest-queries N --forest-chunk B), then
.venv/bin/python bench/scale_table.py --forest-runs before=F1.json after=F2.json after=F3.json\
"""


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _load(r: dict[str, Any]) -> str:
    la = r.get("load_average")
    if not la:
        return "-"
    return f"{la['start'][0]:.1f} -> {la['end'][0]:.1f}"


def _verdict(rss_gib: float, cpu_hours: float) -> str:
    """Whether ``cpu_hours`` of one-thread work in ``rss_gib`` fits one 2-core / 24 GiB machine."""
    if rss_gib >= MACHINE_GIB:
        return "no (the index does not fit its memory) -> torchrun path (shard the passages)"
    hours = cpu_hours / MACHINE_CORES
    out = f"memory yes; {hours:,.1f} h on {MACHINE_CORES} cores"
    if hours > ONE_MACHINE_HOURS:
        out += " -> torchrun path (shard the passages)"
    return out


def _probe_lines(probe: dict[str, Any], forest: dict[str, Any]) -> list[str]:
    """The 100K-passage probes (``probe-100k.json``): where an IVF-PQ build's time goes, and the
    forest's cost per query on a small split (to size the 808K run)."""
    r1, r2 = probe["run1"]["stages"], probe["run2"]["stages"]
    n = int(r2["data"]["bytes"]["passages"]) // (4 * DIM)
    out = [
        "",
        f"## Probes on {n:,} passages (`bench/results/scale/probe-100k.json`)",
        "",
        "Run before the 1M stages, on a store of the same generator, to size them.",
        "",
    ]
    a, b = r1.get("ivfpq", {}), r2.get("ivfpq", {})
    if a and b.get("build_seconds") is not None:
        out.append(
            f"- IVF-PQ (`{b['spec']}`): with FAISS's default polysemous training the build was"
            f" stopped after {_f(a['wall_seconds'])} s wall ({_f(a['cpu_seconds'])} CPU s) still"
            " in that training (a simulated-annealing re-ordering of every sub-quantizer's"
            " centroids that only polysemous filtering uses, independent of the passage count)."
            " Without it (`PQ48x8np`, now the `ivfpq` kind's factory string) the whole stage took"
            f" {_f(b['cpu_seconds'])} CPU s ({_f(b['build_seconds'])} s wall build on the shared"
            " machine); py-spy samples found it in the k-means training on `train_size` rows"
            " (which does not grow with the passages) most of the time;"
            f" {b['queries']} queries searched at {_f(b['qps'])} q/s;"
            f" {_f(b['bytes_per_passage'])} B/passage at this size (the 48-byte codes and 8-byte"
            " ids plus fixed centroid tables). So at 1M the build is the training plus ten times"
            " the adds: it fits, and `train_size` was halved for the 1M stage."
        )
    i8 = r1.get("int8", {})
    if i8.get("qps"):
        out.append(
            f"- int8 (`{i8['spec']}`): build {_f(i8['build_seconds'])} s, {i8['queries']} queries"
            f" at {_f(i8['qps'], 2)} q/s (wall, on the shared machine),"
            f" {_f(i8['bytes_per_passage'])} B/passage; its search is linear in passages."
        )
    fp = r1.get("forest", {})
    if fp.get("cpu_seconds"):
        nq = int(fp["train_queries"])
        scale = SEED_TRAIN_QUERIES / nq
        out.append(
            f"- Forest pair at C = {fp['classes']:,} on {nq:,} x 3,840 training queries (one step"
            f" per stage, {fp['random_negatives']} random negatives per query):"
            f" {_f(fp['cpu_seconds'])} CPU s, peak RSS {_f(fp['peak_rss_gib'], 2)} GiB (its"
            f" {nq:,} rows fit one {fp['chunk_size']:,}-row block, so its logits were held"
            f" whole). Linear in the training rows, {SEED_TRAIN_QUERIES:,} queries need at least"
            f" {fp['cpu_seconds'] * scale / 60:,.0f} CPU minutes (more: beyond one block every"
            " pass recomputes each block's logits), over this session's CPU budget beside the"
            " other stages"
            + (
                "; the 808K stage ran for the time that was left (above)."
                if forest
                else "; the 808K stage was not run."
            )
        )
    return out


def results_dir_has(extra: list[str] | None, name: str) -> bool:
    """Whether the side-file lines include the one from ``name`` (its explanation replaces a
    placeholder line)."""
    return any(f"`{name}" in line for line in extra or [])


def exact_rss_lines(path: Path) -> list[str]:
    """What dominated exact search's peak RSS, from ``exact-rss-100k.json``
    (``bench/scale_rss_probe.py``: anonymous and file-backed memory by phase, before and after
    the pread chunk reader)."""
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    b, a = doc.get("before"), doc.get("after")
    if not (b and a):
        return []

    def peak(r: dict[str, Any]) -> tuple[str, dict[str, float]]:
        name = max(r["phases"], key=lambda k: r["phases"][k]["peak_total_gib"])
        return name, r["phases"][name]

    bn, bp = peak(b)
    an, ap = peak(a)
    same = "the same" if a["result_sha256"] == b["result_sha256"] else "DIFFERENT"
    return [
        f"- What dominated the exact stage's peak RSS (`{path.name}`,"
        f" `bench/scale_rss_probe.py`: {b['passages']:,} passages x {b['dim']:,} of the same"
        " generator, `/proc/self/status` sampled every 50 ms by phase): before"
        f" ({b['note']}; {b['queries']:,} queries) the peak was {b['ru_maxrss_gib']:.2f} GiB,"
        f" in the `{bn}` phase (the exact rescoring's row gathers): {bp['peak_file_gib']:.2f} GiB"
        " file-backed (pages of the passage file mapped by the gathers' page faults; each fault"
        " also maps the row's cached neighbours, so scattered gathers made most of the file"
        f" resident, {b['passages'] * b['dim'] * 4 / 2**30:.2f} GiB here, most of the 14.3 GiB"
        f" file at 1M) + {bp['peak_anon_gib']:.2f} GiB anonymous (a 256-query batch's 116"
        " rows each, 0.46 GB at 3,840 dims, the previous batch's still alive). After"
        f" ({a['note']}; {a['queries']:,} queries): {a['ru_maxrss_gib']:.2f} GiB, in the"
        f" `{an}` phase"
        f" ({ap['peak_anon_gib']:.2f} GiB anonymous: the 384 MiB chunk buffer and the scores;"
        f" {ap['peak_file_gib']:.2f} GiB file-backed: the libraries' code), which does not grow"
        " with the passages (`tests/kernels/test_topk_memory.py`; peaks are per query batch:"
        " more queries add only the (queries, 116) preselection keys). Results:"
        + (
            f" byte for byte {same} (SHA-256 of ids and scores)"
            if a["queries"] == b["queries"]
            else " bit-identical (the kernel tests and the FAISS reference tests)"
        )
        + f"; {a['full_rescore_queries']} of the {a['queries']:,} queries were rescored over"
        " every passage.",
    ]


FOREST_MODEL_FILE = "forest-memory-model.json"
STEPS = ("query", "passage", "joint")


def _step_peaks(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{step: {"total", "anon", "file"}}`` GiB of one forest stage run: ``total`` the
    process's ``ru_maxrss`` after a step that raised it (exact), else the step's largest VmRSS
    sample (every 50 ms: a lower bound); ``anon`` / ``file`` the step's sampled peaks."""
    out = {}
    before = 0.0
    for st in run.get("steps", []):
        k = st.get("step_peak_gib") or {}
        # ru_maxrss (exact) when this step raised the process's peak; else the sampled peak
        raised = float(st["peak_rss_gib"]) > before + 1e-9
        total = float(st["peak_rss_gib"]) if raised else float(k.get("VmRSS", 0.0))
        before = max(before, float(st["peak_rss_gib"]))
        out[st["stage"]] = {
            "total": total,
            "anon": float(k.get("RssAnon", 0.0)),
            "file": float(k.get("RssFile", 0.0)),
        }
    return out


def _model_runs(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two ``after`` runs of the memory model: the larger and a smaller ``chunk_size``."""
    after = sorted((r for r in doc["runs"] if r["code"] == "after"), key=lambda r: r["chunk_size"])
    return after[-1], after[0]


def forest_alphas(doc: dict[str, Any]) -> dict[str, float]:
    """Bytes of peak RSS per block row, per step, from the two ``after`` runs."""
    big, small = _model_runs(doc)
    pb, ps = _step_peaks(big), _step_peaks(small)
    fit = {
        step: (pb[step]["total"] - ps[step]["total"])
        * 2**30
        / (big["chunk_size"] - small["chunk_size"])
        for step in STEPS
        if step in pb and step in ps
    }
    # every step runs at least one side's block forward (the query step's cost per row); a
    # step whose peaks are sampled lower bounds (ru_maxrss set by an earlier step) can fit less
    floor = fit.get("query", 0.0)
    return {step: max(v, floor) for step, v in fit.items()}


def forest_model(
    doc: dict[str, Any], n_queries: int, chunk: int, n_passages: int = 1_000_000
) -> dict[str, float]:
    """Predicted peak RSS (GiB) of each step of one forest pair from the model's measured runs.

    ``peak(step) = I(step) + alpha(step) * B + beta(step, n)`` where ``B`` is the block
    (``chunk_size``) rows, ``n`` the training queries: ``alpha`` (bytes per block row) from two
    runs that differ only in ``B`` (:func:`forest_alphas`); ``I`` the intercept of the run with
    ``n0`` queries; ``beta`` the bytes the queries beyond ``n0`` add, from the shapes (module
    docstring of :mod:`treerank.forest.trainer`): each query's packed dropout bits (``d / 8``
    bytes, query and joint steps), the packed bits of the passage rows beyond the measured run's
    (``N (1 - e^{-n/N})`` distinct selected passages of ``n`` queries over ``N = n_passages``,
    plus the 1,024-row pool; passage and joint steps), and ~64 bytes of per-row and per-example
    bookkeeping (masks, classes, targets, example indices and weights).
    """
    big, _ = _model_runs(doc)
    pb = _step_peaks(big)
    n0, d = int(big["train_queries"]), int(big["dim"])
    rows0 = int(big.get("passage_rows") or 0)  # the measured run's shared + pool rows
    pool = 1024
    new_shared = n_passages * (1 - np.exp(-n_queries / n_passages)) + pool - rows0
    out = {}
    for step, alpha_b in forest_alphas(doc).items():
        alpha = alpha_b / 2**30
        intercept = pb[step]["total"] - alpha * big["chunk_size"]
        extra = 64.0 * (n_queries - n0)
        if step in ("query", "joint"):
            extra += d / 8 * (n_queries - n0)
        if step in ("passage", "joint"):
            extra += d / 8 * float(new_shared)
        out[step] = intercept + alpha * min(chunk, n_queries) + extra / 2**30
    return out


def forest_memory_lines(path: Path, measured_808k: dict[str, Any]) -> list[str]:
    """The forest pair's memory model (``forest-memory-model.json``): measured step peaks by
    kind on small training sets, the fitted per-block-row cost, and its prediction at 808K."""
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    lines = [
        "",
        "## Memory model: one forest pair at C = 1,000 on 3,840-d",
        "",
        f"Measured (`bench/results/scale/{path.name}`: `bench/bench_scale.py --stages forest"
        " --forest-queries n --forest-chunk B`, one step per stage, 1 random negative per"
        " query, each step's own peak of `/proc/self/status` sampled every 50 ms) on the"
        " 100K-passage store of the same generator, then fitted and extrapolated. `before` is"
        " the code at commit 8136846 (rows gathered through the memory map), `after` this"
        " change (rows read with `pread`, `kernels.rows.FileRows`).",
        "",
        "| code | training queries | chunk_size B | step | peak GiB | anon GiB | file GiB |"
        " step s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"]:
        secs = {st["stage"]: st["seconds"] for st in r.get("steps", [])}
        for step, pk in _step_peaks(r).items():
            lines.append(
                f"| {r['code']} | {int(r['train_queries']):,} | {int(r['chunk_size']):,} | {step}"
                f" | {pk['total']:.2f} | {pk['anon']:.2f} | {pk['file']:.2f} |"
                f" {secs.get(step, 0):,.1f} |"
            )
    pred = {b: forest_model(doc, SEED_TRAIN_QUERIES, b) for b in (65_536, 16_384)}
    alphas = forest_alphas(doc)
    meas = {st["stage"]: st["peak_rss_gib"] for st in measured_808k.get("steps", [])}
    stopped = measured_808k.get("peak_rss_gib")
    excess = {k: meas.get(k, stopped or 0.0) - v for k, v in pred[65_536].items()}
    model = (
        "**The model.** A step's peak is `I + alpha * B + beta(n)`: `alpha` bytes per block row"
        " (fitted from the two `after` runs that differ only in B: "
        + ", ".join(f"{k} {v / 1024:,.0f} KiB" for k, v in alphas.items())
        + "; at d = 3,840 a block row is 15 KiB of float32 input, and the forward pass of a"
        " dropout layer holds the rows read, their unpacked keep mask (1 byte per element) and"
        " the two dropout products, ~13 d bytes, beside ~6 logits-sized (C = 1,000 floats)"
        " tensors of the softmax terms and their gradients; the joint step holds one side's"
        " graph while it runs the other's), `I` the intercept at the measured n0 ="
        f" {int(_model_runs(doc)[0]['train_queries']):,} queries, `beta` from the shapes:"
        " each further query adds its packed dropout bits"
        " (d / 8 = 480 bytes) and, in the passage and joint steps, those of its selected"
        " passage when that passage is new to the shared rows, plus ~64 bytes of bookkeeping."
        " The block terms do not grow with the queries: all the extrapolation to 808K adds is"
        " the banks of packed bits. The `before` code adds the file-backed term (the `file`"
        " column): the pages each block's gathers mapped (each fault also maps the row's cached"
        " neighbours), up to the span of the rows read. The model attributes the measured"
        " 808K steps' excess over the prediction (below: "
        + ", ".join(f"{k} {'' if k in meas else '>= '}{v:+.1f} GiB" for k, v in excess.items())
        + "; the query step reads contiguous rows) to that term over the 15 GB"
        " passage file; it is not measured at this scale (over a 1.5 GB file at 12K queries the"
        " before and after runs differ by less than their sampling noise, and their step"
        " seconds are wall time at different loads), the mechanism is"
        " (`tests/kernels/test_topk_memory.py`: 2,000 scattered rows through the map made the"
        " whole 64 MiB test file resident); `pread` reads remove it. **What bounds it under"
        " 8 GiB:** the `pread` reads (this change)"
        " and, for a margin, a smaller block: `trainer.chunk_size: 16384` (the gradient is the"
        " same sum, block by block; the same rows pass through the same GEMMs)."
    )
    lines += [
        "",
        model,
        "",
        "| step | predicted at 808K, B = 65,536 (GiB) | measured at 808K, B = 65,536, before"
        " (GiB, ru_maxrss so far) | predicted at 808K, B = 16,384 (GiB) |",
        "|---|---|---|---|",
    ]
    for step in STEPS:
        m = meas.get(step)
        m_text = (
            f"{m:.2f}"
            if m is not None
            else (f">= {stopped:.2f} (stopped in this step)" if stopped else "-")
        )
        lines.append(
            f"| {step} | {pred[65_536].get(step, float('nan')):.2f} | {m_text} |"
            f" {pred[16_384].get(step, float('nan')):.2f} |"
        )
    return lines


def extra_lines(results_dir: Path) -> list[str]:
    """Target notes from the side files: the margin probe and the exact stage before its fix."""
    out = exact_rss_lines(results_dir / "exact-rss-100k.json")
    m = results_dir / "margin-probe.json"
    if m.exists():
        r = json.loads(m.read_text())["result"]
        out.append(
            f"- Why exact search does more than one BLAS pass here (`{m.name}`,"
            f" `bench/scale_margin_probe.py`): of {r['queries']} queries, {r['bad_at_kk']} had"
            f" BLAS scores at rank 100 and at the preselection depth {r['kk']} closer than the"
            f" error bound (median gap {r['gap_k_kk_median']:.2g} vs bound"
            f" {r['bound_median']:.2g}: 3,840-d scores near the top of 1M passages are dense),"
            " so about that fraction of queries is rescored over every passage by the float64"
            f" pair kernel; at depth 200 {r['bad_at_200']} would be."
        )
    b = results_dir / "exact-before-release.json"
    if b.exists():
        r = json.loads(b.read_text())["exact"]
        out.append(
            f"- Before the page-release fix (`{b.name}`): the same exact stage reached"
            f" {_f(r['peak_rss_gib'], 1)} GiB RSS ({_f(r['cpu_seconds'])} CPU s) in that"
            " rescoring, whose reads of the memory map were never released, and was stopped;"
            " `exact_search` now releases them (the table's exact row is the run after the fix)."
        )
    return out


def render(
    doc: dict[str, Any],
    probe: dict[str, Any] | None = None,
    extra: list[str] | None = None,
    sections: list[str] | None = None,
) -> str:
    st, s = doc["stages"], doc["settings"]
    n = int(s["passages"])
    grow = SEED_COLLECTION / n
    loads = [
        v
        for r in st.values()
        if isinstance(r, dict) and r.get("load_average")
        for v in (r["load_average"]["start"][0], r["load_average"]["end"][0])
    ]
    load_text = (
        f"1-minute load average {min(loads):.1f} to {max(loads):.1f} at the stages' starts and "
        "ends, per stage in the table"
        if loads
        else "load average not recorded"
    )
    lines = [
        "# The seed's scale, simulated (1M passages x 3,840 dims)",
        "",
        "Generated by `bench/scale_table.py` from `bench/results/scale/results.json`",
        "(`bench/bench_scale.py`, issue 26 items 4 and 5, issue 34 item 4); do not edit by hand.",
        "",
        "**Data.** The shared generator (`store/synthetic.py`, a PPCA mixture) fitted to a real",
        f"384-d store ({Path(str(s['fit_store'])).parent.name}/test, all-MiniLM-L6-v2), sampled",
        "in 384-d and lifted to 3,840-d by a random orthonormal 384 -> 3,840 map plus isotropic",
        f"Gaussian noise at SNR {s['snr']} (signal power 1, noise power 1/SNR), L2-normalised:",
        f"{n:,} passages (one file, hard-linked into both splits), {s['eval_queries']:,}",
        f"evaluation queries, {s['train_queries']:,} training queries. Labels are random (one",
        "selected passage per query): this measures time and memory, not retrieval quality, so no",
        "metric is reported. One thread (`OMP_NUM_THREADS=1`), `nice -n 10`, on a 2-core, 24 GiB",
        f"machine shared with other engineers' jobs ({load_text}): the times are lower bounds on",
        "an idle machine's speed, and wall time also waits for the disk (the 15 GB passage file",
        "and the 12 GB training queries do not both fit the page cache). Each stage ran in its own",
        "child process; peak RSS is its `ru_maxrss`, CPU s its user + system time.",
        "",
        "**No GPU.** No CUDA device was available in this session: every number here is the CPU's,",
        "and the issue's GPU target (exact search of 100K x 1M x 3,840 in under a minute) is not",
        "measured. `docs/gpu.md` has the device check (`scripts/gpu_check.sh`) to run on one.",
        "",
        "| stage | what | wall s | peak RSS GiB | CPU s | timed s | load (1 min) | measured |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, what: str, measured: str) -> None:
        r = st.get(name)
        if r is None or "not_run" in r:
            why = r["not_run"] if r else ""
            lines.append(f"| {name} | {what} | not run | | | | | {why} |")
            return
        if "wall_seconds" not in r or r.get("exit", 0) != 0 or "error" in r:
            why = r.get("error", f"exit {r.get('exit')}")
            if r.get("steps"):
                why += "; steps that ended: " + ", ".join(
                    f"{x['stage']} {_f(x['seconds'])} s (peak RSS {_f(x['peak_rss_gib'], 2)} GiB)"
                    for x in r["steps"]
                )
            elif name == "forest":
                why += "; no step ended"
            if "wall_seconds" not in r:
                lines.append(f"| {name} | {what} | not finished | | | | {_load(r)} | {why} |")
                return
            if r.get("measured_at_commit"):
                why += f" (not rerun: measured at commit {r['measured_at_commit']})"
            lines.append(
                f"| {name} | {what} | not finished after {_f(r['wall_seconds'])} |"
                f" {_f(r.get('peak_rss_gib'), 2)} (when stopped) | {_f(r.get('cpu_seconds'))} | |"
                f" {_load(r)} | {why} |"
            )
            return
        if r.get("sampled_peak_gib"):
            k = r["sampled_peak_gib"]
            measured += (
                f"; peak anon {k.get('RssAnon', 0):.2f} / file {k.get('RssFile', 0):.2f} GiB"
            )
        if r.get("measured_at_commit"):
            measured += f" (not rerun: measured at commit {r['measured_at_commit']})"
        lines.append(
            f"| {name} | {what} | {_f(r['wall_seconds'])} | {_f(r['peak_rss_gib'], 2)} | "
            f"{_f(r['cpu_seconds'])} | {_f(r.get('seconds'))} | {_load(r)} | {measured} |"
        )

    d = st.get("data", {})
    b = d.get("bytes", {})
    row(
        "data",
        "generate + write the store",
        f"{b.get('passages', 0) / 1e9:.1f} GB passages, "
        f"{b.get('train_queries', 0) / 1e9:.1f} GB train queries",
    )
    for name, what in (
        ("exact", "cosine exact search, `exact_search(backend='auto')`"),
        ("flat-reference", "FAISS `IndexFlatIP`, chunk by chunk, same batch"),
        ("eval-linear", "linear head (3,840 -> 256) as a `DenseSystem`"),
        ("int8", "`faiss:int8` (SQ8) build + search"),
        ("ivfpq", f"`{st.get('ivfpq', {}).get('spec', s['ivfpq'])}` build + search"),
    ):
        r = st.get(name, {})
        q = r.get("queries")
        meas = f"{q:,} queries, {_f(r.get('qps'), 2)} q/s" if q else ""
        if r.get("build_seconds") is not None:
            meas += f", build {_f(r['build_seconds'])} s"
        if r.get("bytes_per_passage"):
            meas += (
                f", index {r['index_bytes'] / 1e9:.2f} GB = {r['bytes_per_passage']:,.0f} B/passage"
            )
        if r.get("backend"):
            meas += f", kernel `{r['backend']}`"
        row(name, what, meas)
    t = st.get("train-linear", {})
    row(
        "train-linear",
        f"linear head on {_f(t.get('train_queries'))} queries",
        f"{t.get('steps')} steps x {t.get('batch_size')}, "
        f"{_f(t.get('steps') / t['fit_seconds'] if t.get('fit_seconds') else None, 2)} steps/s"
        " (fit loop)",
    )
    fo = st.get("forest", {})
    row(
        "forest",
        f"one forest pair at C = {_f(fo.get('classes', 1000))} on the train split "
        f"(`{fo.get('config', 'configs/forest/seed_scale.yaml')}`, one step per stage,"
        f" {fo.get('random_negatives', s.get('forest_random_negatives', '-'))} random"
        " negative(s) per query)",
        f"{_f(fo.get('train_queries'))} queries, {_f(fo.get('passage_rows'))} passage rows, "
        f"chunk_size {_f(fo.get('chunk_size'))}, pair {_f(fo.get('pair_seconds'))} s"
        if fo.get("train_queries")
        else "",
    )

    ex, fl = st.get("exact", {}), st.get("flat-reference", {})
    lines += ["", "## Targets", ""]
    same_run = ex.get("queries") == fl.get("queries") and ex.get("measured_at_commit") == fl.get(
        "measured_at_commit"
    )
    before = doc.get("replaced", {}).get("exact")
    if ex.get("qps") and not same_run and "error" not in ex:
        lines.append(
            f"- 1M x 3,840 exact search, this change ({ex['queries']:,} queries, one query"
            f" batch: the peaks are per batch): peak RSS {_f(ex['peak_rss_gib'], 2)} GiB (target"
            f" <= 2: {_met(ex['peak_rss_gib'] <= 2)}); {_f(ex['qps'], 2)} q/s,"
            f" {_f(ex['cpu_seconds'])} CPU s."
            + (
                f" Before (commit {before.get('measured_at_commit')}, {before['queries']:,}"
                f" queries): peak RSS {_f(before['peak_rss_gib'], 2)} GiB, {_f(before['qps'], 2)}"
                " q/s."
                if before and before.get("qps")
                else ""
            )
            + " The FAISS `IndexFlatIP` reference was not rerun with it; its 2,000-query"
            " comparison is the commit's below."
        )
        if before and before.get("qps") and fl.get("qps"):
            ex = before  # the comparison on the same 2,000-query batch is the old run's
    if ex.get("qps") and fl.get("qps"):
        ratio = ex["qps"] / fl["qps"]
        when = f" (commit {ex['measured_at_commit']})" if ex.get("measured_at_commit") else ""
        lines.append(
            f"- 1M x 3,840 exact evaluation{when}: peak RSS {_f(ex['peak_rss_gib'], 2)} GiB"
            f" (target < 8: {_met(ex['peak_rss_gib'] < 8)}); {_f(ex['qps'], 2)} q/s vs FAISS"
            f" `IndexFlatIP` {_f(fl['qps'], 2)} q/s on the same {ex['queries']:,}-query batch"
            f" = {ratio:.2f}x (target >= 0.9x: {_met(ratio >= 0.9)}); same top-100 id sets:"
            f" {_f(100 * fl.get('same_ids_fraction', float('nan')), 2)} %. On CPU time alone"
            f" (the disk wait left out): {_f(ex['cpu_seconds'])} s vs {_f(fl['cpu_seconds'])} s"
            f" = {fl['cpu_seconds'] / ex['cpu_seconds']:.2f}x."
        )
    if ex.get("peak_rss_gib", 0) > 2 and not (results_dir_has(extra, "exact-rss")):
        lines.append(
            f"- The exact stage's peak RSS ({_f(ex['peak_rss_gib'], 2)} GiB) is well above what"
            " its blocks need (a 384 MiB passage chunk, and 0.46 GB of rows gathered for the"
            " exact rescoring of a 256-query batch): not explained yet; to watch at 100K queries."
        )
    if t.get("peak_rss_gib") is not None and "error" not in t:
        lines.append(
            f"- Linear head on {_f(t.get('train_queries'))} x 3,840 queries: peak RSS "
            f"{_f(t['peak_rss_gib'], 2)} GiB (target < 8: {_met(t['peak_rss_gib'] < 8)}; the"
            f" query file is {b.get('train_queries', 0) / 2**30:.1f} GiB), "
            f"{_f(t['steps'] / t['fit_seconds'], 2)} steps/s of batch {t['batch_size']}."
        )
    if fo.get("peak_rss_gib") is not None and "error" not in fo:
        lines.append(
            f"- Forest pair at C = {fo['classes']:,} over {fo['train_queries']:,} x 3,840 queries"
            f" (block-wise logits, `chunk_size` {fo['chunk_size']:,}): peak RSS"
            f" {_f(fo['peak_rss_gib'], 2)} GiB (target < 8: {_met(fo['peak_rss_gib'] < 8)}); the"
            " (n, C) logits of both sides and their gradients held whole would be"
            f" {_f(fo['whole_logits_and_gradients_gib'], 1)} GiB (from the shapes). No mined hard"
            f" negatives ({fo['random_negatives']} random one(s) per query from a 1,024-passage"
            " pool): mining is an exact top-8 search of every training query (extrapolated"
            " below)."
        )
    elif fo:
        rss = (
            f"; peak RSS {_f(fo['peak_rss_gib'], 2)} GiB when it was stopped (target < 8 for the"
            " whole pair: not established)"
            if fo.get("peak_rss_gib") is not None
            else ""
        )
        lines.append(
            f"- Forest pair at C = 1,000 over {SEED_TRAIN_QUERIES:,} queries: not finished"
            f" ({fo.get('error')}){rss}; the table's row lists the steps that ended."
        )
    for line in extra or []:
        lines.append(line)
    lines.append(
        "- bf16 search: `exact_search` has no bf16 path (a float32 BLAS preselection, then the"
        " float64 pair kernel's exact scores); bf16 is an encoding precision"
        " (`precision: bf16`, `docs/encoding.md`), so a bf16-encoded store searches at the"
        " exact stage's cost: nothing separate to time."
    )
    lines.append(
        "- With a GPU (exact search of 100K x 1M x 3,840 in under a minute): not measured, no GPU"
        " in this session (above)."
    )

    lines += [
        "",
        f"## Extrapolation: {SEED_QUERIES:,} queries, and the full {SEED_COLLECTION:,}-passage"
        " collection",
        "",
        "Search CPU time (the stage's CPU seconds, 1 thread) scales linearly with queries x",
        "passages; the file is read once per pass whatever the batch, so wall time at 100K queries",
        "approaches CPU time. An in-memory FAISS index searches CPU-bound: its timed search",
        "seconds are used (the build excluded; the build is linear in passages). RSS of exact",
        "search and training is bounded by the chunk / batch and the query batch (measured above)",
        "and does not grow with the passages;",
        "an in-memory index grows with its codes (its measured bytes per passage). One 2-core",
        f"machine = both cores (half the 1-thread CPU hours, at best); more than"
        f" {ONE_MACHINE_HOURS:.0f} h -> the torchrun path (passages sharded over ranks,",
        "`treerank.kernels.sharded`).",
        "",
        "| stage | 100K queries, 1M passages (CPU h) | 100K queries, 8.8M passages (CPU h) |"
        " RSS at 8.8M GiB | one 2-core / 24 GiB machine? |",
        "|---|---|---|---|---|",
    ]
    rates = dict(st)
    old_exact = doc.get("replaced", {}).get("exact")
    if old_exact and int(old_exact.get("queries") or 0) > int(
        st.get("exact", {}).get("queries") or 0
    ):
        # the per-query rate of the larger batch: the full rescoring's fixed pass is amortised
        rates["exact"] = {**old_exact, "peak_rss_gib": st["exact"]["peak_rss_gib"]}
    for name in ("exact", "flat-reference", "eval-linear", "int8", "ivfpq"):
        r = rates.get(name)
        if not r or not r.get("queries") or "error" in r:
            continue
        faiss_index = name in ("int8", "ivfpq")
        per_q = (r["seconds"] if faiss_index else r["cpu_seconds"]) / r["queries"]
        at_1m = per_q * SEED_QUERIES
        at_full = at_1m * grow
        rss = r["peak_rss_gib"]
        if faiss_index and r.get("bytes_per_passage"):
            rss_full = rss + (SEED_COLLECTION - n) * r["bytes_per_passage"] / 2**30
        else:
            rss_full = rss
        lines.append(
            f"| {name} | {at_1m / 3600:,.2f} h | {at_full / 3600:,.1f} h | {rss_full:,.1f} | "
            f"{_verdict(rss_full, at_full / 3600)} |"
        )
        if faiss_index and r.get("build_seconds"):
            # the stage's CPU (build + a small search), scaled with the passages: an upper bound,
            # the training on train_size rows does not grow
            build_full = r["cpu_seconds"] * grow / 3600
            lines.append(
                f"| {name} build (the stage's CPU, x passages: an upper bound) |"
                f" {r['cpu_seconds'] / 3600:,.2f} h | {build_full:,.1f} h |"
                f" {rss_full:,.1f} | {_verdict(rss_full, build_full)} |"
            )
    ex = rates.get("exact", ex)
    if ex.get("cpu_seconds") and ex.get("queries"):
        mine = ex["cpu_seconds"] / ex["queries"] * SEED_TRAIN_QUERIES / 3600
        lines.append(
            f"| forest hard-negative mining (exact top-8 of {SEED_TRAIN_QUERIES:,} train queries,"
            f" at the exact stage's rate) | {mine:,.1f} h | {mine * grow:,.1f} h |"
            f" {_f(ex['peak_rss_gib'], 1)} | {_verdict(ex['peak_rss_gib'], mine * grow)} |"
        )
    if t.get("fit_seconds") and "error" not in t:
        sps = t["steps"] / t["fit_seconds"]
        epoch = int(t["train_queries"]) / int(t["batch_size"])
        lines.append(
            f"| train-linear (1 epoch of {int(t['train_queries']):,}, wall at the measured"
            f" steps/s) | {epoch / sps / 3600:,.2f} h | same (rows are gathered, not the split)"
            f" | {t['peak_rss_gib']:,.1f} | yes |"
        )
    if fo.get("pair_seconds") and "error" not in fo:
        steps = 3 * int(fo["steps_per_stage"])
        per_step = fo["cpu_seconds"] / steps  # an upper bound: the fixed passes counted as steps
        seed_pair = per_step * SEED_FOREST_STEPS
        forest_h = seed_pair * SEED_PAIRS / 3600
        lines.append(
            f"| forest (the seed's {SEED_PAIRS:,} pairs x {SEED_FOREST_STEPS} steps on"
            f" {fo['train_queries']:,} queries; per step <= the pair's CPU s / {steps}) |"
            f" {seed_pair / 3600:,.2f} h per pair, {forest_h:,.0f} h in all | same (training"
            f" rows, not the collection) | {_f(fo['peak_rss_gib'], 1)} per pair |"
            f" {_verdict(fo['peak_rss_gib'], forest_h)} |"
        )
    dd = st.get("data", {})
    if dd.get("passages_seconds"):
        lines.append(
            f"| data (passages) | {dd['passages_seconds'] / 60:,.1f} min | "
            f"{dd['passages_seconds'] * grow / 3600:,.1f} h, "
            f"{SEED_COLLECTION * DIM * 4 / 1e9:,.0f} GB on disk | {_f(dd['peak_rss_gib'], 1)} |"
            f" memory yes; disk {SEED_COLLECTION * DIM * 4 / 1e9:,.0f} GB |"
        )
    lines += [
        "",
        "The forest's pairs are independent given their boosting weights: `group_size` pairs",
        "train as one stacked step, and pairs (or groups) split over machines; its search-time",
        "indexing (every passage's class in every pair) is linear in passages x pairs and was not",
        "measured here.",
    ]
    if probe:
        lines += _probe_lines(probe, fo)
    lines += sections or []
    lines += [
        "",
        "## Commands",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
    ]
    peak = max(
        (
            int(r.get("disk_bytes_after", 0)) + int(r.get("index_bytes") or 0)
            for r in st.values()
            if isinstance(r, dict)
        ),
        default=0,
    )
    lines.append(
        f"Disk used: {sum(b.values()) / 1e9:,.1f} GB of vectors (passages, training and"
        f" evaluation queries), at most {peak / 1e9:,.1f} GB at once with an index (each index is"
        " deleted after its stage); everything was deleted after the run (`--keep` keeps it)."
    )
    lines.append("")
    return "\n".join(lines)


STORE_KEYS = ("root", "fit_store", "passages", "eval_queries", "train_queries", "snr")
"""Settings that define the store: every stage run must share them."""


def merge(files: list[Path]) -> dict[str, Any]:
    """One results document from per-stage runs of ``bench_scale.py`` (one ``--out`` each).

    Stages are taken in the files' order (a later file's stage replaces an earlier one). The
    document's settings are the last file's; a stage run with other values (its ``--timeout``,
    or options it does not read) keeps them in its ``run_settings``.

    Raises:
        ValueError: runs over different stores (a :data:`STORE_KEYS` setting differs; names the
            files and keys).
    """
    runs = [(f, json.loads(f.read_text())) for f in files]
    last = runs[-1][1]["settings"]
    doc: dict[str, Any] = {"stages": {}, "settings": last, "machine": runs[-1][1].get("machine")}
    for f, run in runs:
        _put_run(doc, f, run, last, STORE_KEYS, f"store than {files[-1]}'s")
    return doc


def _put_run(
    doc: dict[str, Any],
    f: Path,
    run: dict[str, Any],
    base: dict[str, Any],
    keys: tuple[str, ...],
    other: str,
) -> None:
    """Put the stages of ``run`` (read from ``f``) into ``doc``, each with the run's settings
    that differ from ``base`` in its ``run_settings``.

    Raises:
        ValueError: a ``keys`` setting differs from ``base`` (``f: another {other} (...)``).
    """
    mine = run["settings"]
    bad = [k for k in keys if mine.get(k) != base.get(k)]
    if bad:
        raise ValueError(f"{f}: another {other} ({', '.join(bad)} differ)")
    differ = {k: v for k, v in mine.items() if base.get(k) != v and k != "out"}
    for name, res in run["stages"].items():
        doc["stages"][name] = {**res, "run_settings": differ} if differ else res


def update(
    old: dict[str, Any], files: list[Path], old_commit: str, keys: tuple[str, ...] = ("passages",)
) -> dict[str, Any]:
    """``old`` (a results document) with the stages of ``files`` (per-stage runs) put in.

    A stage of ``old`` that no file reran is kept, marked ``measured_at_commit: old_commit`` (the
    commit that last wrote it, unless it already carries one); a rerun stage replaces it, its
    run's settings that differ from ``old``'s kept in its ``run_settings`` (e.g. a search-only
    store written with ``--train-queries 0``).

    Raises:
        ValueError: a run over another collection (a ``keys`` setting differs; names the file).
    """
    doc = json.loads(json.dumps(old))
    base = doc["settings"]
    for res in doc["stages"].values():
        if isinstance(res, dict) and "not_run" not in res:
            res.setdefault("measured_at_commit", old_commit)
    for f in files:
        run = json.loads(f.read_text())
        for name in run["stages"]:
            if isinstance(doc["stages"].get(name), dict) and "not_run" not in doc["stages"][name]:
                doc.setdefault("replaced", {})[name] = doc["stages"][name]
        _put_run(doc, f, run, base, keys, "collection than the results'")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=Path("bench/results/scale/results.json"))
    ap.add_argument("--out", type=Path, default=Path("docs/scale.md"))
    ap.add_argument(
        "--merge", type=Path, nargs="+", help="per-stage results files: merged into --results"
    )
    ap.add_argument(
        "--not-run",
        action="append",
        default=[],
        metavar="STAGE=WHY",
        help="with --merge: record a stage that was not run, and why",
    )
    ap.add_argument(
        "--update",
        type=Path,
        nargs="+",
        help="per-stage results files that replace those stages in --results (the others kept,"
        " marked with the commit that measured them)",
    )
    ap.add_argument(
        "--forest-runs",
        nargs="+",
        metavar="CODE=FILE",
        help="forest stage runs of the memory model (CODE: before / after): written to"
        f" {FOREST_MODEL_FILE} beside --results",
    )
    a = ap.parse_args()
    if a.forest_runs:
        from treerank.atomic import atomic_write_json

        runs = []
        passages = None
        for item in a.forest_runs:
            code, _, name = item.partition("=")
            run = json.loads(Path(name).read_text())
            passages = run["settings"]["passages"]
            runs.append({"code": code, **run["stages"]["forest"]})
        atomic_write_json(
            a.results.parent / FOREST_MODEL_FILE, {"passages": passages, "runs": runs}, indent=1
        )
        print(f"wrote {a.results.parent / FOREST_MODEL_FILE}")
    if a.update:
        import subprocess

        from treerank.atomic import atomic_write_json

        commit = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--", str(a.results)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        doc = update(json.loads(a.results.read_text()), a.update, commit or "unknown")
        for item in a.not_run:
            name, _, why = item.partition("=")
            if not why:
                ap.error(f"--not-run {item!r}: needs STAGE=WHY")
            doc["stages"][name] = {"not_run": why}
        atomic_write_json(a.results, doc)
        print(f"wrote {a.results}")
    elif a.merge:
        from treerank.atomic import atomic_write_json

        doc = merge(a.merge)
        for item in a.not_run:
            name, _, why = item.partition("=")
            if not why or name in doc["stages"]:
                ap.error(f"--not-run {item!r}: needs STAGE=WHY for a stage not in the runs")
            doc["stages"][name] = {"not_run": why}
        atomic_write_json(a.results, doc)
        print(f"wrote {a.results}")
    probe_file = a.results.parent / "probe-100k.json"
    probe = json.loads(probe_file.read_text()) if probe_file.exists() else None
    results = json.loads(a.results.read_text())
    model = forest_memory_lines(
        a.results.parent / FOREST_MODEL_FILE, results["stages"].get("forest", {})
    )
    page = render(results, probe, extra_lines(a.results.parent), model)
    a.out.write_text(page, encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
