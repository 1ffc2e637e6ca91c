"""Splice generated result tables into the forest's pages (:data:`PAGES`).

Every block between ``<!-- begin generated: PATH -->`` and ``<!-- end generated -->`` is replaced
by the contents of ``PATH`` (relative to the repository root; a ``table.md`` written by
``bench/bench_forest_twins.py`` or ``bench/bench_forest_rescore.py``), so no measured number in
the document is typed by hand. It first writes the generated pages that come from several
results files: the issue-27 targets section of a dataset (:func:`targets_section`, from its
``bench_forest_twins`` and ``bench_forest_rescore`` results) and the Scale section's memory
table. Run: ``python bench/forest_docs.py``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- begin generated: (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def splice(text: str, root: Path) -> str:
    """``text`` with every generated block refreshed from its file."""

    def fill(m: re.Match[str]) -> str:
        body = (root / m.group(2)).read_text()
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)

    return BLOCK.sub(fill, text)


PAGES = (REPO / "docs" / "forest.md", REPO / "docs" / "research" / "forest.md")
"""The reference (no generated block today) and the measured history, where the tables live."""

MEMORY_JSON = REPO / "bench" / "results" / "forest_memory.json"
MEMORY_TABLE = REPO / "bench" / "results" / "forest_memory.md"


def memory_table(result: dict) -> str:
    """The Scale section's table of one block-wise forest pair at C = 1,000
    (``bench/results/forest_memory.json``, written by ``bench/bench_forest_scale.py``)."""
    rows = [
        ("training queries x dim", f"{result['train_queries']:,} x {result['dim']}"),
        ("passages in the store", f"{result['passages']:,}"),
        ("passage rows of the pair (shared + random pool)", f"{result['passage_rows']:,}"),
        (
            "examples (selected / non-selected per query)",
            f"{result['positive_examples']:,} / {result['random_negatives']} random "
            f"+ {result['judged_negatives']} judged",
        ),
        (
            "classes C / pairs / steps per stage",
            f"{result['classes']} / {result['pairs']} / {result['steps_per_stage']}",
        ),
        ("chunk_size / threads", f"{result['chunk_size']:,} / {result['threads']}"),
        ("store build (s)", f"{result['store_build_seconds']:.0f}"),
        ("seconds for the pair (wall)", ", ".join(f"{s:.0f}" for s in result["seconds_per_pair"])),
        ("peak RSS after building the store (GiB)", f"{result['peak_rss_gib_after_store']:.2f}"),
        ("**peak RSS of the whole run (GiB)**", f"**{result['peak_rss_gib']:.2f}**"),
        (
            "logits + gradients the trainer held whole before (GiB, from the shapes)",
            f"{result['whole_logits_and_gradients_gib']:.2f}",
        ),
    ]
    lines = ["| quantity | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def envelope_at(points: list[tuple[float, float]], x: float) -> float | None:
    """The upper envelope of ``(cost, recall)`` points, read at cost ``x``: the best recall of
    the points costing at most ``x``, linearly interpolated in ``log cost`` between the
    envelope's corners; ``None`` when every point costs more than ``x``."""
    pts = sorted((c, r) for c, r in points if c > 0)
    hull: list[tuple[float, float]] = []
    for c, r in pts:  # non-decreasing staircase of the best recall so far
        if not hull or r > hull[-1][1]:
            hull.append((c, r))
    if not hull or x < hull[0][0]:
        return None
    for (c0, r0), (c1, r1) in zip(hull, hull[1:], strict=False):
        if c0 <= x < c1:
            return r0 + (r1 - r0) * (math.log(x) - math.log(c0)) / (math.log(c1) - math.log(c0))
    return hull[-1][1]


def _fmt(v: float | None) -> str:
    return "out of reach" if v is None else f"{v:.3f}"


