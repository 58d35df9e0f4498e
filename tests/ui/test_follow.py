"""``dash.follow(fn)``: a cell's result that shows the run as it goes. Under Run All such a cell runs at step 0
while the run trains in the background; what it shows must end on the run's final numbers, say "nothing yet"
(not ``{}`` or an empty table) before the first step, and never call ``fn`` while a step is in flight."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="the dashboard needs matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
import mtlab.training.debug  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from mtlab.ui.state import RunView  # noqa: E402


@pytest.fixture
def dash(one_thread):
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu")
    d = mtlab.ui.dashboard(tr, plots=False)
    yield d
    d.close()


def test_before_the_first_step_it_says_nothing_yet_and_after_a_run_it_shows_the_last_step(dash):
    tr = dash.trainer
    table = dash.follow(lambda: tr.history.reindex(columns=["step", "a/loss"]).tail(2), every_s=0.01)
    conflict = dash.follow(lambda: mtlab.training.debug.gradient_conflict(tr), every_s=0.01)
    for f in (table, conflict):
        assert "nothing yet (no step so far)" in f.text and "{}" not in f.text and "step 0" in f.text
    dash.start(4)
    dash.wait(120)
    assert tr.step_count == 4
    assert "<td>4</td>" in table.text and "step 4" in table.text and "the run goes on" not in table.text
    assert f"{tr.history['a/loss'].iloc[-1]:.4g}" in table.text  # the last step's loss, as the history has it
    assert "enc / a vs b" in conflict.text or "nothing yet" in conflict.text  # the tasks' shared encoder


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_it_shows_again_between_steps_of_the_run_not_during_one(dash):
    tr = dash.trainer
    seen: list[tuple[int, str, bool]] = []  # (step, phase of a, in the training thread) at each call of fn
    main = threading.main_thread()

    def probe():
        seen.append((tr.step_count, str(tr.phase()["a"]), threading.current_thread() is not main))
        return tr.history.tail(1)

    follower = dash.follow(probe, every_s=1e-3, max_share=1.0)
    tr.add_callback(lambda e, i: time.sleep(0.3) if e == "apply" else None)  # steps longer than a refresh
    dash.start(5)
    dash.wait(120)
    steps = [s for s, _, _ in seen]
    assert steps[0] == 0 and steps[-1] == 5 and len(set(steps)) >= 3  # it followed the run, to its end
    assert all(phase in ("empty", "applied") for _, phase, _ in seen)  # never inside a step
    assert any(in_run for _, _, in_run in seen)
    assert follower.renders == len(seen)


def test_a_follow_made_during_a_run_waits_for_the_end_of_the_step(dash):
    tr = dash.trainer
    calls: list[int] = []
    gate = threading.Event()
    tr.add_callback(lambda e, i: gate.wait(30) if e == "minibatch" else None)  # hold the run inside its step
    dash.start(2)
    follower = dash.follow(lambda: calls.append(tr.step_count) or tr.step_count)
    assert calls == [] and "end of the step in flight" in follower.text
    gate.set()
    dash.wait(120)
    assert calls and calls[-1] == 2 and "step 2" in follower.text


def test_a_figure_is_shown_as_an_image_and_an_error_in_words(dash):
    tr = dash.trainer
    fig = dash.follow(lambda: mtlab.plots.plot_losses(tr.history))
    dash.buttons["step"].click()
    assert fig.text.endswith("[figure]") and fig.image.value[:4] == b"\x89PNG"
    broken = dash.follow(lambda: 1 / 0)
    assert "ZeroDivisionError" in broken.text
    with pytest.raises(TypeError, match="function of no arguments"):
        dash.follow(tr.history)


def test_closing_the_dashboard_closes_its_followers(dash):
    follower = dash.follow(lambda: 1)
    dash.close()
    assert follower.comm is None  # closed: the browser forgets it


def test_its_plain_text_is_the_result_not_the_widgets_repr(dash):
    tr = dash.trainer
    follower = dash.follow(lambda: mtlab.training.debug.gradient_conflict(tr))
    assert follower._repr_mimebundle_()["text/plain"] == "step 0\nnothing yet (no step so far)"
    for task in ("a", "b"):  # both tasks hold gradients on the shared encoder
        assert dash.controller.minibatch(task, next(iter(tr.tasks[task].linkedsets)))
    plain = follower._repr_mimebundle_()["text/plain"]
    (cosine,) = mtlab.training.debug.gradient_conflict(tr)["enc"].values()
    assert plain.splitlines()[1].split() == ["enc", "/", "a", "vs", "b", f"{cosine:.4g}"]
    assert "application/vnd.jupyter.widget-view+json" in follower._repr_mimebundle_()


def test_what_was_shown_empty_is_shown_again_at_the_first_step_whatever_the_pace(dash):
    """Under Run All a figure cell runs at step 0; its first redraw must not wait ``every_s`` (nor ``fn``'s own time
    over ``max_share``): the cells above it showed step 2 while it still showed empty axes."""
    tr = dash.trainer
    figure = dash.follow(lambda: mtlab.plots.plot_history(tr.history), every_s=1e4)  # at step 0: empty axes
    assert figure.renders == 1 and "step 0" in figure.plain
    running = RunView("running", 0, 10, 1.0, 1.0, None, False)
    for _ in range(2):
        tr.step()
        figure(dataclasses.replace(dash.controller.state(), run=running))  # what the run hands over between steps
    assert figure.renders == 2 and "step 1" in figure.plain  # the first step at once, then the pace (every_s)
