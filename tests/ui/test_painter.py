"""The live plot's pace: the painter never waits more than ``MAX_INTERVAL`` between draws however slow
they get (the old cap let a 300-ms draw push the plot 3 s apart), and a knob moved while a step is in
flight is marked on the plot before that step ends. Event-driven: no timing assertion."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="the dashboard needs matplotlib: pip install 'mtlab[notebook]'")

from helpers import make_examples, make_models, task_a, task_b  # noqa: E402

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from mtlab.core.knobs import KNOBS  # noqa: E402
from mtlab.ui.painter import MAX_INTERVAL, pace  # noqa: E402

WORDS = KNOBS["weight"].words(0.25, "a", "noisy")  # the one wording of the change


def test_draws_are_never_spaced_more_than_max_interval():
    assert MAX_INTERVAL <= 0.8  # + a full draw (~130 ms of CPU): at most 1 s apart on an idle machine
    assert pace(0.7, cost=0.35, share=0.1) == MAX_INTERVAL  # was 3.0 s: the 3.4-3.6 s pace of notebook 03
    assert pace(0.7, cost=5.0, share=0.1) == MAX_INTERVAL
    assert pace(0.7, cost=0.01, share=0.1) == 0.7  # cheap draws: the dashboard's draw_interval
    assert pace(0.05, cost=0.02, share=0.1) == pytest.approx(0.2)  # the CPU share still spaces cheap intervals


@pytest.mark.slow
def test_a_knob_moved_during_a_step_waits_for_its_next_minibatch_and_is_marked_there(one_thread):
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", clip_grad_value=0.5)
    d = mtlab.ui.dashboard(tr, refresh_s=0.0, draw_interval=0.05)
    tr.step()
    d.refresh()
    in_step, release = threading.Event(), threading.Event()

    def hold(event, info):  # the run's second step waits at its first minibatch until released
        if event == "minibatch" and tr.step_count == 2:
            in_step.set()
            release.wait(30)

    tr.add_callback(hold)
    try:
        d.start(2)
        assert in_step.wait(30)
        d.sliders["a/noisy"]._handle_msg({"content": {"data": {"method": "update", "state": {"value": 0.25}}}})
        assert tr.step_count == 2  # the step is still in flight: the change waits for its next knob read
        assert tr.pending_changes() == [WORDS]
        assert not any(e["kind"] == "weight" for e in tr.journal.changes())
    finally:
        release.set()
        d.wait()
        tr.remove_callback(hold)
    d.painter.idle(10.0)
    assert tr.pending_changes() == []
    assert (2, WORDS) in d.events  # taken at the step's next minibatch
    assert (2, WORDS) in d.live._events  # drawn: the mark is on screen
    weight = [e for e in tr.journal.changes() if e["kind"] == "weight"]
    assert [(e["step"], e["inside"], e["value"]) for e in weight] == [(2, True, 0.25)]
    d.close()
