"""The dashboard's knob controls come from the knob table (``mtlab.core.knobs.KNOBS``): a row added to it gets its
control, its journal entry, replay, fork and resume with no dashboard code; one ``controller.set`` for every
control. Checked against the same changes made from code, and against a run without them."""

from __future__ import annotations

import weakref

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")

import ipywidgets as widgets  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from helpers.trainers import assert_trees_equal  # noqa: E402
from mtlab.core.knobs import KNOBS, Knob  # noqa: E402
from mtlab.ui.controls import knob_controls  # noqa: E402


class Scaled(nn.Module):
    """Task a's head, its logits times the trainer's knob "toy"."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.owner = None  # a weak reference to the trainer (a copy of the module copies no trainer)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.inner(h) * self.owner().get("toy")  # the second place: where the knob acts


def build() -> mtlab.Trainer:
    models = make_models()
    models["head_a"] = Scaled(models["head_a"])
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(models, [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu")
    tr.models["head_a"].owner = weakref.ref(tr)
    return tr


def browser_update(widget, value) -> None:
    """What the frontend sends when the user moves a control."""
    widget._handle_msg({"content": {"data": {"method": "update", "state": {"value": value}}}})


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def params(tr: mtlab.Trainer) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in tr.params.items()}


@pytest.fixture
def toy():
    # the first place: the row
    KNOBS.add(Knob("toy", "trainer", default=1.0, control=("linear", 0.0, 2.0), doc="scales task a's logits"))
    try:
        yield
    finally:
        KNOBS.remove("toy")


@pytest.mark.slow  # over a second of CPU: three trainers, a replay and two dashboards
def test_a_new_knob_row_gets_a_slider_a_journal_entry_replay_fork_and_resume(toy):
    tr, code, untouched = build(), build(), build()
    dash = mtlab.ui.dashboard(tr, plots=False)
    resumed_dash = None
    try:
        control = dash.controls.knobs["toy"]
        slider = control.widget
        assert isinstance(slider, widgets.FloatSlider) and (slider.min, slider.max, slider.value) == (0.0, 2.0, 1.0)
        assert id(slider) in set(map(id, walk(dash))) and "trainer.set('toy', value)" in slider.tooltip
        for t in (tr, code, untouched):
            t.step()
        browser_update(slider, 0.5)  # the user drags the slider
        code.set("toy", 0.5)  # the same change from code
        assert tr.get("toy") == 0.5 and f"{KNOBS['toy'].words(0.5)}" in dash.status_text
        entry = tr.journal.changes()[-1]
        assert (entry["kind"], entry["value"], entry["step"]) == ("toy", 0.5, 1)
        assert (1, KNOBS["toy"].words(0.5)) in dash.events
        for t in (tr, code, untouched):
            t.step()
            t.step()
        assert_trees_equal(params(tr), params(code))  # the slider acts exactly as the call from code
        assert not torch.equal(params(tr)["head_a.inner.weight"], params(untouched)["head_a.inner.weight"])
        # replay: the journal's entry is a set at the same point
        replayed = mtlab.replay(tr.journal, build())
        assert replayed.get("toy") == 0.5 and replayed.step_count == 3
        assert_trees_equal(params(replayed), params(tr))
        # fork and resume
        assert tr.fork("f").get("toy") == 0.5
        state = tr.state_dict()
        assert {"name": "toy", "task": None, "linkedset": None, "value": 0.5} in state["knobs"]
        resumed = build()
        resumed.load_state_dict(state)
        assert resumed.get("toy") == 0.5
        resumed_dash = mtlab.ui.dashboard(resumed, plots=False)
        assert resumed_dash.controls.knobs["toy"].widget.value == 0.5  # its slider shows the value in force
        resumed.set("toy", 1.5)  # a change from code moves the slider
        assert resumed_dash.controls.knobs["toy"].widget.value == 1.5
    finally:
        dash.close()
        if resumed_dash is not None:
            resumed_dash.close()


def test_every_row_with_a_control_hint_gets_a_control_per_task_and_linked_set(toy):
    KNOBS.add(Knob("toy_rate", "task", default=0.1, control=("log", 1e-3, 1.0)))
    KNOBS.add(Knob("toy_rounds", "task", default=2, control=("int", 1, 8)))
    KNOBS.add(Knob("toy_mode", "trainer", default="x", control=("choice", "x", "y")))
    try:
        tr = build()
        controls = knob_controls(tr)
        expected = {"toy", "toy_rate:a", "toy_rate:b", "toy_rounds:a", "toy_rounds:b", "toy_mode", "lr", "a", "a/clean",
                    "a/noisy", "b", "b/clean"}
        assert expected <= set(controls)
        assert isinstance(controls["toy_rate:b"].widget, widgets.FloatLogSlider)
        assert isinstance(controls["toy_mode"].widget, widgets.Dropdown)
        dash = mtlab.ui.dashboard(tr, plots=False)
        try:
            c = dash.controller
            browser_update(dash.controls.knobs["toy_rounds:b"].widget, "5")
            assert tr.get("toy_rounds", task="b") == 5 and tr.get("toy_rounds", task="a") == 2
            dash.controls.knobs["toy_mode"].widget.value = "y"
            assert tr.get("toy_mode") == "y"
            assert c.set("toy_rate", 0.5, task="a") and tr.get("toy_rate", task="a") == 0.5
            assert dash.controls.knobs["toy_rate:a"].widget.value == pytest.approx(0.5)
            # a refused value is said, nothing changed
            assert not c.set("weight", -1.0, task="a", linkedset="clean")
            assert "weight" in dash.status_text and tr.get("weight", "a", "clean") == 1.0
            assert not c.set("nope", 1.0) and "unknown knob 'nope'" in dash.status_text
        finally:
            dash.close()
    finally:
        for name in ("toy_rate", "toy_rounds", "toy_mode"):
            KNOBS.remove(name)