def targets_section(twins: dict, first: dict) -> str:
    """Issue 27's targets read off ``bench_forest_twins`` and ``bench_forest_rescore`` results
    of one dataset (markdown; every number from the two documents)."""
    out: list[str] = []
    # 1. trained vs the strongest twin per M
    rows = [r for r in twins["rows"] if r["part"] == "all"]
    variants: list[str] = []
    for r in rows:
        variants += [v for v in r["vs_strongest_twin"] if v not in variants]
    out += [
        "**1. Trained forest against its strongest untrained twin, same M, C, t and scoring** "
        "(nDCG@10 delta, paired randomization p; the target: delta > 0 with p < 0.05 at every "
        "M up to 256):",
        "",
        "| variant | t | scoring | "
        + " | ".join(f"M = {m}" for m in sorted({r["n_models"] for r in rows}))
        + " | target met |",
        "|---|---|---|" + "---|" * (len({r["n_models"] for r in rows}) + 1),
    ]
    ms = sorted({r["n_models"] for r in rows})
    for v in variants:
        for t, sc in dict.fromkeys((r["probe"], r["scoring"]) for r in rows):
            cells, wins = [], []
            for m in ms:
                r = next(x for x in rows if (x["n_models"], x["probe"], x["scoring"]) == (m, t, sc))
                d = r["vs_strongest_twin"].get(v, {}).get("ndcg@10")
                if d is None:
                    cells.append("not trained")
                    wins.append(False)
                    continue
                cells.append(f"{d['delta']:+.3f} (p {d['p']:.2g}, vs {r['strongest_twin']})")
                wins.append(d["delta"] > 0 and d["p"] < 0.05)
            met = (
                "yes"
                if all(wins) and max(ms) >= 256
                else ("no" if not all(wins) else "only up to M = " + str(max(ms)))
            )
            out.append(f"| {v} | {t} | `{sc}` | " + " | ".join(cells) + f" | {met} |")
    # 2. budgets
    pts = first["rows"]
    forest = [r for r in pts if r["system"] == "forest"]
    refs = [r for r in pts if r["system"] in ("random twin", "ivf-flat")]
    out += [
        "",
        "**2. First stage: Recall@100 of exact cosine's top 100 at another system's budget** "
        "(the forest's upper envelope over all its points, M prefixes, t and depths, "
        "interpolated in log cost, among its points that score at most the reference's "
        "passages; *out of reach*: every such forest point costs more):",
        "",
        "| reference | postings / query | index B / passage | scored / query | its recall | "
        "forest at its postings | forest at its bytes | more of cosine's top 100 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ref in refs:
        cand = [f for f in forest if f["scored_per_query"] <= 1.01 * ref["scored_per_query"]]
        at_p = envelope_at(
            [(f["postings_per_query"], f["recall100_vs_cosine"]) for f in cand],
            ref["postings_per_query"],
        )
        at_b = envelope_at(
            [(f["index_bytes_per_passage"], f["recall100_vs_cosine"]) for f in cand],
            ref["index_bytes_per_passage"],
        )
        rr = ref["recall100_vs_cosine"]
        ok = [v for v in (at_p, at_b) if v is not None]
        verdict = "forest" if len(ok) == 2 and min(ok) > rr else ref["system"]
        out.append(
            f"| {ref['system']} {ref['setting']} | {ref['postings_per_query']:.0f} | "
            f"{ref['index_bytes_per_passage']:.1f} | {ref['scored_per_query']:.0f} | {rr:.3f} | "
            f"{_fmt(at_p)} | {_fmt(at_b)} | {verdict} |"
        )
    # 3. forest then cosine at <= 2 % scored
    cos = next(r for r in pts if r["system"] == "exact cosine")["parts"]["all"]["ndcg@10"]
    out += [
        "",
        f"**3. Forest then cosine, within 0.001 nDCG@10 of exact cosine ({cos:.4f}) at "
        "<= 2 % of the passages scored?**",
        "",
    ]
    for system in ("forest", "random twin"):
        cand = [r for r in pts if r["system"] == system and r["fraction_scored"] <= 0.02]
        if not cand:
            out.append(f"* {system}: no point at <= 2 % scored.")
            continue
        best = max(cand, key=lambda r: r["parts"]["all"]["ndcg@10"])
        gap = best["parts"]["all"]["ndcg@10"] - cos
        out.append(
            f"* {system}: best {best['parts']['all']['ndcg@10']:.4f} ({gap:+.4f}) at "
            f"{best['setting']}, {100 * best['fraction_scored']:.1f} % scored: "
            + ("**met**" if gap >= -0.001 else "**not met**")
        )
    # 4. moonshot
    best_alone = max(
        (r["mean"][v]["ndcg@10"], v, r["n_models"], r["probe"], r["scoring"])
        for r in rows
        for v in r["vs_strongest_twin"]
    )
    c0 = rows[0]["cosine"]["ndcg@10"]
    out += [
        "",
        f"**4. Moonshot, forest alone within 0.05 of cosine ({c0:.3f}):** best trained forest "
        f"alone {best_alone[0]:.3f} ({best_alone[1]}, M = {best_alone[2]}, t = {best_alone[3]}, "
        f"`{best_alone[4]}`): "
        + ("**met**" if best_alone[0] >= c0 - 0.05 else "**not met**")
        + " (M = 1,024 not run).",
    ]
    return "\n".join(out) + "\n"


TARGETS = {
    # dataset: (bench_forest_twins results, bench_forest_rescore results, generated section)
    "squad": (
        REPO / "docs" / "results" / "forest_twins_squad" / "results.json",
        REPO / "docs" / "results" / "forest_first_stage_squad" / "results.json",
        REPO / "docs" / "results" / "forest_targets_squad.md",
    ),
}


def main() -> None:
    if MEMORY_JSON.is_file():
        MEMORY_TABLE.write_text(memory_table(json.loads(MEMORY_JSON.read_text())))
    for twins, first, section in TARGETS.values():
        if twins.is_file() and first.is_file():
            section.write_text(
                targets_section(json.loads(twins.read_text()), json.loads(first.read_text()))
            )
    for doc in PAGES:
        doc.write_text(splice(doc.read_text(), REPO))


if __name__ == "__main__":
    main()
