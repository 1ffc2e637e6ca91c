"""Render the measured tables of ``docs/encoding.md`` from the benchmark JSON files.

Reads ``bench/results/embed/backends.json`` (``bench/bench_embed.py``) and
``bench/results/embed/scifact_int8_ndcg.json`` (``bench/bench_onnx_ndcg.py``) and replaces the
text between ``<!-- BEGIN measured -->`` and ``<!-- END measured -->`` in ``docs/encoding.md``.
``tests/encoders/test_encoding_doc.py`` checks that the document equals this rendering, so no
number in it is typed by hand.

Usage: ``python bench/encoding_table.py`` (``--check``: exit 1 when the document is stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "embed"
DOC = REPO / "docs" / "encoding.md"
BEGIN, END = "<!-- BEGIN measured -->", "<!-- END measured -->"


def _load(name: str) -> dict[str, Any] | None:
    p = RESULTS / name
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def render_throughput(doc: dict[str, Any]) -> str:
    """The throughput / latency / memory table of ``backends.json``."""
    t = doc["targets"]
    lines = [
        f"{doc['n_passages']:,} SciFact test passages, {doc['model']}, {doc['threads']} threads "
        f"for every backend, best of {doc['repeats']} interleaved repeats; machine: "
        f"{doc['cpu_count']} CPUs, load average {doc['load_average'][0]:.1f} during the run "
        f"(shared); torch {doc['versions']['torch']}, onnxruntime "
        f"{doc['versions']['onnxruntime']}. Ratio = plain `SentenceTransformer.encode` seconds "
        "/ the backend's `embed_split` seconds (wall clock); CPU ratio the same with process CPU "
        "seconds. Serve latency: one query per request through an in-process `SearchService` "
        f"(cosine over the {doc['n_passages']:,} passages), {doc['serve_queries']} queries.",
        "",
        "| encoder | passages/s | ratio (target) | CPU ratio | padding | min / mean cosine to "
        "plain | peak RSS MiB | serve p50 / p90 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rss_valid = all(m.get("rss_method") == "VmHWM" for m in doc.get("memory", []))
    for name, row in doc["rows"].items():
        if name == "plain":
            lines.append(
                f"| plain `encode` (batch {doc['plain_batch_size']}) | "
                f"{row['passages_per_s']:.1f} | 1.000 | 1.000 | {row['padding']:.1%} | - | - | - |"
            )
            continue
        target = t.get(name)
        ok = "" if target is None else (" ✓" if row["ratio"] >= target else " ✗")
        cpu = "-" if row.get("cpu_ratio") is None else f"{row['cpu_ratio']:.3f}"
        rss = f"{row['peak_rss_mib']:.0f}" if rss_valid else "n/a (see below)"
        lines.append(
            f"| `{name}` | {row['passages_per_s']:.1f} | {row['ratio']:.3f} "
            f"(>= {target}){ok} | {cpu} | {row['padding']:.1%} | "
            f"{row['cosine_to_plain']['min']:.4f} / {row['cosine_to_plain']['mean']:.4f} | "
            f"{rss} | {row['serve_p50_ms']:.1f} / {row['serve_p90_ms']:.1f} |"
        )
    lines.append("")
    if rss_valid:
        lines.append(
            f"Peak RSS: a fresh process embedding {doc['memory_passages']:,} passages with that "
            "backend (model, ONNX session and texts included)."
        )
    else:
        lines.append(
            "Peak RSS: not measured validly in this run -- its child processes read "
            "`ru_maxrss`, which a fork + exec child inherits from the benchmark process (every "
            "backend read the parent's peak). The benchmark now reads `VmHWM`; rerun it."
        )
    return "\n".join(lines)


def render_ndcg(doc: dict[str, Any]) -> str:
    """The nDCG@10 table of ``scifact_int8_ndcg.json``."""
    c = doc["cosine_int8_vs_fp32"]
    if not doc.get("complete", True):
        p, q = c["passages"], c["queries"]
        return (
            f"{doc['dataset']}: **nDCG@10 not measured** -- {doc['note']}. Cosine of the int8 "
            f"vectors to the fp32 ones: {p['n']:,} of {p['of']:,} passages, min {p['min']:.4f}, "
            f"mean {p['mean']:.4f} ({p['below_0.99']} below 0.99); {q['n']} of {q['of']} "
            f"queries, min {q['min']:.4f}, mean {q['mean']:.4f} ({q['below_0.99']} below 0.99)."
        )
    r = doc["results"]
    ok = "✓" if abs(doc["ndcg@10_delta"]) <= doc["target_abs_delta"] else "✗"
    lines = [
        f"{doc['dataset']} ({doc['n_queries']:,} queries, {doc['n_passages']:,} passages), "
        f"{doc['system']}:",
        "",
        "| store | nDCG@10 | recall@10 |",
        "|---|---:|---:|",
        f"| fp32 (`{r['fp32']['backend']}`) | {r['fp32']['ndcg@10']:.4f} | "
        f"{r['fp32']['recall@10']:.4f} |",
        f"| `onnx-int8` | {r['onnx-int8']['ndcg@10']:.4f} | {r['onnx-int8']['recall@10']:.4f} |",
        "",
        f"Difference {doc['ndcg@10_delta']:+.4f} (target within ±{doc['target_abs_delta']}) {ok}; "
        f"{doc['queries_changed_ndcg']} of {doc['n_queries']} queries changed their nDCG@10. "
        "Cosine of every int8 vector to its fp32 one: passages min "
        f"{c['passages']['min']:.4f}, mean {c['passages']['mean']:.4f} "
        f"({c['passages']['below_0.99']} below 0.99); queries min {c['queries']['min']:.4f}, "
        f"mean {c['queries']['mean']:.4f} ({c['queries']['below_0.99']} below 0.99).",
    ]
    return "\n".join(lines)


def render() -> str:
    """The measured section (both tables, or a note where a results file is missing)."""
    parts = []
    thr = _load("backends.json")
    parts.append(
        "### Throughput, memory, serve latency\n\n"
        + (render_throughput(thr) if thr else "_not measured yet_")
    )
    nd = _load("scifact_int8_ndcg.json")
    parts.append(
        "### Retrieval quality of onnx-int8\n\n" + (render_ndcg(nd) if nd else "_not measured yet_")
    )
    return "\n\n".join(parts)


def splice(text: str, section: str) -> str:
    """``text`` with the part between the markers replaced by ``section``.

    Raises:
        ValueError: the markers are missing.
    """
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{section}\n{END}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = splice(text, render())
    if args.check:
        sys.exit(0 if new == text else 1)
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
