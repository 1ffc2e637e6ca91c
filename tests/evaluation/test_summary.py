"""`headline`: the best system, its margin, and the unseen-positive caveat, from hand dicts."""

from __future__ import annotations

from treerank.evaluation.summary import headline, p_text

COMP = {
    "systems": {
        "cosine": {"mean": {"ndcg@10": 0.60}, "n_evaluated": 300},
        "linear": {"mean": {"ndcg@10": 0.75}, "n_evaluated": 300},
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
            }
        }
    },
}
OVERLAP = {
    "n_seen": 200,
    "n_unseen": 100,
    "parts": {
        "unseen": {
            "cosine": {"ndcg@10": {"mean": 0.68}},
            "linear": {"ndcg@10": {"mean": 0.679, "delta": -0.001, "p": 0.9}},
        }
    },
}


def test_headline_names_best_margin_and_caveat() -> None:
    lines = headline("scifact", COMP, "ndcg@10", "cosine", OVERLAP)
    assert lines[0] == (
        "- **scifact** (300 queries evaluated against every passage of the split): best "
        "ndcg@10: `linear` 0.7500, +0.1500 over `cosine` (p < 1e-4, 95% CI +0.100..+0.200)."
    )
    assert lines[1] == (
        "  - but on the 100 queries whose relevant passages were never training positives, "
        "`linear` scores 0.6790 (-0.0010 vs `cosine`, p = 0.9); best there: `cosine` 0.6800. "
        "A trained model's gains on the other queries can be memorised citations."
    )
    assert headline("scifact", {**COMP, "overlap": OVERLAP}, "ndcg@10", "cosine") == lines
    assert len(headline("scifact", COMP, "ndcg@10", "cosine")) == 1
    small = headline("x", COMP, "ndcg@10", "cosine", min_queries=301)[0]
    assert "too few queries" in small and "fewer than 301 evaluated queries" in small
    assert "format path" not in small  # issue 22: no internal note told to every small dataset
    assert p_text(None) == "p n/a" and p_text(0.031) == "p = 0.031"


def test_headline_uses_the_seed_average_never_a_single_seed() -> None:
    comp = {
        "systems": {
            **COMP["systems"],
            "linear@seed0": {"mean": {"ndcg@10": 0.80}, "n_evaluated": 300},
            "linear@seed1": {"mean": {"ndcg@10": 0.70}, "n_evaluated": 300},
        },
        "tests": COMP["tests"],
        "seed_spread": {
            "linear": {
                "seeds": [0, 1],
                "systems": ["linear@seed0", "linear@seed1"],
                "std": {"ndcg@10": 0.0707},
            }
        },
    }
    line = headline("scifact", comp, "ndcg@10", "cosine")[0]
    assert "best ndcg@10: `linear` 0.7500 (mean of 2 training seeds, std 0.0707), +0.1500" in line


def test_memorisation_caveat_only_when_a_trained_model_is_involved() -> None:
    caveat = "A trained model's gains on the other queries can be memorised citations."
    # the trained model is the best system: the caveat stays
    assert headline("s", {**COMP, "trained": ["linear"]}, "ndcg@10", "cosine", OVERLAP)[1].endswith(
        caveat
    )
    # only untrained baselines (bm25 best, cosine best on unseen): no caveat
    base = {
        "systems": {
            "cosine": {"mean": {"ndcg@10": 0.60}, "n_evaluated": 300},
            "bm25": {"mean": {"ndcg@10": 0.68}, "n_evaluated": 300},
        },
        "tests": {"cosine": {"bm25": {"ndcg@10": COMP["tests"]["cosine"]["linear"]["ndcg@10"]}}},
        "trained": [],
    }
    overlap = {
        "n_seen": 200,
        "n_unseen": 100,
        "parts": {
            "unseen": {
                "cosine": {"ndcg@10": {"mean": 0.70}},
                "bm25": {"ndcg@10": {"mean": 0.66, "delta": -0.04, "p": 0.2}},
            }
        },
    }
    lines = headline("s", base, "ndcg@10", "cosine", overlap)
    assert lines[1] == (
        "  - but on the 100 queries whose relevant passages were never training positives, "
        "`bm25` scores 0.6600 (-0.0400 vs `cosine`, p = 0.2); best there: `cosine` 0.7000."
    )
