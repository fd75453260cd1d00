"""The reports' figures: log axes labelled in plain numbers, and axes placed by fixed margins that leave
every label inside the figure and clear of its neighbours (specbatch/commands/figures.py)."""

from __future__ import annotations

import itertools

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from specbatch.commands.figures import place_axes, plain_log_labels  # noqa: E402


def tick_labels(axis) -> list[tuple[float, str]]:
    """(tick value, label) for every labelled tick, major and minor, inside the view, after a draw."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = [*zip(axis.get_majorticklocs(), axis.get_majorticklabels()),
             *zip(axis.get_minorticklocs(), axis.get_minorticklabels())]
    return [(loc, label.get_text()) for loc, label in ticks if lo <= loc <= hi and label.get_text()]


@pytest.mark.parametrize("lo, hi, base, must_show", [
    (0.005, 0.045, 10, {"0.01", "0.02", "0.03", "0.04"}),   # less than a decade: minor ticks labelled too
    (0.05, 500.0, 10, {"0.1", "1", "10", "100"}),             # several decades: the decades
    (1.0, 256.0, 2, {"1", "4", "16", "64", "256"}),           # batch sizes on a base-2 axis
])
def test_log_axes_are_labelled_in_plain_numbers_equal_to_their_ticks(lo, hi, base, must_show):
    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([lo, hi], [lo, hi])
    ax.set_yscale("log", base=base)
    plain_log_labels(ax.yaxis)
    ax.set_ylim(lo, hi)
    fig.canvas.draw()
    labels = tick_labels(ax.yaxis)
    assert must_show <= {text for _, text in labels}
    for loc, text in labels:  # no mathtext, and the number written is the tick's
        assert "$" not in text and float(text) == pytest.approx(loc, rel=1e-6)
    if base == 10 and hi / lo > 1000:  # a wide axis keeps its minor ticks unlabelled, as matplotlib would
        assert all(loc in ax.yaxis.get_majorticklocs() for loc, _ in labels)


def label_boxes(ax, renderer) -> list:
    """Where an axes' labels are drawn: each axis with its tick labels and label, and its titles."""
    titles = {ax.get_title(loc) for loc in ("left", "center", "right")} - {""}
    return [ax.xaxis.get_tightbbox(renderer), ax.yaxis.get_tightbbox(renderer),
            *(t.get_window_extent(renderer) for t in ax.findobj(Text) if t.get_text() in titles)]


def labels_fit(fig) -> None:
    """Every label inside the figure; no label of one axes over another axes' plot or labels; the figure's
    title above them all."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    whole = fig.bbox
    labels = {ax: [box for box in label_boxes(ax, renderer) if box is not None] for ax in fig.axes}
    for box in itertools.chain(*labels.values()):
        assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1 and whole.y0 - 1 <= box.y0 and box.y1 <= whole.y1 + 1
    for a, b in itertools.permutations(fig.axes, 2):
        for box in labels[a]:
            assert not box.overlaps(b.bbox) and not any(box.overlaps(other) for other in labels[b])
    if fig.get_suptitle():
        title = next(t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle()).get_window_extent(renderer)
        assert title.y1 <= whole.y1 + 1 and all(title.y0 >= box.y1 for box in itertools.chain(*labels.values()))


@pytest.mark.parametrize("rows, columns", [(1, 1), (1, 2), (2, 2), (3, 2), (6, 2)])
def test_placed_axes_keep_long_labels_inside_the_figure_and_apart(rows, columns):
    fig = Figure(figsize=(4.2 * columns + 0.6, 2.2 * rows + 0.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat:
        ax.plot([1, 1000], [0.001, 100.0])
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("p99_ttft (s)")
        ax.set_title("h100-llama-3.1-8b-llama-3.2-1b / goodput at 34.45 req/s", fontsize=9)
    place_axes(fig, axes, "Latency vs rate (pooled over seeds); dotted: each policy's max rate", top=0.75,
               row_gap=1.0)
    labels_fit(fig)
