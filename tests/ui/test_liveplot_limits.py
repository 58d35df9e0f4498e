"""The data never leave the panels: at every redraw of the dashboard's live figure, every drawn point whose step
lies inside the x limits lies inside its panel's y limits (a spike, a batch-size change, the first steps), and the
frame left after a run (its steps done, a stop) shows the last step. Measured on the figures the dashboard draws,
for 1, 2, 4 and 6 tasks, headless (Agg), with matplotlib's renderer for the sizes."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
import mtlab.ui.painter  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from helpers.dashboards import many_tasks  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from mtlab import plots  # noqa: E402
from mtlab.ui.liveplot import LivePlot  # noqa: E402
from helpers.figures import PLOT_WIDTH, outside, raw_texts, readability  # noqa: E402


def test_the_check_catches_a_point_off_the_panel():
    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [0.5, 0.6, 9.0])
    ax.set_ylim(0, 1)
    assert outside(fig)
    ax.set_xlim(0, 2.5)  # the point off the panel is outside the x range shown: not drawn, not counted
    assert not outside(fig)


def spiky(n: int):
    """``many_tasks`` with what moved points off the panels: a loss spike, a jump of the gradient norm (a batch-size
    change), a weight change."""
    tasks, df, valid = many_tasks(n, clipped=True, method=n > 1, steps=120)
    df.loc[df["step"] == 45, f"{tasks[-1]}/loss"] = 25.0
    df.loc[df["step"] >= 80, f"{tasks[0]}/grad_norm"] *= 40
    df.loc[df["step"] >= 90, f"{tasks[0]}/clean/loss"] *= 3
    return tasks, df, valid


@pytest.mark.slow  # 25 full draws: over a second of CPU (tests/README.md)
@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_every_point_stays_inside_its_panel_at_every_redraw(n):
    tasks, df, valid = spiky(n)
    live = LivePlot(tasks, width_px=PLOT_WIDTH)
    live.min_full_interval = 1e9  # limits never shrink on a timer: only the data can move them
    checked = 0
    for last in [1, 2, 3, 5, 8, *range(12, 121, 6)]:  # the first steps, then a redraw every few steps
        part = df[df["step"] <= last]
        points = [v for v in valid if v["step"] <= last]
        live.update(plots.series_from_frame(part), plots.validation_series(points), step=last,
                    events=plots.events_from_frame(part))
        live.png()
        assert outside(live.figure) == [], f"after step {last}"
        x0, x1 = live.axes["loss"].get_xlim()
        assert x0 <= 1 and x1 >= last, (last, x0, x1)
        checked += 1
    assert checked > 20 and live.refits >= 3  # the limits moved with the data (at least at the spike)
    assert readability(live.figure) == []
    assert raw_texts(live.figure) == []


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu",
                         **kw)


def last_step_shown(dash) -> None:
    live = dash.live
    step = dash.trainer.step_count
    assert dash.drawn_step == step, (dash.drawn_step, step)
    x0, x1 = live.axes["loss"].get_xlim()
    assert x0 <= step <= x1
    for ax in live.axes.values():  # the last row is drawn in every panel
        assert any(len(ln.get_xdata()) and max(ln.get_xdata()) == step for ln in ax.lines
                   if ln.get_label() not in ("_marker", "_events")), ax.get_title()
    assert outside(live.figure) == []
    assert readability(live.figure) == []
    assert raw_texts(live.figure) == []


@pytest.mark.slow  # a run of a dashboard: over a second of CPU (tests/README.md)
@pytest.mark.parametrize("painter", ["inline", "thread"])
def test_the_frame_left_after_a_run_shows_the_last_step(one_thread, painter, monkeypatch):
    """Drawn at a slow pace (a loaded machine: the last steps fall between two draws), the run's end is drawn
    anyway."""
    monkeypatch.setattr(mtlab.ui.painter, "MAX_INTERVAL", 1e9)
    tr = make_trainer()
    dash = mtlab.ui.dashboard(tr, painter=painter, draw_interval=60.0 if painter == "inline" else 4.0)
    try:
        for _ in range(4):  # button steps first: each drawn at once
            dash.controller.call("step")
            assert outside(dash.live.figure) == []
        dash.start(9)
        dash.controller.runs.run.wait(120)  # not dash.wait(): no flush by the waiting cell
        dash.painter.idle(30)
        assert tr.step_count == 13
        last_step_shown(dash)
        dash.start(0)  # until stopped
        while tr.step_count < 16:
            dash.controller.runs.run.wait(0.05)
        dash.controller.stop(wait=True)
        dash.painter.idle(30)
        last_step_shown(dash)
        assert "run ended" in dash.status_text
    finally:
        dash.close()


def test_the_check_of_texts_catches_a_raw_dict():
    fig = Figure()
    fig.text(0.1, 0.1, "restore state={'id': '230ab9', 'n': 6}")
    fig.text(0.1, 0.5, "phase <Phase.EMPTY: 'empty'>")
    assert len(raw_texts(fig)) == 2
    assert math.isfinite(PLOT_WIDTH)
