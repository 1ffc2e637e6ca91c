"""Comparison tables (rich for the terminal, Markdown for files) and JSON/JSONL writers."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from treerank.atomic import atomic_write_text
from treerank.evaluation.significance import PairedTest

if TYPE_CHECKING:
    from rich.table import Table


def _clean(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def write_json(path: str | Path, obj: object) -> Path:
    """Atomic JSON with NaN/inf written as ``null``."""
    return atomic_write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=False) + "\n")


def remove_stale(root: Path, candidates: Sequence[Path], keep: set[Path]) -> list[str]:
    """Delete the ``candidates`` that exist and are not in ``keep``; their paths relative to
    ``root``, sorted (what an earlier run left that this one did not rewrite)."""
    gone = []
    for p in candidates:
        if p.is_file() and p not in keep:
            p.unlink()
            gone.append(p.relative_to(root).as_posix())
    return sorted(gone)


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _fmt_delta(d: float | None) -> str:
    return "" if d is None or math.isnan(d) else f"{d:+.4f}"


def _fmt_p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return ""
    return "<1e-4" if p < 1e-4 else f"{p:.4f}"


def table_rows(
    means: Mapping[str, Mapping[str, float]],
    tests: Mapping[str, Mapping[str, PairedTest]],
    metrics: Sequence[str],
    baseline: str,
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table: per metric the value, the delta against the
    baseline and the randomization-test p-value (``*`` when p < 0.05)."""
    header = ["system"]
    for m in metrics:
        header += [m, f"Δ {m}", "p"]
    rows = []
    for s, vals in means.items():
        row = [s + (" (baseline)" if s == baseline else "")]
        for m in metrics:
            t = tests.get(s, {}).get(m)
            p = t.p_randomization if t else None
            star = "*" if p is not None and p < 0.05 else ""
            row += [_fmt(vals.get(m)), _fmt_delta(t.delta) if t else "", _fmt_p(p) + star]
        rows.append(row)
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def rich_table(header: list[str], rows: list[list[str]], title: str = "") -> Table:
    """A compact ``rich.table.Table`` of :func:`table_rows`: one column per metric, the value
    over ``delta (p)`` in each cell, so it fits narrow terminals."""
    from rich.table import Table

    t = Table(title=title or None, show_lines=True)
    t.add_column("system", style="bold", overflow="fold")
    metrics = header[1::3]
    for m in metrics:
        t.add_column(m, justify="right")
    for r in rows:
        cells = [r[0]]
        for i in range(len(metrics)):
            v, d, p = r[1 + 3 * i : 4 + 3 * i]
            cells.append(v + (f"\n[dim]{d}\np {p}[/dim]" if d else ""))
        t.add_row(*cells)
    return t
