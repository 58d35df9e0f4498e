"""The figures read at a glance, measured from matplotlib's renderer at the size the dashboard shows
them (1:1, ``PLOT_WIDTH`` px at 1280x800): for 1 to 6 tasks with 2 linked sets each, every axes at
least 200x110 px, every text at least 10 px, nothing outside the figure, no two texts over each other,
no legend over an axes; one step axis, the clipped share only when something was clipped, panels for
combine weights and task cosines, a loss axis never padded below 0, zoom and read-out.
Headless (Agg), no kernel."""

from __future__ import annotations

import math

import pandas as pd
import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from helpers.dashboards import many_tasks

from mtlab import plots  # noqa: E402
from mtlab.ui.liveplot import PRESENTATION_SCALE, LivePlot  # noqa: E402
from helpers.figures import MIN_TEXT_PX, PLOT_WIDTH, all_texts, overlaps, readability  # noqa: E402

STEPS = list(range(1, 301))


def history(clipped: bool = True, method: bool = True) -> pd.DataFrame:
    """A history with everything a panel can show and events crowded at a few steps."""
    rows = []
    for s in STEPS:
        w = 0.5 if 10 <= s < 13 else 1.0  # weight changes at steps 10, 11 (lr) and 13, 14: crowded events
        rows.append({
            "step": s, "lr": 1e-2 if s < 11 or s >= 14 else 5e-3, "a/weight": w, "b/weight": 1.0,
            "a/clean/weight": 1.0 if s < 150 else 0.25, "a/loss": 2.0 / math.sqrt(s), "a/clean/loss": 2.1 / math.sqrt(s),
            "a/noisy/loss": 2.3 / math.sqrt(s), "b/loss": 1.0 + 0.5 / s, "a/grad_norm": 1.0 / s, "b/grad_norm": 0.5,
            "a/grad_norm_clipped": 0.8 / s, "b/grad_norm_clipped": 0.4, "direction_norm": 0.7,
            "a/clip_fraction": (0.1 if s % 7 == 0 else 0.0) if clipped else 0.0, "b/clip_fraction": 0.0,
            **({"combine/enc/a": 0.4 + 0.001 * s, "combine/enc/b": 0.6, "cos/enc/a,b": math.cos(s / 30)}
               if method else {}),
        })
    return pd.DataFrame(rows)


def live_figure(n: int, clipped: bool, method: bool = False, font_scale: float = 1.0) -> LivePlot:
    tasks, df, valid = many_tasks(n, clipped, method)
    live = LivePlot(tasks, width_px=PLOT_WIDTH, font_scale=font_scale)
    live.update(plots.series_from_frame(df), plots.validation_series(valid), step=200,
                events=plots.events_from_frame(df))
    live.png()
    return live


def legends_over_other_panels(fig: Figure) -> list[str]:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    bad = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for other in fig.axes:
            if other is ax and ax.get_label() == plots.LEGEND_CELL:
                continue  # the empty cell that holds the legend
            o = other.get_window_extent(renderer)
            if min(box.x1, o.x1) - max(box.x0, o.x0) > 0.5 and min(box.y1, o.y1) - max(box.y0, o.y0) > 0.5:
                bad.append(f"{ax.get_title()} legend over {other.get_title()}")
    return bad


def test_overlap_check_catches_overlapping_texts():
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.set_title("a title")
    ax.text(0.5, 1.02, "over the title", transform=ax.transAxes, ha="center")
    assert overlaps(fig)


SLOW = pytest.mark.slow  # several full renders: seconds on a loaded 2-core machine


@pytest.mark.parametrize("n,clipped", [(2, True), *(pytest.param(n, c, marks=SLOW) for n in (1, 2, 4, 6)
                                                     for c in (False, True) if (n, c) != (2, True))])
