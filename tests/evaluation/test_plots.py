"""Comparison plots: titles name the dataset; deltas carry the paired CIs."""

from __future__ import annotations

from pathlib import Path

from treerank.evaluation.plots import dataset_label, delta_rows, plot_deltas, plot_recall_curve

TESTS = {
    "bm25": {"ndcg@10": {"delta": 0.031, "ci_low": -0.006, "ci_high": 0.068}},
    "linear": {
        "ndcg@10": {"delta": 0.135, "ci_low": 0.1, "ci_high": 0.17},
        "mrr@10": {"delta": 0.14, "ci_low": 0.1, "ci_high": 0.18},
    },
}


def test_dataset_label_from_store_path() -> None:
    assert dataset_label("runs/sample/stores/scifact/test") == "scifact/test"
    assert dataset_label(None, "test") == "test"


def test_delta_rows_keep_delta_and_paired_ci() -> None:
    assert delta_rows(TESTS, ["ndcg@10"]) == [
        ("bm25", "ndcg@10", 0.031, -0.006, 0.068),
        ("linear", "ndcg@10", 0.135, 0.1, 0.17),
    ]
    assert delta_rows(TESTS, ["mrr@10"]) == [("linear", "mrr@10", 0.14, 0.1, 0.18)]


def test_plots_write_pngs(tmp_path: Path) -> None:
    p = plot_deltas(TESTS, ["mrr@10", "ndcg@10"], "cosine", tmp_path / "d.png", "scifact/test")
    assert p.read_bytes()[:4] == b"\x89PNG"
    r = plot_recall_curve({"cosine": {1: 0.2, 10: 0.6}}, tmp_path / "r.png", "scifact/test")
    assert r.stat().st_size > 1000


# ------------------------------------------------------------ issue 22: what the figures draw
import pytest  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """Capture the figures the plot functions save (they are inspected, not written)."""
    import treerank.atomic
    import treerank.diagnostics.report
    import treerank.evaluation.plots
    import treerank.training.history

    caught: list = []

    def fake(fig, path, **kw):
        caught.append(fig)
        return Path(path)

    for mod in (
        treerank.atomic,
        treerank.diagnostics.report,
        treerank.evaluation.plots,
        treerank.training.history,
    ):
        monkeypatch.setattr(mod, "atomic_savefig", fake)
    return caught


def _text(fig) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def _legend_clear_of_axes(fig, ax) -> None:
    """The legend lies wholly right of the axes: it can cover no bar and no line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # pyplot.close() left the figure a bare canvas
    canvas.draw()
    r = canvas.get_renderer()
    legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert legends
    for leg in legends:
        assert leg.get_window_extent(r).x0 >= ax.get_window_extent(r).x1


def test_deltas_without_anything_to_compare_says_so(figures) -> None:
    plot_deltas({}, ["ndcg@10"], "cosine", "d.png", "mybeir/test")
    plot_deltas({}, ["ndcg@10"], "cosine", "d.png", "mybeir/test", failed=["ckpt:ckpt/x"])
    only, failed = figures
    assert len(only.axes) == 1 and "only the baseline was scored" in _text(only)
    assert "failed: ckpt:ckpt/x" in _text(failed)
    plot_deltas(TESTS, ["mrr@10", "ndcg@10"], "cosine", "d.png", "scifact/test")
    assert len(figures[-1].axes) == 2  # one panel per metric as before


def test_recall_curve_stops_at_the_corpus_size(figures) -> None:
    from treerank.evaluation.plots import recall_curve_ks

    curve = {k: min(k / 30, 1.0) for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)}
    assert recall_curve_ks(curve, 30) == [1, 2, 5, 10, 20, 50]
    assert recall_curve_ks(curve, 5000) == sorted(curve)
    plot_recall_curve({"cosine": curve}, "r.png", "mybeir/test", n_passages=30)
    (line,) = figures[0].axes[0].get_lines()
    assert list(line.get_xdata()) == [1, 2, 5, 10, 20, 50]
    _legend_clear_of_axes(figures[0], figures[0].axes[0])


def test_training_curve_with_one_logged_step_draws_its_point(figures) -> None:
    from treerank.training.history import plot_curves

    records = [
        {"kind": "train", "step": 1, "loss": 2.1, "chance_loss": 3.4},
        {"kind": "eval", "step": 0, "ndcg@10": 0.9},
        {"kind": "eval", "step": 1, "ndcg@10": 0.8},
    ]
    plot_curves(records, "c.png")
    loss, chance = figures[0].axes[0].get_lines()[:2]
    assert list(loss.get_ydata()) == [2.1] and loss.get_marker() == "o"
    assert chance.get_marker() == "o"


def test_variants_legend_never_covers_a_bar(figures) -> None:
    from treerank.diagnostics.report import plot_variants

    results = {
        "meta": {"metric": "ndcg@10", "baseline": "cosine", "store": "stores/mybeir/test"},
        "baseline": {"mean": {"ndcg@10": 0.93}},
        "variants": {
            "variants": {f"slot{i}": {"mean": {"ndcg@10": v}} for i, v in enumerate([0.5, 1.0])}
        },
    }
    plot_variants(results, Path("v.png"))
    fig = figures[0]
    _legend_clear_of_axes(fig, fig.axes[0])


def test_lexical_gap_legend_outside_distinct_lines_and_integer_counts(figures) -> None:
    from treerank.diagnostics.lexical_gap import plot_lexical_gap

    doc = {
        "metric": "ndcg@10",
        "buckets": [
            {"bucket": b, "n": n, "systems": {"cosine": 0.8, "lin": 0.8}}
            for b, n in (("0-0.25", 1), ("0.25-0.5", 3), ("0.5-1", 2))
        ],
    }
    plot_lexical_gap(doc, "g.png")
    fig = figures[0]
    ax, ax2 = fig.axes
    _legend_clear_of_axes(fig, ax)
    cosine, lin = ax2.get_lines()
    assert (cosine.get_linestyle(), cosine.get_marker()) != (lin.get_linestyle(), lin.get_marker())
    assert cosine.get_markersize() > lin.get_markersize()  # the one below stays visible
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
