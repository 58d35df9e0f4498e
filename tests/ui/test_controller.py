"""The dashboard's controller without widgets: commands, refusals, run control, schedule continuation
and one state from which every text is derived (no ipywidgets imported here)."""

from __future__ import annotations

import time

import pytest
from helpers import make_examples, make_models, task_a, task_b

import mtlab
from mtlab.core.knobs import KNOBS
from mtlab.ui.controller import Controller
from mtlab.ui.schedules import continue_schedule
from mtlab.ui.texts import counter_html, progress_html, status_html


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    kw.setdefault("clip_grad_value", 0.5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", **kw)


@pytest.fixture
def ctl(one_thread):
    states = []
    c = Controller(make_trainer())
    c.subscribe(states.append)
    c.states = states  # every state handed to the views, in order
    yield c
    c.close()
    assert mtlab.ui.stop_all(wait=True) == 0, "a test left a run going"


def test_every_change_hands_one_fresh_state(ctl):
    tr = ctl.trainer
    ctl.call("step")
    assert ctl.states[-1].step == 1 and "step: done" in ctl.states[-1].status
    n = len(ctl.states)
    ctl.set_weight("a", "clean", 0.5)  # an idle slider change: a new state at once, not at the next click
    assert len(ctl.states) == n + 1 and ctl.states[-1].weights["a/clean"] == 0.5
    tr.set_weight("a", "noisy", 0.25)  # a change from code, too
    assert ctl.states[-1].weights["a/noisy"] == 0.25
    assert [t for _, t in ctl.states[-1].events] == [KNOBS["weight"].words(0.5, "a", "clean"),
                                                     KNOBS["weight"].words(0.25, "a", "noisy")]


def test_skipped_and_error_texts_clear_when_the_weights_come_back(ctl):
    ctl.set_task_weight("a", 0.0)
    ctl.set_task_weight("b", 0.0)
    assert set(ctl.states[-1].skipped) == {"a", "b"} and "skipped by step()" in counter_html(ctl.states[-1])
    assert not ctl.call("step")
    refused = ctl.states[-1]
    assert refused.status_error and "ConfigError" in refused.status and "color:#b00020" in status_html(refused)
    assert not ctl.start(3) and "raise a weight slider" in ctl.states[-1].status
    ctl.set_task_weight("a", 1.0)
    ctl.set_task_weight("b", 1.0)
    back = ctl.states[-1]  # every weight restored: no "skipped", no red error left over
    assert back.skipped == {} and "skipped" not in counter_html(back)
    assert not back.status_error and "ConfigError" not in back.status and back.run_refusal is None


def test_stepwise_commands_and_their_refusals(ctl):
    tr = ctl.trainer
    assert not ctl.call("normalize") and "process_minibatch" in ctl.states[-1].status
    assert ctl.minibatch("b", "clean") and ctl.minibatch("b", "clean")
    state = ctl.states[-1]
    assert state.phases["b"] == "accumulating" and "accumulating" in state.table_html
    assert "minibatches were accumulated by hand" in state.run_refusal
    assert not ctl.start(2) and "Click step to finish" in ctl.states[-1].status
    assert ctl.call("step")  # finishes the hand accumulation (Trainer.finish() once the core has it)
    assert tr.step_count == 1 and tr.history.iloc[-1]["b/minibatches"] == 2
    assert "finished the accumulation started by hand" in ctl.states[-1].status
    with pytest.raises(ValueError, match="stepwise"):
        ctl.call("backward")


def test_run_control_pause_refusals_and_stop(ctl):
    tr = ctl.trainer
    assert ctl.start(0)
    end = time.monotonic() + 30
    while tr.step_count < 2 and time.monotonic() < end:
        time.sleep(0.01)
    assert not ctl.start(1) and "already in progress" in ctl.states[-1].status
    assert not ctl.call("step") and "refused while a run is going" in ctl.states[-1].status
    ctl.pause()
    while ctl.states[-1].run.state != "paused" and time.monotonic() < end:  # the state says it once paused
        time.sleep(0.01)
    assert ctl.states[-1].run.state == "paused" and ctl.call("reset")  # stepwise calls work while paused
    ctl.resume()
    assert ctl.stop(wait=True)
    last = ctl.states[-1]
    assert last.run.state == "ended" and "run ended" in last.status and last.step == tr.step_count
    assert f"<b>step {tr.step_count}</b>" in counter_html(last)


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_continue_schedule_keeps_the_lr_per_step_and_clears_a_validation_stop():
    tr = make_trainer()
    schedule = mtlab.Schedule(num_steps=10, initial_learning_rate=1.0, learning_rate_decay=0.01)
    planned = [schedule.lr_at(s) for s in range(10)]
    for _ in range(10):
        tr.step()
    schedule.stopped, schedule.tries = "num_tries", 3
    note = continue_schedule(schedule, tr, 5)
    assert "validation stop (num_tries) cleared" in note and "10 -> 15" in note
    assert schedule.stopped is None and schedule.tries == 0 and schedule.num_steps == 15
    assert [schedule.lr_at(s) for s in range(10)] == pytest.approx(planned)
    assert schedule.lr_at(14) == pytest.approx(0.01 ** (14 / 10))
    assert continue_schedule(schedule, tr, 2) == ""  # room left: nothing to change


def test_a_spent_schedule_run_shows_the_same_step_everywhere(one_thread):
    tr = make_trainer()
    schedule = mtlab.Schedule(num_steps=2)
    c = Controller(tr, schedule)
    states = []
    c.subscribe(states.append)
    assert c.start(0)
    c.wait(30)
    assert tr.step_count == 2
    assert c.start(3)
    c.wait(30)
    last = states[-1]
    assert last.step == 5 and "step 5 of 5" in last.schedule and "3/3 steps" in progress_html(last)
    assert "run ended after 3 step(s) (now at step 5)" in last.status and not last.status_error
    c.close()


def test_after_a_restore_the_ended_run_says_where_it_ended_beside_the_schedule_now(one_thread):
    tr = make_trainer()
    c = Controller(tr, mtlab.Schedule(num_steps=4))
    assert c.call("step") and c.take_snapshot()
    assert c.start(0)
    c.wait(30)
    assert tr.step_count == 4 and "ended at step 4 (the schedule is finished)" in progress_html(c.state())
    assert c.restore()
    text = progress_html(c.state())
    assert "step 1 of 4" in text and "ended at step 4 (the schedule is finished)" in text  # never "finished" alone
    c.close()


def test_interrupt_during_wait_prints_one_line(one_thread, capsys, monkeypatch):
    tr = make_trainer()
    c = Controller(tr)
    assert c.start(0)
    run = c.run

    def interrupted(timeout=None):
        run.stop("interrupt")
        raise KeyboardInterrupt
    monkeypatch.setattr(run, "wait", lambda timeout=None: interrupted() if timeout is None else
                        type(run).wait(run, timeout))
    c.wait()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("Interrupted: the run stopped at step")
    assert not run.alive
    c.close()


def test_a_newer_controller_replaces_the_older_one(one_thread):
    tr = make_trainer()
    first = Controller(tr)
    n = len(tr.callbacks)
    for _ in range(5):
        Controller(tr)
    last = Controller(tr)
    assert len(tr.callbacks) == n and first.closed and not last.closed
    assert not first.start(1)  # a replaced controller does nothing
    last.close()
    assert last._on_event not in tr.callbacks


def test_the_controller_holds_its_run_control(ctl):
    from mtlab.ui.runcontrol import RunControl

    assert not isinstance(ctl, RunControl) and isinstance(ctl.runs, RunControl) and ctl.runs.host is ctl
    schedule = mtlab.Schedule(num_steps=3)
    ctl.schedule = schedule  # the dashboard's schedule is the run control's
    assert ctl.runs.schedule is schedule and ctl.state().schedule.startswith("schedule: step 0 of 3")
    assert ctl.start(1) and ctl.run is ctl.runs.run is not None
    ctl.wait(30)
    assert not ctl.alive and ctl.error is None and ctl.trainer.step_count == 1
    assert "run ended after 1 step(s)" in ctl.states[-1].status  # told by the run control, shown by the controller