def test_the_dashboard_plot_is_readable_for_1_to_6_tasks(n, clipped):
    live = live_figure(n, clipped)
    assert ("clip_fraction" in live.panels) == clipped
    assert live.figure.bbox.width == PLOT_WIDTH
    assert readability(live.figure) == []


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
@pytest.mark.parametrize("n", [2, pytest.param(6, marks=SLOW)])
def test_readable_with_a_combination_method_and_in_presentation_mode(n):
    assert readability(live_figure(n, True, method=True).figure) == []
    big = live_figure(n, False, font_scale=PRESENTATION_SCALE)
    assert readability(big.figure) == []
    assert min(t.get_fontsize() for t in all_texts(big.figure)) * big.figure.dpi / 72 >= 1.3 * MIN_TEXT_PX


def test_the_readability_check_catches_what_the_old_layout_did():
    """Three panels in a row with legends beside them: narrow axes, 9.7-px tick labels."""
    fig = Figure(figsize=(6.2, 3.1), dpi=100, layout="constrained")
    for i in range(3):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.plot([0, 1], [0, 1], label="a long label")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.tick_params(labelsize=7)
    bad = readability(fig)
    assert any(b.startswith("axes") for b in bad) and any(b.startswith("text") for b in bad)


@SLOW
def test_the_saved_history_figure_is_readable_for_6_tasks():
    _, df, valid = many_tasks(6, True, method=True)
    assert readability(plots.plot_history(df, validation=valid)) == []


@pytest.mark.slow
@pytest.mark.parametrize("clipped,method", [(True, True), (False, False), (True, False)])
def test_history_figure_has_no_overlapping_text(clipped, method):
    fig = plots.plot_history(history(clipped, method), validation=[{"step": 100, "a": 0.3, "b": 1.1, "loss": 1.4}])
    assert overlaps(fig) == []
    assert legends_over_other_panels(fig) == []
    panels = [ax for ax in fig.axes if ax.get_label() != plots.LEGEND_CELL]
    assert len({ax.get_xlim() for ax in panels}) == 1  # one shared step axis
    titles = [ax.get_title() for ax in panels]
    assert ("elements clipped" in titles) == clipped  # the clipped panel only when something was clipped
    assert ("combine weights" in titles and "task cosine" in titles) == method


@pytest.mark.slow
@pytest.mark.parametrize("width", [620, pytest.param(830, marks=SLOW)])  # the dashboard's plot; a notebook's full width
def test_live_plot_has_no_overlapping_text_running_and_zoomed(width):
    df = history()
    series = plots.series_from_frame(df)
    events = plots.events_from_frame(df)
    live = LivePlot(["a", "b"], width_px=width)
    live.update(series, {"a": ([100], [0.3])}, step=300, events=events)
    live.png()
    assert live.panels == ("loss", "grad_norm", "clip_fraction", "combine", "cosine")
    assert overlaps(live.figure) == [] and legends_over_other_panels(live.figure) == []
    live.set_xrange((5, 20))  # zoomed onto the crowded events
    live.update(series, {}, step=300, events=events)
    live.png()
    assert overlaps(live.figure) == []
    assert all(ax.get_xlim() == (5.0, 20.0) for ax in live.axes.values())
    _, hi = live.axes["loss"].get_ylim()  # the y limits follow what is shown
    shown = [v for s, v in zip(STEPS, df["a/noisy/loss"]) if 5 <= s <= 20]
    assert hi < max(df["a/noisy/loss"]) and hi >= max(shown)


def test_event_numbers_merge_instead_of_overprinting():
    events = [(10, "x"), (10, "y"), (11, "z"), (200, "w")]
    groups = plots.event_groups(events, (0, 300), axes_px=300)
    assert groups == [(10, "1,2,3"), (200, "4")]
    assert plots.event_groups(events, (9, 12), axes_px=300) == [(10, "1,2"), (11, "3")]  # zoomed: apart again


@pytest.mark.slow
def test_a_non_negative_loss_axis_is_not_padded_below_zero():
    fig = plots.plot_history(history())
    loss = next(ax for ax in fig.axes if ax.get_title() == "normalized loss")
    assert loss.get_ylim()[0] >= 0.0
    live = LivePlot(["a", "b"])
    live.update(plots.series_from_frame(history()), step=300)
    live.png()
    assert live.axes["loss"].get_ylim()[0] >= 0.0
