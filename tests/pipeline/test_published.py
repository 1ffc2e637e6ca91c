"""README numbers come from a report: the block equals the render of the committed results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from treerank.pipeline.published import BEGIN, END, extract, read_block, render, replace_block

REPO = Path(__file__).resolve().parents[2]


def _comparison() -> dict:
    return {
        "settings": {"n_queries": 300, "n_passages": 5183, "n_permutations": 10000, "seed": 0},
        "metrics": ["mrr@10", "ndcg@10"],
        "baseline": "cosine",
        "systems": {
            "cosine": {"mean": {"mrr@10": 0.6, "ndcg@10": 0.64}, "n_evaluated": 300},
            "linear@seed0": {"mean": {"mrr@10": 0.74, "ndcg@10": 0.78}, "n_evaluated": 300},
            "linear@seed1": {"mean": {"mrr@10": 0.76, "ndcg@10": 0.80}, "n_evaluated": 300},
            "linear": {"mean": {"mrr@10": 0.75, "ndcg@10": 0.79}, "n_evaluated": 300},
        },
        "tests": {
            "cosine": {
                "linear": {
                    "ndcg@10": {
                        "delta": 0.15,
                        "p_randomization": 0.00001,
                        "ci_low": 0.1,
                        "ci_high": 0.2,
                    }
                },
                "linear@seed0": {"ndcg@10": {"delta": 0.14, "p_randomization": 0.00001}},
            }
        },
        "seed_spread": {
            "linear": {
                "seeds": [0, 1],
                "systems": ["linear@seed0", "linear@seed1"],
                "per_seed": {"ndcg@10": [0.78, 0.80], "mrr@10": [0.74, 0.76]},
                "mean": {"ndcg@10": 0.79, "mrr@10": 0.75},
                "std": {"ndcg@10": 0.0141, "mrr@10": 0.0141},
            }
        },
    }


def test_render_by_hand() -> None:
    report = {
        "experiment": "sample",
        "created": "2026-12-01 01:00:00 UTC",
        "seconds_this_run": 300.0,
        "encoder": {"name": "all-MiniLM-L6-v2"},
        "datasets": {
            "scifact": {
                "eval_split": "test",
                "comparison": _comparison(),
                "overlap": None,
                "diagnostics": None,
            }
        },
    }
    md = render(extract(report, "scifact"), metrics=("mrr@10", "ndcg@10"))
    rows = md.splitlines()
    assert (
        rows[0].startswith("- **scifact** (300 queries evaluated") and "`linear` 0.7900" in rows[0]
    )
    assert "| cosine | 0.6000 | 0.6400 |  |" in rows
    assert "| linear (2 seeds) | 0.7500 ± 0.0141 | 0.7900 ± 0.0141 | +0.150, p < 1e-4 |" in rows
    assert not any(r.startswith("| linear@seed") for r in rows)  # never a single seed
    assert "| linear | 0, 1 | 0.7800, 0.8000 | 0.7900 | 0.0141 |" in rows
    assert rows[-1] == "From `sample`'s report of 2026-12-01 01:00:00 UTC (that run: 5.0 min)."
    with pytest.raises(KeyError):
        extract(report, "nope")


def test_replace_block_round_trips() -> None:
    text = f"intro\n{BEGIN}\nold\n{END}\nafter\n"
    new = replace_block(text, "new\n")
    assert read_block(new) == "new\n" and new.startswith("intro\n") and new.endswith("after\n")
    with pytest.raises(ValueError, match="no generated block"):
        read_block("no markers")


def test_published_numbers_equal_the_committed_report_results() -> None:
    """docs/results/sample.md holds the render of the committed results (scripts/gen_docs.py
    writes it; tests/test_docs.py checks every generated page, the README's headline too)."""
    doc = json.loads((REPO / "docs" / "results" / "sample.json").read_text())
    assert read_block((REPO / "docs" / "results" / "sample.md").read_text()) == render(doc)
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "readme_results.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


def test_published_block_states_what_reproduces_across_cpus() -> None:
    """The committed results with the stated tolerances: the forest (reduction-order dependent)
    may move by up to 0.01 on another CPU, every other system by the printed decimals only."""
    import copy

    from treerank.families import family
    from treerank.pipeline.published import EXACT_TOLERANCE, cpu_order_systems, mismatches

    cross = family("forest").cross_cpu
    assert cross is not None
    CPU_ORDER_TOLERANCE = cross.tolerance  # the forest family's hook

    doc = json.loads((REPO / "docs" / "results" / "sample.json").read_text())
    seeds = [f"forest-random@seed{i}" for i in range(3)]  # the untrained twin's three seeds
    # ... and the main job's fine-tuned query tower (the encoder's training: its own bound)
    assert set(cpu_order_systems(doc)) == {"forest", "forest-random", *seeds, "query-tower"}
    block = render(doc)
    assert "except forest, forest-random: the forest's class assignments" in block
    assert "; and query-tower: the fine-tuned encoder's training sums floats" in block
    assert f"within {CPU_ORDER_TOLERANCE:g}" in block and f"within {EXACT_TOLERANCE:g}" in block
    assert mismatches(doc, doc) == []

    # the observed cross-CPU move of the forest (0.4932 -> 0.4891 nDCG@10) is within tolerance
    other_cpu = copy.deepcopy(doc)
    other_cpu["comparison"]["systems"]["forest"]["mean"]["ndcg@10"] -= 0.0041
    assert mismatches(doc, other_cpu) == []
    # ... a move of 0.02 is not, and neither is cosine moving by 0.001
    far = copy.deepcopy(doc)
    far["comparison"]["systems"]["forest"]["mean"]["ndcg@10"] -= 0.02
    (only,) = mismatches(doc, far)
    assert only.startswith("forest ndcg@10: published")
    cos = copy.deepcopy(doc)
    cos["comparison"]["systems"]["cosine"]["mean"]["mrr@10"] += 0.001
    assert len(mismatches(doc, cos)) == 1
    del cos["comparison"]["systems"]["bm25"]
    assert any(m.startswith("bm25 ") for m in mismatches(doc, cos))

    # a report's family record decides, not the system's name
    named = copy.deepcopy(doc)
    named["families"] = {"forest": "forest", "linear-sources": "linear"}
    assert cpu_order_systems(named) == ["forest"]
    named["families"] = {"forest": "linear"}
    assert cpu_order_systems(named) == []


def test_a_family_hook_not_a_family_name_decides_the_cross_cpu_tolerance() -> None:
    """A plugin family with a ``cross_cpu`` entry gets its own tolerance and reason in the note;
    the forest's comes from its family entry (no generic module names it)."""
    import copy

    from treerank.families import FAMILIES, CrossCpu, ModelFamily, register_family
    from treerank.pipeline.published import EXACT_TOLERANCE, cpu_order_systems, tolerance

    doc = json.loads((REPO / "docs" / "results" / "sample.json").read_text())
    assert tolerance(doc, "forest") == 0.01 and tolerance(doc, "cosine") == EXACT_TOLERANCE
    register_family(
        ModelFamily("toy-sums", "m:C", cross_cpu=CrossCpu(0.03, "toy sums in reduction order"))
    )
    try:
        mine = copy.deepcopy(doc)
        mine["families"] = {"linear-sources": "toy-sums"}
        assert cpu_order_systems(mine) == ["linear-sources"]
        assert tolerance(mine, "linear-sources") == 0.03
        assert tolerance(mine, "forest") == EXACT_TOLERANCE  # not a forest run in this record
        block = render(mine)
        assert "except linear-sources: toy sums in reduction order, so on another CPU" in block
        assert "within 0.03 (on the same machine, exactly)" in block
    finally:
        FAMILIES.pop("toy-sums")


def test_the_report_training_row_shows_the_family_report_fields() -> None:
    from treerank.families import FAMILIES, ModelFamily, register_family
    from treerank.pipeline.report import _training_rows

    summary = {"steps": 3, "n_models": 8, "max_entropy": 0.5, "width": 4}
    forest = _training_rows("f", {"family": "forest", "summary": summary})
    assert forest == ["| `f` | steps=3, n_models=8, max_entropy=0.5 |"]
    dense = _training_rows("l", {"family": "linear", "summary": summary})
    assert dense == ["| `l` | steps=3 |"]  # the forest's fields are the forest's
    register_family(ModelFamily("toy-wide", "m:C", report_fields=("width",)))
    try:
        wide = _training_rows("w", {"family": "toy-wide", "summary": summary})
        assert wide == ["| `w` | steps=3, width=4 |"]
    finally:
        FAMILIES.pop("toy-wide")


def test_an_encoder_finetune_row_shows_its_cost_and_its_system_states_its_tolerance() -> None:
    """The main job's fine-tune (issue 35): its training row (a record marked
    ``encoder_finetune``) shows its counts and cost, and the published block says its numbers
    depend on the CPU's reduction order (the report's training record marks it, whatever the
    system is called)."""
    import copy

    from treerank.pipeline.published import ENCODER_CROSS_CPU, cpu_order_systems, tolerance
    from treerank.pipeline.report import _training_rows

    rec = {
        "family": "query-tower",
        "encoder_finetune": True,
        "summary": {"training_queries": 809, "steps": 56, "seconds": 80.5, "tokens": 1200,
                    "cpu_seconds": 75.25, "peak_rss_mib": 1700.0, "train_loss": 0.5,
                    "precision": "fp32"},
    }  # fmt: skip
    (row,) = _training_rows("qt", rec)
    assert row == (
        "| `qt` | training_queries=809, steps=56, seconds=80.5, train_loss=0.5, cpu_seconds=75.25, "
        "peak_rss_mib=1700, tokens=1200, precision=fp32 |"
    )
    doc = json.loads((REPO / "docs" / "results" / "sample.json").read_text())
    mine = copy.deepcopy(doc)
    mine["comparison"]["systems"]["tuned"] = copy.deepcopy(doc["comparison"]["systems"]["cosine"])
    assert "tuned" not in cpu_order_systems(mine)  # no record: exact, like cosine
    mine["families"] = {**doc["families"], "tuned": "query-tower"}
    assert "tuned" in cpu_order_systems(mine)
    assert tolerance(mine, "tuned") == ENCODER_CROSS_CPU.tolerance == 0.01
    assert "tuned: the fine-tuned encoder's training sums floats" in render(mine)
    # extract() takes the record from the report's training section
    report = {"datasets": {"d": {"comparison": doc["comparison"], "training": {"tuned": rec}}}}
    assert extract(report, "d")["families"] == {"tuned": "query-tower"}
