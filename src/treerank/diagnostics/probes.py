"""Linear probes: what does each representation (e.g. each DRT slot) encode about a query?

Step 2 of the DRT seed's diagnostic procedure. For each labelling of the queries (query type,
entity-bearing, length bucket) and each representation (every DRT slot, the concatenation, the
frozen baseline), a logistic regression is fitted on a 70/30 stratified split (``seed``, 42 by
default) and its held-out accuracy is compared with the majority-class baseline of the same
split. Decision rule (the seed's): if every slot's accuracy is within 1 percentage point of
every other slot's on a task, the slots did not specialise on it.

The labellings are defined in :mod:`treerank.diagnostics.labels`.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from treerank.diagnostics.labels import query_labels

__all__ = ["ProbeResult", "probe_accuracy", "query_labels", "run_probes", "slot_specialisation"]


@dataclass
class ProbeResult:
    """One probe: a representation x a labelling.

    Attributes:
        task, representation: names.
        accuracy: held-out accuracy of the logistic regression (``nan`` when skipped).
        majority: held-out accuracy of predicting the training split's majority class.
        n_train, n_test: split sizes; ``classes``: label counts over the probed queries.
        skipped: why the probe did not run (``None`` when it ran).
    """

    task: str
    representation: str
    accuracy: float
    majority: float
    n_train: int
    n_test: int
    classes: dict[str, int]
    skipped: str | None = None

    @property
    def gain(self) -> float:
        """Accuracy above the majority baseline (percentage points as a fraction)."""
        return self.accuracy - self.majority

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "gain": self.gain}


def probe_accuracy(
    x: np.ndarray,
    labels: Sequence[str],
    *,
    test_size: float = 0.3,
    seed: int = 42,
    max_iter: int = 2000,
    task: str = "",
    representation: str = "",
) -> ProbeResult:
    """Fit a logistic regression on a stratified split and score it on the held-out part.

    Classes with fewer than 2 queries are dropped (a stratified split cannot place them); a
    labelling left with one class, or too few rows to put every class in both halves, is
    reported as skipped with the reason.

    Args:
        x: ``float (n, d)`` representation of ``n`` queries.
        labels: ``n`` string labels.
        test_size: held-out fraction (0.3 = the seed's 70/30).
        seed: split and solver seed (42 = the seed's).

    Returns:
        A :class:`ProbeResult`.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(labels, dtype=object)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"probe: x {x.shape} does not match {y.shape[0]} labels")
    counts = Counter(y.tolist())
    keep = np.array([counts[v] >= 2 for v in y.tolist()], dtype=bool)
    x, y = x[keep], y[keep]
    classes = dict(sorted(Counter(y.tolist()).items()))

    def skipped(reason: str) -> ProbeResult:
        return ProbeResult(task, representation, float("nan"), float("nan"), 0, 0, classes, reason)

    if len(classes) < 2:
        return skipped(f"only one class with >= 2 queries ({classes})")
    n_test = int(np.ceil(test_size * len(y)))
    if n_test < len(classes) or len(y) - n_test < len(classes):
        return skipped(
            f"too few queries ({len(y)}) for a stratified split of {len(classes)} classes"
        )
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=seed
    )
    scaler = StandardScaler().fit(x_tr)
    clf = LogisticRegression(max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings on tiny probes are not errors here
        clf.fit(scaler.transform(x_tr), y_tr)
    acc = float(np.mean(clf.predict(scaler.transform(x_te)) == y_te))
    majority_class = Counter(y_tr.tolist()).most_common(1)[0][0]
    maj = float(np.mean(y_te == majority_class))
    return ProbeResult(task, representation, acc, maj, len(y_tr), len(y_te), classes)


def run_probes(
    representations: dict[str, np.ndarray],
    labels: Mapping[str, Sequence[str]],
    *,
    seed: int = 42,
    test_size: float = 0.3,
) -> list[ProbeResult]:
    """Every (labelling, representation) probe; same split per labelling for every representation.

    Args:
        representations: name -> ``(n, d_name)`` arrays over the same ``n`` queries.
        labels: task name -> ``n`` labels (e.g. from :func:`query_labels`).
    """
    out = []
    for task, y in labels.items():
        for name, x in representations.items():
            out.append(
                probe_accuracy(x, y, test_size=test_size, seed=seed, task=task, representation=name)
            )
    return out


def slot_specialisation(
    results: Sequence[ProbeResult], slot_names: Sequence[str], tol: float = 0.01
) -> dict[str, dict[str, object]]:
    """Per task: the spread of the slots' probe accuracies, judged by the seed's rule plus a
    resolution guard.

    The seed's rule: slots within ``tol`` (1 percentage point) of each other did not specialise.
    On a small held-out set a spread above 1% can be noise (one query of 90 is 1.1%), so the
    verdict per task is:

    * ``"none"``: spread <= ``tol`` (the seed's rule);
    * ``"undetectable"``: spread above ``tol`` but within the 95% noise band of a difference of
      two accuracies on ``n_test`` queries, ``1.96 * sqrt(2 p (1 - p) / n_test)`` (``p`` = mean
      slot accuracy): no specialisation that this probe set can resolve;
    * ``"specialised"``: spread beyond the noise band *and* the best slot beats the majority
      baseline ``m`` by more than ``1.96 * sqrt(m (1 - m) / n_test)`` (it encodes the property);
    * ``"inconclusive"``: spread beyond the noise band but no slot clearly above the majority
      (the slots differ only in how far below chance they fall).

    Returns:
        ``task -> {"min", "max", "spread", "best_slot", "majority", "noise_band",
        "majority_band", "n_test", "verdict", "specialised": verdict == "specialised"}`` for
        tasks where at least two slot probes ran.
    """
    by_task: dict[str, list[ProbeResult]] = {}
    for r in results:
        if r.representation in slot_names and r.skipped is None:
            by_task.setdefault(r.task, []).append(r)
    out: dict[str, dict[str, object]] = {}
    for task, rs in by_task.items():
        if len(rs) < 2:
            continue
        accs = {r.representation: r.accuracy for r in rs}
        lo, hi = min(accs.values()), max(accs.values())
        n_test = rs[0].n_test
        p = float(np.mean(list(accs.values())))
        noise = 1.96 * float(np.sqrt(2 * p * (1 - p) / max(n_test, 1)))
        majority = rs[0].majority
        majority_band = 1.96 * float(np.sqrt(majority * (1 - majority) / max(n_test, 1)))
        if hi - lo <= tol:
            verdict = "none"
        elif hi - lo <= noise:
            verdict = "undetectable"
        elif hi - majority > majority_band:
            verdict = "specialised"
        else:
            verdict = "inconclusive"
        out[task] = {
            "min": lo,
            "max": hi,
            "spread": hi - lo,
            "best_slot": max(accs, key=lambda k: accs[k]),
            "majority": majority,
            "noise_band": noise,
            "majority_band": majority_band,
            "n_test": n_test,
            "verdict": verdict,
            "specialised": verdict == "specialised",
        }
    return out
