"""Plots: legends outside, sharp PNGs, single rows drawn, percent clip axis, log/linear, smoothing,
one colour per task everywhere, validation points, event markers, "as of step N", and a live plot
that keeps up during a run."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="the dashboard needs matplotlib: pip install 'mtlab[notebook]'")

import html  # noqa: E402
import io  # noqa: E402

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from mtlab.core.events import Event, ValidationInfo  # noqa: E402
from mtlab.core.knobs import KNOBS  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import PercentFormatter  # noqa: E402
from mtlab.training import plots  # noqa: E402
from mtlab.ui.liveplot import LivePlot  # noqa: E402


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    kw.setdefault("clip_grad_value", 0.5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", **kw)


def png_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    return Image.open(io.BytesIO(data)).size


@pytest.fixture
def trained(one_thread):
    tr = make_trainer()
    for _ in range(4):
        tr.step()
    return tr


def colors_by_label(ax) -> dict[str, str]:
    return {line.get_label(): to_hex(line.get_color()) for line in ax.lines if not line.get_label().startswith("_")}


def test_legend_sits_under_the_axes_and_explains_every_look(trained):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.plot_losses(trained.history, validation=[{"step": 2, "a": 1.0, "a/clean": 1.1, "a/noisy": 1.2}])
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax = fig.axes[0]
    legend, = fig.legends
    renderer = canvas.get_renderer()
    box, axes_box = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.y1 <= axes_box.y0  # entirely under the axes: it cannot cover a curve nor narrow the axes
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 + 1 and box.y0 >= 0  # and inside the figure
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:2] == ["a", "b"]  # a colour per task, then a dash per linked set, a marker per set
    assert {"clean", "noisy", "valid", "valid clean", "valid noisy"} <= set(labels)
    host = Figure()
    plots.plot_losses(trained.history, ax=host.add_subplot())
    assert host.axes[0].get_legend() is not None  # on the caller's axes: the legend inside


@pytest.mark.slow
def test_pngs_are_sized_to_the_displayed_width(trained):
    """Shown 1:1: the PNG is exactly as wide as the notebook shows it (a downscaled PNG has tiny text)."""
    fig = plots.plot_history(trained.history)
    assert png_size(plots.figure_png(fig))[0] == plots.WIDTH_PX
    live = LivePlot(["a", "b"], width_px=700)
    assert png_size(live.png())[0] == 700
    d = mtlab.ui.dashboard(trained)
    assert d.image.layout.width == f"{png_size(bytes(d.image.value))[0]}px"
    d.close()


def test_a_single_history_row_draws_points(one_thread):
    tr = make_trainer()
    tr.step()
    ax = plots.plot_losses(tr.history).axes[0]
    line = next(ln for ln in ax.lines if ln.get_label() == "a")
    assert len(line.get_xdata()) == 1 and line.get_marker() == "o"
    live = LivePlot(["a", "b"])
    live.update({"a/loss": ([1], [0.5])})
    assert live.lines["a/loss"].get_marker() == "o"


def test_clip_fraction_axis_is_percent_without_offset(trained):
    ax = plots.plot_clip_fraction(trained.history).axes[0]
    assert isinstance(ax.yaxis.get_major_formatter(), PercentFormatter)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(ax.figure).draw()
    assert ax.yaxis.get_offset_text().get_text() == "" and ax.get_ylim()[0] == 0.0


@pytest.mark.slow
def test_log_linear_toggle_and_smoothing(trained, one_thread):
    assert plots.plot_losses(trained.history, scale="log").axes[0].get_yscale() == "log"
    assert plots.plot_losses(trained.history).axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match="linear"):
        plots.plot_losses(trained.history, scale="semilog")
    assert plots.smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased EMA
    assert plots.smooth([0.0, 10.0], 0.5) == pytest.approx([0.0, 10.0 * 0.5 / 0.75])
    ax = plots.plot_losses(trained.history, smoothing=0.6).axes[0]
    smoothed = next(ln for ln in ax.lines if ln.get_label() == "a")
    ys = trained.history["a/loss"].tolist()
    assert list(smoothed.get_ydata()) == pytest.approx(plots.smooth(ys, 0.6))
    d = mtlab.ui.dashboard(trained)
    d.scale_toggle.value = "log"
    assert d.live.axes["loss"].get_yscale() == "log"
    d.smoothing_slider.value = 0.5
    assert "raw:a/loss" in d.live.lines
    d.close()


def test_one_colour_per_task_everywhere(trained):
    colors = plots.task_colors(["a", "b"])
    fig = plots.plot_history(trained.history)
    for ax in fig.axes:
        for label, color in colors_by_label(ax).items():
            task = label.split(" ")[0].split("/")[0]
            if task not in colors:  # the combined direction, task pairs
                continue
            assert color == colors[task], (ax.get_title(), label)
    d = mtlab.ui.dashboard(trained)
    for key, line in d.live.lines.items():
        if not key.startswith(("ghost:", "valid:", "raw:", "direction_norm", "cos/")):
            assert to_hex(line.get_color()) == colors[key.split("/")[0]], key
    # Task b trains alone first (a skipped): b still gets b's colour, not the first one.
    tr = make_trainer()
    tr.set_task_weight("a", 0.0)
    tr.step()
    tr.set_task_weight("a", 1.0)
    tr.step()
    got = colors_by_label(plots.plot_losses(tr.history).axes[0])
    assert got["a"] == colors["a"] and got["b"] == colors["b"]
    d.close()


@pytest.mark.slow
def test_validation_points_from_the_loop_and_from_evaluate(trained):
    d = mtlab.ui.dashboard(trained)
    for cb in list(trained.callbacks):
        cb(Event.VALIDATION, ValidationInfo(step=4, record={"step": 4, "a/clean": 1.5, "a": 1.4, "b": 0.9, "loss": 2.3}))
    trained.evaluate("b", "clean", num_batches=1)
    d.refresh()
    assert {"valid:a", "valid:a/clean", "valid:b", "valid:b/clean"} <= set(d.live.lines)
    assert list(d.live.lines["valid:a"].get_ydata()) == [1.4]
    assert to_hex(d.live.lines["valid:a"].get_markeredgecolor()) == plots.task_colors(["a", "b"])["a"]
    d.close()


@pytest.mark.slow
def test_changes_are_marked_and_logged(one_thread):
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr)
    d.buttons["step"].click()
    d.sliders["a/noisy"].value = 0.25
    d.lr_slider.value = 1e-3
    d.clip_toggle.value = False
    d.buttons["step"].click()
    texts = [t for _, t in d.events]
    words = [KNOBS["weight"].words(0.25, "a", "noisy"), KNOBS["lr"].words(1e-3), KNOBS["clip_grad_value"].words(None)]
    assert texts == words  # one wording: the knob table's
    assert f"step 1: {html.escape(words[0])}" in d.event_log.value
    marks = [ln for ln in d.live.axes["loss"].lines if ln.get_label() == "_events"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [1, 1]  # one dotted line at step 1
    labels = [t.get_text() for t in d.live.axes["loss"].texts]
    assert labels == ["1,2,3"]  # three events at one step: one label, never three numbers over each other
    # The saved figure finds weight and lr changes in the history itself.
    events = plots.events_from_frame(tr.history)
    assert [s for s, _ in events] == [2] and "a/noisy/weight 0.5 -> 0.25" in events[0][1] and "lr" in events[0][1]
    d.close()


def test_as_of_step_label(trained):
    d = mtlab.ui.dashboard(trained)
    assert "plot as of step 4" in d.plot_label.value
    assert d.drawn_step == 4
    d.close()


@pytest.mark.slow
def test_the_live_plot_follows_a_run(one_thread):
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, refresh_s=0.05, draw_interval=0.2)
    d.start(0)
    seen = set()
    end = time.monotonic() + 20
    while len(seen) < 3 and time.monotonic() < end:  # the painter redraws while training goes on
        if d.drawn_step:
            seen.add(d.drawn_step)
        time.sleep(0.02)
    d.stop()
    d.wait(20)
    assert len(seen) >= 3, seen
    assert d.drawn_step == tr.step_count and f"as of step {tr.step_count}" in d.plot_label.value
    d.close()


@pytest.mark.slow
def test_zoom_and_read_out_every_series_at_a_step(trained):
    tr = trained
    for _ in range(4):
        tr.step()
    d = mtlab.ui.dashboard(tr)
    assert d.zoom.value == (1, 8)  # the full range: the plot follows the run
    d.zoom.value = (3, 6)
    assert d.live.axes["loss"].get_xlim() == (3.0, 6.0) == d.live.axes["grad_norm"].get_xlim()
    d.read_step.value = 5
    frame = tr.history.set_index("step")
    for col in ("a/loss", "b/grad_norm", "a/clean/loss"):  # the history itself is the oracle
        assert f"<td>{col}</td><td>5</td><td>{frame.loc[5, col]:.4g}</td>" in d.readout.value
    assert all(m.get_visible() and list(m.get_xdata()) == [5, 5] for m in d.live._markers.values())
    d.zoom.value = (d.zoom.min, d.zoom.max)  # back to everything
    assert d.live.xrange is None
    d.close()


def test_panel_of_reads_the_columns_that_mtlab_core_columns_builds():
    from mtlab.core.columns import (combine_column, cosine_column, direction_column, noise_column, set_column,
                                    task_column, weighting_column)

    want = {task_column("a", "loss"): ("loss", "a"), set_column("a", "clean", "loss"): ("loss", "a/clean"),
            task_column("a", "grad_norm"): ("grad_norm", "a"),
            task_column("a", "grad_norm_clipped"): ("grad_norm", "a (clipped)"),
            task_column("a", "clip_fraction"): ("clip_fraction", "a"),
            direction_column(): ("grad_norm", "update"), direction_column("enc"): ("grad_norm", "update, enc"),
            combine_column("enc", "b"): ("combine", "b, enc"), cosine_column("enc", "a", "b"): ("cosine", "cos a/b, enc")}
    for column, (panel, label) in want.items():
        got = plots.panel_of(column)
        assert got is not None and got[:2] == (panel, label), column
    for column in (task_column("a", "weight"), weighting_column("a"), noise_column("a"), task_column("a", "cos"),
                   task_column("a", "combine"), "loss", "step", "lr"):
        assert plots.panel_of(column) is None, column
    assert plots.tasks_in([task_column("b", "loss"), task_column("a", "weight"), set_column("c", "x", "loss"),
                           cosine_column("enc", "a", "b")]) == ["a", "b", "c"]
