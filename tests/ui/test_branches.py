"""Branches and re-initialise as a class sees them in the dashboard: "fork here" adds the branch to the plot and to
the branch selector (continue, switch, compare, drop); re-initialise sits beside run/pause/stop with "keep the
knobs" or "starting knobs", and after it only the new branch's events are marked; a change made during a run says
it is pending, then in force. Headless: widgets with the dummy comm, the plot drawn with Agg."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="the dashboard needs matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from helpers.figures import outside, raw_texts, readability  # noqa: E402
from mtlab.core.knobs import KNOBS  # noqa: E402



@pytest.fixture
def dash(one_thread):
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")
    d = mtlab.ui.dashboard(tr)
    yield d
    for run in d.controller.forks.runs.values():
        run.stop(wait=True)
    d.close()


def branch_lines(dash):
    return {key: line for key, line in dash.live.lines.items() if key.startswith("branch:") and len(line.get_xdata())}


def test_the_dashboard_displays(dash):
    assert "application/vnd.jupyter.widget-view+json" in dash._repr_mimebundle_()  # no name of a widget's shadowed


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_fork_here_adds_the_branch_to_the_plot_and_the_selector(dash):
    c, w = dash.controller, dash.controls
    for _ in range(3):
        w.buttons["step"].click()
    w.buttons["fork"].click()
    assert "branch-1" in c.branches and w.branch_dropdown.value == "branch-1"
    assert [n for _, n in w.branch_dropdown.options] == ["branch-1"]
    assert "continue trains it" in dash.status_text
    w.steps_box.value = "4"
    w.buttons["continue"].click()
    c.forks.runs["branch-1"].wait(120)
    dash.painter.idle(10)
    dash.refresh()
    lines = branch_lines(dash)
    assert {"branch:a/loss", "branch:b/loss"} <= set(lines)  # a second line per task on the loss panel
    xs = lines["branch:a/loss"].get_xdata()
    assert min(xs) == 3 and max(xs) == 7  # the branch's own part: from the fork's step to its last
    assert lines["branch:a/loss"].get_marker() == "x"
    assert dash.trainer.step_count == 3  # the run driven here did not move
    labels = [t.get_text() for t in dash.live.legend.get_texts()]
    assert "branch-1 (fork)" in labels
    assert outside(dash.live.figure) == [] and readability(dash.live.figure) == [] and raw_texts(dash.live.figure) == []
    assert "now 7" in w.branch_dropdown.options[0][0] and "3 step(s)" not in dash.status_text


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_switch_compare_and_drop(dash):
    c, w = dash.controller, dash.controls
    w.buttons["step"].click()
    first = dash.trainer
    c.fork()
    c.continue_branch(3)
    assert not c.switch_branch() or not c.forks.running("branch-1")  # refused while the branch trains
    c.forks.runs["branch-1"].wait(120)
    assert c.switch_branch()
    assert dash.trainer is not first and dash.trainer.step_count == 4
    assert c.branches["main"] is first and c.forks.driven == "branch-1"
    assert "drives 'branch-1'" in dash.status_text
    w.buttons["step"].click()  # the buttons act on the branch now
    assert dash.trainer.step_count == 5 and first.step_count == 1
    dash.refresh()
    assert max(dash.live.lines["a/loss"].get_xdata()) == 5
    w.buttons["compare"].click()
    assert bytes(w.compare_image.value)[:4] == b"\x89PNG" and "side by side" in dash.status_text
    assert dash.controls.lower_tab.selected_index == 4
    w.buttons["drop"].click()
    assert "main" not in c.branches and w.branch_dropdown.options == ()
    assert not branch_lines(dash) or dash.refresh() is None and not branch_lines(dash)
    w.buttons["compare"].click()
    assert "no branch yet" in dash.status_text


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_reinitialise_beside_run_with_the_starting_knobs_and_only_new_marks(dash):
    c, w = dash.controller, dash.controls
    run_row = dash.controls.layout(True)[-1].children[0].children[0]  # the left column's first part
    assert w.buttons["reinitialize"] in run_row.children  # in the row of steps, run, pause, stop
    for _ in range(2):
        w.buttons["step"].click()
    w.sliders["a/noisy"].value = 0.2
    w.lr_slider.value = 2e-2
    w.buttons["step"].click()
    marked = [s for s, _ in c.data.marks() if math.isfinite(s)]
    assert marked  # the knob changes are marked
    w.reinit_knobs.value = "start"
    w.buttons["reinitialize"].click()
    tr = dash.trainer
    assert tr.step_count == 0 and tr.linkedset("a", "noisy").weight == 0.5 and tr.lr == pytest.approx(1e-2)
    again = ", ".join([KNOBS["lr"].words(1e-2), KNOBS["weight"].words(0.5, "a", "noisy")])  # the table's order
    assert f"the starting knobs again ({again})" in dash.status_text
    assert w.sliders["a/noisy"].value == 0.5
    assert all(not math.isfinite(s) for s, _ in c.data.marks()[:-1])  # the abandoned branch's events: unmarked
    dash.refresh()
    texts = [a for a in dash.live._event_artists if hasattr(a, "get_text")]
    assert not texts or all(t.get_text() == str(len(c.data.events)) for t in texts)  # at most the re-init's
    w.buttons["step"].click()
    w.sliders["a/noisy"].value = 0.3
    w.reinit_knobs.value = "keep"
    w.buttons["reinitialize"].click()
    assert dash.trainer.linkedset("a", "noisy").weight == 0.3 and "knobs kept" in dash.status_text


def test_merged_event_labels_cannot_read_as_ranges():
    from mtlab import plots

    events = [(10.0, "x")] * 10 + [(11.0, "y")]
    labels = [label for _, label in plots.event_groups(events, (0, 300), axes_px=300)]
    assert labels == ["1 +10"] and not any("-" in label for label in labels)
    assert plots.merged_label(3, 4) == "3,4"


def test_a_change_during_a_run_says_it_is_pending_then_in_force(dash):
    c = dash.controller
    c.start(0)
    try:
        while dash.trainer.step_count < 1:
            c.run.wait(0.05)
        c.set_weight("a", "noisy", 0.1)
        assert "pending: the run takes it at its next minibatch" in dash.status_text
        at = dash.trainer.step_count
        while dash.trainer.step_count < at + 2:
            c.run.wait(0.05)
        dash.refresh()
        assert "in force from step" in dash.status_text
    finally:
        c.stop(wait=True)


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_small_things_a_class_trips_over(dash):
    w = dash.controls
    w.k_boxes["a"].value = "1e6"  # a step of a million rounds: refused with the reason
    assert dash.trainer.minibatches_per_step["a"] == 1 and "above the maximum 1000" in dash.status_text
    w.lr_slider.value = w.lr_slider.base ** w.lr_slider.min  # what the browser sends for a typed 1e-9
    assert "the slider's lowest value (a number typed beyond it is clamped there)" in dash.status_text
    assert "Σ w·loss, Σ w·norm: loss and normalizer" in w.table.value  # the jargon explained beside it
    dash.controller.start(0)
    try:
        while dash.trainer.step_count < 1:
            dash.controller.run.wait(0.05)
        dash.controller.set_status("x")
        dash.refresh()
        assert "mtlab-live" in w.progress_label.value  # the ETA expires with the kernel's news, like "running"
    finally:
        dash.controller.stop(wait=True)
    assert "mtlab-live" not in w.progress_label.value


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_starting_knobs_are_those_the_first_step_ran_with_not_those_at_build(dash):
    """A notebook cell after the dashboard's sets the knobs the run starts with: "starting knobs" restores those."""
    tr, w = dash.trainer, dash.controls
    tr.lr = 3e-2  # set from the notebook after the dashboard was built, before the first step
    tr.set_weight("a", "noisy", 0.25)
    w.buttons["step"].click()
    w.buttons["step"].click()
    w.lr_slider.value = 5e-3  # then moved on the dashboard during the run
    w.sliders["a/noisy"].value = 0.8
    w.buttons["step"].click()
    w.reinit_knobs.value = "start"
    w.buttons["reinitialize"].click()
    assert tr.step_count == 0 and tr.lr == pytest.approx(3e-2) and tr.linkedset("a", "noisy").weight == 0.25
    assert w.sliders["a/noisy"].value == 0.25 and w.lr_slider.value == pytest.approx(3e-2)
    assert "a/noisy weight 0.25" in dash.status_text and "lr 0.03" in dash.status_text
    w.buttons["step"].click()
    w.lr_slider.value = 1e-3
    w.buttons["reinitialize"].click()  # a second time: still the notebook's starting knobs
    assert tr.lr == pytest.approx(3e-2)


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_a_second_reinitialise_keeps_every_abandoned_branch_grey(dash):
    c, w = dash.controller, dash.controls
    for _ in range(3):
        w.buttons["step"].click()
    w.buttons["reinitialize"].click()
    dash.refresh()
    first = c.data.ghost["a/loss"]
    assert max(first[0]) == 3
    w.buttons["reinitialize"].click()  # at once, with no step between: the grey curves stay
    dash.refresh()
    assert c.data.ghost["a/loss"][0] == first[0]
    grey = dash.live.lines["ghost:a/loss"]
    assert [x for x, y in zip(grey.get_xdata(), grey.get_ydata()) if math.isfinite(y)] == first[0]
    w.buttons["step"].click()
    w.buttons["step"].click()
    w.buttons["reinitialize"].click()
    dash.refresh()
    xs, ys = c.data.ghost["a/loss"]
    finite = [x for x, y in zip(xs, ys) if math.isfinite(y)]
    assert finite == [1, 2, 3, 1, 2]  # both abandoned branches, apart (a gap between them, not a line back)
    assert any(math.isnan(y) for y in ys)
    assert "stays grey" in dash.status_text
