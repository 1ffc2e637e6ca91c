"""Query labellings and linear probes."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.diagnostics.labels import factoid_type, is_entity_bearing, length_bucket, query_labels
from treerank.diagnostics.probes import (
    ProbeResult,
    probe_accuracy,
    run_probes,
    slot_specialisation,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("who wrote hamlet", "person"),
        ("where is the eiffel tower", "location"),
        ("what country has the most lakes", "location"),
        ("how many calories in an egg", "numeric"),
        ("when did ww2 end", "numeric"),
        ("why is the sky blue", "description"),
        ("define photosynthesis", "description"),
        ("what is a b cell", "entity"),
        ("0-dimensional biomaterials show inductive properties.", "numeric"),  # a SciFact claim
        ("ALDH1 expression is associated with poorer prognosis.", "description"),
        (
            "Deletion of αvβ8 does not result in a spontaneous inflammatory phenotype.",
            "description",
        ),
        (
            "Pretreatment with the Arp2/3 inhibitor CK-666 affects lamelliopodia formation.",
            "description",
        ),
        ("Arginine 90 in p150n is important for interaction with EB1.", "numeric"),
        ("Up to 50% of patients relapse.", "numeric"),
    ],
)
def test_factoid_type(text: str, want: str) -> None:
    assert factoid_type(text) == want


def test_entity_and_length() -> None:
    assert is_entity_bearing("ALDH1 expression is associated with poor prognosis")
    assert is_entity_bearing("levels of IL-6 rise")
    assert is_entity_bearing("the patients in Denmark")
    assert not is_entity_bearing("Cells divide quickly under stress")
    assert [
        length_bucket(t)
        for t in ("a b c d e", "a b c d e f", " ".join("x" * 10), " ".join("x" * 11))
    ] == [
        "<=5",
        "6-10",
        "6-10",
        "11+",
    ]
    labels = query_labels(["who is he", "why"], query_types=["PERSON", "DESCRIPTION"])
    assert labels["query_type"] == ["person", "description"]
    assert query_labels(["who is he"], query_types=[""])["query_type"] == ["person"]  # fallback


def test_probe_on_separable_and_noise() -> None:
    rng = np.random.default_rng(0)
    y = np.array(["a"] * 70 + ["b"] * 30)
    x_sep = rng.standard_normal((100, 4))
    x_sep[:, 0] += np.where(y == "a", 5.0, -5.0)
    r = probe_accuracy(x_sep, y.tolist(), task="t", representation="sep")
    assert r.accuracy == 1.0 and r.majority == pytest.approx(0.7) and r.n_test == 30
    assert r.classes == {"a": 70, "b": 30} and r.gain == pytest.approx(0.3)
    noise = probe_accuracy(rng.standard_normal((100, 4)), y.tolist())
    assert noise.accuracy < 0.9


def test_probe_skips_degenerate_labels() -> None:
    x = np.zeros((10, 2))
    r = probe_accuracy(x, ["a"] * 9 + ["b"])  # "b" has one query: dropped, one class left
    assert r.skipped is not None and np.isnan(r.accuracy)


def test_run_probes_and_specialisation() -> None:
    rng = np.random.default_rng(1)
    y = ["a"] * 50 + ["b"] * 50
    good = rng.standard_normal((100, 3))
    good[:50, 0] += 4
    reps = {"slot-0": good, "slot-1": rng.standard_normal((100, 3))}
    res = run_probes(reps, {"t": y})
    assert [r.representation for r in res] == ["slot-0", "slot-1"]
    spec = slot_specialisation(res, ["slot-0", "slot-1"])
    assert spec["t"]["verdict"] == "specialised" and spec["t"]["best_slot"] == "slot-0"
    p = np.mean([r.accuracy for r in res])
    assert spec["t"]["noise_band"] == pytest.approx(1.96 * np.sqrt(2 * p * (1 - p) / 30))
    same = run_probes({"slot-0": good, "slot-1": good.copy()}, {"t": y})
    assert slot_specialisation(same, ["slot-0", "slot-1"])["t"]["verdict"] == "none"
    # a spread above 1% but inside the noise band of 30 held-out queries is not resolvable
    jitter = np.random.default_rng(5).standard_normal((100, 3))
    noisy = run_probes({"slot-0": good, "slot-1": good + 0.3 * jitter}, {"t": y})
    v = slot_specialisation(noisy, ["slot-0", "slot-1"])["t"]
    assert v["spread"] == pytest.approx(1 / 30) and v["verdict"] == "undetectable"  # 1 of 30
    # beyond the noise band, but every slot at or below the majority: inconclusive
    low = ProbeResult("t", "slot-1", 0.1, 0.5, 70, 30, {"a": 50, "b": 50})
    top = ProbeResult("t", "slot-0", 0.5, 0.5, 70, 30, {"a": 50, "b": 50})
    assert slot_specialisation([top, low], ["slot-0", "slot-1"])["t"]["verdict"] == "inconclusive"
