"""The accumulation knobs, re-initialise, number boxes, tooltips, presentation mode and the live claim of the
dashboard, driven headless (widgets with a dummy comm, browser messages simulated)."""

from __future__ import annotations

import math
import re
import time

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")


from helpers import make_examples, make_models, task_a, task_b
from helpers.trainers import assert_trees_equal

import mtlab
import mtlab.ui
import ipywidgets as widgets
from mtlab.core.knobs import KNOBS
from mtlab.ui.controls import GROUPS, NumberText, parse_number
from mtlab.ui.view import live_only, page_css


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", clip_grad_value=0.5,
                         **kw)


def browser_update(widget, value) -> None:
    """What the frontend sends when the user edits a control."""
    widget._handle_msg({"content": {"data": {"method": "update", "state": {"value": value}}}})


def until(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for the training thread"
        time.sleep(0.005)


@pytest.fixture
def dash():
    d = mtlab.ui.dashboard(make_trainer(), plots=False)
    yield d
    d.close()


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_knobs_from_the_dashboard_change_the_next_step_exactly_as_the_calls_from_code(dash):
    code = make_trainer()
    dash.buttons["step"].click()
    code.step()
    browser_update(dash.k_boxes["a"], "3")
    browser_update(dash.batch_boxes["b"], "5")
    code.set_minibatches_per_step(3, "a")
    code.set_batch_size("b", 5)
    dash.buttons["step"].click()
    code.step()
    tr = dash.trainer
    assert tr.state("a").minibatches == 6 and tr.state("b").records[0].num_examples == 5
    for name in ("a", "b"):
        assert_trees_equal(tr.state(name).grads, code.state(name).grads, f"grads of {name}")
    assert_trees_equal({k: p.detach() for k, p in tr.params.items()}, {k: p.detach() for k, p in code.params.items()})
    assert_trees_equal(tr.state_dict()["update"], code.state_dict()["update"])
    last = tr.history.iloc[-1]
    assert last["a/minibatches_per_step"] == 3 and last["b/batch_size"] == 5
    assert [t for _, t in dash.events][-2:] == [KNOBS["minibatches_per_step"].words(3, "a"),
                                                KNOBS["batch_size"].words(5, "b")]
    code.set_minibatches_per_step(2)  # a change from code shows in the boxes
    tr.set_minibatches_per_step(2)
    assert dash.k_boxes["a"].value == dash.k_boxes["b"].value == "2"


def test_restore_brings_back_the_snapshot_knobs(dash):
    dash.buttons["step"].click()
    dash.buttons["snapshot"].click()
    browser_update(dash.k_boxes["b"], "2")
    browser_update(dash.batch_boxes["a"], "5")
    dash.buttons["step"].click()
    dash.buttons["restore"].click()
    tr = dash.trainer
    assert "restored snapshot #1 (step 1)" in dash.status_text and tr.step_count == 1
    assert tr.minibatches_per_step == {"a": 1, "b": 1} and tr.tasks["a"].batch_size == 3
    assert dash.k_boxes["b"].value == "1" and dash.batch_boxes["a"].value == "3"


def test_reinitialize_button_gives_a_fresh_trainer_and_keeps_the_old_curves_grey(dash):
    for _ in range(3):
        dash.buttons["step"].click()
    dash.buttons["reinitialize"].click()
    tr, fresh = dash.trainer, make_trainer()
    assert tr.step_count == 0 and "re-initialised: step 3 -> 0" in dash.status_text
    assert_trees_equal({k: v for k, v in tr.state_dict().items() if k != "journal"},  # the journal keeps the past
                       {k: v for k, v in fresh.state_dict().items() if k != "journal"})
    assert dash.controller.data.ghost and max(dash.controller.data.ghost["a/loss"][0]) == 3
    assert dash.events[-1] == (0, "re-initialised (from step 3)")
    dash.buttons["step"].click()
    fresh.step()
    assert_trees_equal({k: p.detach() for k, p in tr.params.items()}, {k: p.detach() for k, p in fresh.params.items()})


def test_reinitialize_during_a_run_happens_between_steps(dash):
    dash.start(0)  # until stopped: on a loaded machine a short run could end before the request
    try:
        until(lambda: dash.trainer.step_count >= 1)
        assert dash.controller.reinitialize() and "end of the current step" in dash.status_text
        until(lambda: any(t.startswith("re-initialised") for _, t in dash.events))
        assert dash.running and len(dash.trainer.log.branches) == 1  # made between two steps of the run going on
    finally:
        dash.stop(wait=True)


@pytest.mark.parametrize("typed, taken, says", [
    ("2.5", 0, "'2.5' is not a whole number"), ("1e3", 1000, None), ("abc", 0, "'abc' is not a number"),
    ("", 0, "an empty box"), ("-4", 0, "below the minimum 0"), (" 12 ", 12, None), ("1_000", 1000, None)])
def test_the_steps_box_takes_whole_numbers_and_refuses_the_rest_saying_so(dash, typed, taken, says):
    browser_update(dash.steps_box, typed)
    assert dash.steps_box.number == taken and dash.steps_box.value == str(taken)  # the box shows the value taken
    if says is None:
        assert dash.steps_box.refusal is None and f"steps -> {taken}" in dash.status_text
    else:
        assert says in dash.status_text and f"kept {taken}" in dash.status_text
        assert dash.controller.state().status_error


def test_knob_boxes_refuse_bad_values_and_leave_the_trainer_alone(dash):
    browser_update(dash.k_boxes["a"], "0")
    assert "below the minimum 1" in dash.status_text and dash.k_boxes["a"].value == "1"
    browser_update(dash.batch_boxes["a"], "2.5")
    assert "not a whole number" in dash.status_text and dash.batch_boxes["a"].value == "3"
    assert dash.trainer.minibatches_per_step == {"a": 1, "b": 1} and dash.trainer.tasks["a"].batch_size == 3
    browser_update(dash.read_step, "x")
    assert "read-out step: refused" in dash.status_text


def test_parse_number_and_a_float_box():
    assert parse_number("1e-9", float) == 1e-9 and parse_number("3", int) == 3
    with pytest.raises(ValueError, match="not a finite number"):
        parse_number("inf", float)
    box = NumberText(0.5, float, 0.0, what="weight")
    box.value = "1e-9"
    assert box.number == 1e-9 and box.value == "1e-09"  # every digit that matters shown


def test_weights_show_enough_digits(dash):
    dash.trainer.set_weight("a", "noisy", 1e-9)
    slider = dash.sliders["a/noisy"]
    assert slider.value == 1e-9 and format(slider.value, slider.readout_format) == "1e-09"  # never 0.00


def test_a_knob_beyond_its_slider_shows_its_true_value_and_the_range_grows(dash):
    dash.trainer.lr = 1e-9  # from code, far under the slider's range (1e-5 .. 1)
    dash.trainer.clip_grad_value = 50.0  # over the clip slider's (5e-4 .. 50)... and beyond
    dash.trainer.clip_grad_value = 400.0
    dash.refresh()
    lr, clip = dash.lr_slider, dash.clip_slider
    assert lr.value == 1e-9 and lr.min <= -9 and format(lr.value, lr.readout_format) == "1.00e-09"
    assert clip.value == 400.0 and clip.max >= math.log10(400.0)
    assert dash.trainer.lr == 1e-9  # showing it changed nothing


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def test_dropdowns_and_number_boxes_sit_in_a_box_that_carries_their_tooltip(dash):
    w = dash.controls
    parents = {id(c): p for p in walk(dash) for c in getattr(p, "children", ())}
    for control in (w.combine_dropdown, w.task_dropdown, w.set_dropdown, w.snapshot_dropdown, w.steps_box,
                    *w.k_boxes.values(), *w.batch_boxes.values()):
        assert control.tooltip, control.description
        assert id(control) in parents, f"{control.description} is not shown"
        assert parents[id(control)].tooltip == control.tooltip, control.description


def test_a_running_claim_expires_on_screen_and_idle_texts_claim_nothing(dash):
    text = live_only("running", 7)
    assert "mtlab-live" in text and "mtlab-stale" in text and "no longer live" in text
    css = page_css()
    assert re.search(r"\.mtlab-live \{animation: mtlab-expire \S+ linear \d+s forwards\}", css)
    assert "@keyframes mtlab-appear" in css
    dash.start(0)
    try:
        for _ in range(200):
            if dash.controller.state().running and "steps/s" in dash.counter.value:
                break
            dash.controller.refresh()
        assert "<span class='mtlab-live'> &middot; running" in dash.counter.value
        assert dash.status.value.startswith("<span class='mtlab-live'>")
    finally:
        dash.stop()
    dash.controller.refresh()
    assert "running" not in dash.counter.value and "mtlab-live" not in dash.status.value


def test_hide_names_control_groups_and_an_unknown_one_lists_them():
    tr = make_trainer()
    with pytest.raises(ValueError, match=r"unknown control group\(s\) \['nope'\]; valid: 'run'"):
        mtlab.ui.dashboard(tr, hide=["run", "nope"])
    d = mtlab.ui.dashboard(tr, plots=False, hide=list(GROUPS))
    try:
        shown = set(map(id, walk(d)))
        w = d.controls
        for hidden in (w.steps_box, w.buttons["run"], w.table, w.event_log, w.progress, *w.k_boxes.values(),
                       w.buttons["minibatch"], w.buttons["reinitialize"], *w.sliders.values()):
            assert id(hidden) not in shown
        assert id(w.status) in shown and id(w.counter) in shown
    finally:
        d.close()


@pytest.mark.plots
def test_presentation_mode_puts_the_chosen_sliders_beside_the_plot_with_larger_text():
    with pytest.raises(ValueError, match="sliders: unknown"):
        mtlab.ui.dashboard(make_trainer(), presentation=True, sliders=["nope"])
    d = mtlab.ui.dashboard(make_trainer(), presentation=True, hide=["stepwise"], sliders=["a/noisy", "lr"])
    try:
        order = [c for c in walk(d)]
        image, table, sliders = d.controls.image, d.controls.table, d.controls.sliders["a/noisy"]
        screen = next(c for c in order if isinstance(c, widgets.HBox) and image in list(walk(c))
                      and sliders in list(walk(c)))  # one row: the chosen sliders beside the plot
        side = screen.children[0]
        assert [c for c in walk(side) if isinstance(c, widgets.FloatSlider | widgets.FloatLogSlider)] == [
            sliders, d.controls.lr_slider]
        assert d.controls.buttons["run"] in list(walk(side))
        assert order.index(image) < order.index(table)
        assert image.layout.max_height and "100vh" in image.layout.max_height  # the plot fits the window's height
        assert "mtlab-present" in d._dom_classes and d.live.figure.dpi > 100
        assert not any(c is d.controls.buttons["minibatch"] for c in order)
        d.presentation = False
        order = [c for c in walk(d)]
        assert order.index(table) < order.index(image) and "mtlab-present" not in d._dom_classes
    finally:
        d.close()
