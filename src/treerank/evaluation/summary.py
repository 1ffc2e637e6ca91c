"""The headline of a comparison: the best system, its margin over the baseline, and the caveat.

The caveat is what a researcher must read next to a trained model's gain: on collections whose
test queries cite passages that training queries also cite (SciFact), the gain can be memorised
citations. When the comparison carries the seen / unseen breakdown
(:mod:`treerank.evaluation.overlap`), the headline adds the best system's score on the queries
whose relevant passages were never training positives, and the best system there; the sentence
on memorised citations is added only when one of those two systems is a trained model
(``comparison["trained"]``; a comparison without that entry, written before it existed, is
assumed to involve one).
``treerank evaluate`` prints these lines; the ``treerank run`` report opens with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def p_text(p: float | None) -> str:
    """``"p < 1e-4"``, ``"p = 0.031"`` or ``"p n/a"``."""
    if p is None:
        return "p n/a"
    return "p < 1e-4" if p < 1e-4 else f"p = {p:.2g}"


def headline(
    label: str,
    comparison: Mapping[str, Any],
    metric: str,
    baseline: str,
    overlap: Mapping[str, Any] | None = None,
    min_queries: int = 30,
) -> list[str]:
    """Markdown bullet lines summarising one comparison.

    Args:
        label: what was evaluated (a dataset name), printed in bold.
        comparison: :meth:`Comparison.to_dict` (``systems``, ``tests``).
        metric: the headline metric, e.g. ``"ndcg@10"``.
        baseline: the system the margin is measured against.
        overlap: the seen / unseen breakdown (default: ``comparison["overlap"]``).
        min_queries: below this many evaluated queries no conclusion is drawn.

    Returns:
        One line for the best system, plus one for the unseen-positive breakdown when it has
        unseen queries (ending with the memorisation caveat when the best system overall or
        on the unseen queries is trained); empty without systems.
    """
    systems = comparison.get("systems", {})
    spread = comparison.get("seed_spread") or {}
    # a model trained with several seeds competes with its seed average, never a lucky seed
    single_seeds = {n for g in spread.values() for n in g.get("systems", [])}
    means = {s: v["mean"].get(metric) for s, v in systems.items() if s not in single_seeds}
    means = {s: m for s, m in means.items() if m is not None and m == m}
    if not means:
        return []
    best = max(means, key=lambda s: means[s])
    n_eval = next(iter(systems.values())).get("n_evaluated", 0)
    head = f"- **{label}** ({n_eval} queries evaluated against every passage of the split): "
    if n_eval < min_queries:
        return [
            head + f"too few queries for conclusions (best {metric}: `{best}` "
            f"{means[best]:.4f}; fewer than {min_queries} evaluated queries)."
        ]
    test = comparison.get("tests", {}).get(baseline, {}).get(best, {}).get(metric)
    shown = f"`{best}` {means[best]:.4f}"
    if best in spread and spread[best]["std"].get(metric) is not None:
        shown += (
            f" (mean of {len(spread[best]['seeds'])} training seeds, "
            f"std {spread[best]['std'][metric]:.4f})"
        )
    if best == baseline or test is None:
        line = head + f"best {metric}: {shown}."
    else:
        line = head + (
            f"best {metric}: {shown}, {test['delta']:+.4f} over `{baseline}` "
            f"({p_text(test['p_randomization'])}, "
            f"95% CI {test['ci_low']:+.3f}..{test['ci_high']:+.3f})."
        )
    out = [line]
    ov = overlap if overlap is not None else comparison.get("overlap")
    if ov and ov.get("n_unseen") and metric in next(iter(ov["parts"]["unseen"].values()), {}):
        unseen = ov["parts"]["unseen"]
        u_means = {
            s: c[metric]["mean"]
            for s, c in unseen.items()
            if c[metric]["mean"] is not None and s not in single_seeds
        }
        if not u_means or best not in unseen:
            return out
        u_best = max(u_means, key=lambda s: u_means[s])
        cell = unseen[best][metric]
        text = (
            f"  - but on the {ov['n_unseen']} queries whose relevant passages were never training "
            f"positives, `{best}` scores {cell['mean']:.4f}"
        )
        if "delta" in cell:
            text += f" ({cell['delta']:+.4f} vs `{baseline}`, {p_text(cell.get('p'))})"
        text += f"; best there: `{u_best}` {u_means[u_best]:.4f}"
        ucell = unseen[u_best][metric]
        if "delta" in ucell:
            text += f" ({ucell['delta']:+.4f}, {p_text(ucell.get('p'))})"
        trained = comparison.get("trained")
        if trained is None or best in trained or u_best in trained:
            text += ". A trained model's gains on the other queries can be memorised citations"
        out.append(text + ".")
    return out
