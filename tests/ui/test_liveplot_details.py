"""Plot details, live and saved: validation points of each linked set with their own marker, every line
with a look of its own (``update`` and ``update, enc`` are not both solid black), the event
marks explained in the legend, log axes with at least two tick labels, one step range across the
experiment folder's PNGs, no flat-0% clip_fraction.png. Headless (Agg)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from helpers.dashboards import many_tasks

from mtlab import plots  # noqa: E402
from mtlab.ui.liveplot import LivePlot  # noqa: E402


def look(line) -> tuple:
    """What tells a line apart on screen: colour, dash pattern, width, alpha, marker."""
    dashes = tuple(line._dash_pattern[1] or ()) if line.get_linestyle() not in ("None", "") else "none"
    return (to_hex(line.get_color()), dashes, round(line.get_linewidth(), 1), line.get_alpha(), line.get_marker())


def legend_of(fig: Figure):
    """The figure's one legend (under the panels, or in the last row's empty cell)."""
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    assert len(legends) == 1
    return legends[0]


def labelled(ax) -> dict[str, object]:
    return {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}


def live_plot(n: int = 2, clipped: bool = True) -> LivePlot:
    tasks, df, valid = many_tasks(n, clipped, method=True)
    live = LivePlot(tasks, width_px=620)
    live.update(plots.series_from_frame(df), plots.validation_series(valid), step=200,
                events=plots.events_from_frame(df))
    live.png()
    return live


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_every_series_has_a_look_of_its_own_live_and_saved():
    live = live_plot()
    tasks, df, valid = many_tasks(2, True, method=True)
    saved = plots.plot_history(df, validation=valid)
    for axes in (list(live.axes.values()), saved.axes):
        for ax in axes:
            lines = labelled(ax)
            looks = {label: look(ln) for label, ln in lines.items()}
            assert len(set(looks.values())) == len(looks), (ax.get_title(), looks)
    grad = labelled(live.axes["grad_norm"])
    assert look(grad["update"]) != look(grad["update, enc"])
    loss = labelled(live.axes["loss"])
    assert loss["frames/clean (valid)"].get_marker() != loss["frames/noisy (valid)"].get_marker()
    assert {loss[f"frames{s} (valid)"].get_marker() for s in ("", "/clean", "/noisy")} == {"o", "s", "^"}
    assert to_hex(loss["task1/clean (valid)"].get_markeredgecolor()) == plots.task_colors(tasks)["task1"]


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_the_legend_explains_markers_dashes_and_event_numbers():
    live = live_plot()
    labels = [t.get_text() for t in live.legend.get_texts()]
    assert {"frames", "task1", "clean", "noisy", "valid", "valid clean", "valid noisy", "after clipping",
            "update", "update, enc"} <= set(labels)
    assert any(label.startswith("n: ") and "event" in label for label in labels)  # what "1" on the plot is
    assert [t.get_text() for t in live.axes["loss"].texts] == ["1", "2"]
    _, df, valid = many_tasks(2, True)
    legend = legend_of(plots.plot_history(df, validation=valid))
    assert plots.EVENTS_LABEL in [t.get_text() for t in legend.get_texts()]
    calm = df.assign(lr=1e-2, **{"frames/weight": 1.0})  # no change: no numbers, no entry
    legend = legend_of(plots.plot_history(calm))
    assert plots.EVENTS_LABEL not in [t.get_text() for t in legend.get_texts()]


def tick_labels(ax) -> list[str]:
    FigureCanvasAgg(ax.figure).draw()
    return [t.label1.get_text() for t in ax.yaxis._update_ticks() if t.label1.get_visible() and t.label1.get_text()]


@pytest.mark.parametrize("lo,hi", [(0.3, 0.9), (0.15, 5.0), (0.31, 0.38), (1.0, 1000.0), (2e-4, 3e-4), (0.9, 1.1)])
def test_a_log_axis_has_at_least_two_tick_labels(lo, hi):
    fig = Figure(figsize=(3, 1.4), dpi=100)
    ax = fig.add_subplot()
    plots.log_axis(ax)
    ax.set_ylim(lo, hi)
    labels = tick_labels(ax)
    assert 2 <= len(labels) <= 6, labels
    assert len(set(labels)) == len(labels)  # never two ticks printed alike


def test_the_live_log_axes_have_two_labels_however_narrow_the_range():
    steps = list(range(1, 41))
    series = {"a/loss": (steps, [0.5 + 0.001 * s for s in steps]), "a/grad_norm": (steps, [0.3 + 0.002 * s for s in steps])}
    live = LivePlot(["a"], width_px=620)
    live.set_scale("log")
    live.update(series, step=40)
    live.png()
    assert len(tick_labels(live.axes["loss"])) >= 2 and len(tick_labels(live.axes["grad_norm"])) >= 2


def test_the_experiment_folders_pngs_share_one_step_range(tmp_path):
    _, df, _ = many_tasks(2, True, steps=150)
    valid = [{"step": 175, "frames": 0.2, "task1": 0.4, "loss": 0.6}]  # a validation after the last row
    figures = plots.history_figures(df, valid)
    assert set(figures) == {"losses", "grad_norms", "clip_fraction", "history"}
    ranges = {name: ax.get_xlim() for name, fig in figures.items() for ax in fig.axes
              if ax.get_label() != plots.LEGEND_CELL}
    assert len(set(ranges.values())) == 1, ranges
    lo, hi = next(iter(ranges.values()))
    assert lo < 1 and hi > 175


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_a_flat_zero_clip_fraction_png_is_not_written(tmp_path):
    _, flat, _ = many_tasks(1, clipped=False, steps=20)
    assert set(flat.filter(like="clip_fraction").stack()) == {0.0}
    names = [p.name for p in plots.save_plots(flat, tmp_path / "flat", dpi=40)]
    assert names == ["losses.png", "grad_norms.png", "history.png"]
    assert not (tmp_path / "flat" / "clip_fraction.png").exists()
    _, clipped, _ = many_tasks(1, clipped=True, steps=20)
    assert "clip_fraction.png" in [p.name for p in plots.save_plots(clipped, tmp_path / "clipped", dpi=40)]


def test_a_linked_set_looks_the_same_in_every_task():
    styles = plots.Styles(["a", "b"])
    a_clean, a_noisy = styles.line("a/clean/loss"), styles.line("a/noisy/loss")
    b_noisy = styles.line("b/noisy/loss")  # b has no clean set: its noisy set still looks like a's noisy
    assert b_noisy["dashes"] == a_noisy["dashes"] != a_clean["dashes"]
    assert styles.valid("b/noisy")["marker"] == styles.valid("a/noisy")["marker"] != styles.valid("a/clean")["marker"]
    assert styles.line("b/loss")["color"] == b_noisy["color"] != a_noisy["color"]
    labels = [label for _, label in styles.legend(["a/clean/loss", "a/noisy/loss", "b/noisy/loss"], ["b/noisy"])]
    assert labels == ["a", "b", "clean", "noisy", "valid noisy"]
