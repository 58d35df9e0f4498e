"""Background runs: one per trainer, stoppable from any dashboard of it, from code and by an
interrupt; hand-accumulated minibatches, skipped tasks, refusals, status, errors, tooltips,
exports and snapshots, all without a browser."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="the dashboard needs matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from mtlab.core.events import Event, ValidationInfo  # noqa: E402


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    kw.setdefault("clip_grad_value", 0.5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", **kw)


def until(cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the training thread")
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def no_runs_left(one_thread):
    yield
    assert mtlab.ui.stop_all(wait=True) == 0, "a test left a run going"


def test_a_new_dashboard_adopts_the_run_and_its_stop_works():
    tr = make_trainer()
    first = mtlab.ui.dashboard(tr, plots=False)
    assert first.start(0)
    until(lambda: tr.step_count >= 2)
    second = mtlab.ui.dashboard(tr, plots=False)  # the dashboard cell re-run during a run
    assert second.running and second.run is first.run and "already in progress" in second.status_text
    second.buttons["stop"].click()
    until(lambda: not first.run.alive)
    n = tr.step_count
    time.sleep(0.2)
    assert tr.step_count == n and not first.running and not second.running
    assert "run ended" in second.status_text and "replaced by a newer dashboard" in first.status_text
    assert first.controller._on_event not in tr.callbacks  # the replaced one let go of the trainer
    assert mtlab.ui.current_run(tr) is None
    assert second.start(2)  # and a new run can start from the new one
    second.wait(20)
    assert tr.step_count == n + 2
    first.close()
    second.close()


def test_stop_all_stops_every_run_from_code():
    t1, t2 = make_trainer(), make_trainer()
    d1, d2 = mtlab.ui.dashboard(t1, plots=False), mtlab.ui.dashboard(t2, plots=False)
    assert d1.start(0) and d2.start(0)
    until(lambda: t1.step_count >= 1 and t2.step_count >= 1)
    assert len(mtlab.ui.runs.runs()) == 2, (d1.run.reason, d2.run.reason, d1.run.error, d1.status_text)
    assert mtlab.ui.stop_all() == 2
    assert not d1.running and not d2.running and mtlab.ui.runs.runs() == []
    assert d1.run.reason == "stopped"
    d1.close()
    d2.close()


def test_sigint_in_the_main_thread_stops_the_run(sigint_raises):
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False)
    assert d.start(0)
    until(lambda: tr.step_count >= 1)
    # What Kernel -> Interrupt does: SIGINT to the process, handled in the main thread.
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    d.wait(20)
    assert not d.running and d.run.reason == "interrupted"
    d.close()


def test_step_after_hand_minibatches_finishes_that_accumulation():
    tr = make_trainer(numbatches_to_aggregate=1)
    d = mtlab.ui.dashboard(tr, plots=False)
    d.task_dropdown.value = "b"
    for _ in range(3):
        d.buttons["minibatch"].click()
    assert "step button will finish this accumulation" in d.status_text
    d.buttons["step"].click()
    row = tr.history.iloc[-1]
    assert tr.step_count == 1 and row["b/minibatches"] == 3  # not 1 fresh minibatch: the 3 processed by hand
    assert "finished the accumulation started by hand (b: 3 minibatch(es))" in d.status_text
    d.buttons["step"].click()  # nothing accumulated: a whole fresh cycle
    assert tr.history.iloc[-1]["b/minibatches"] == 1 and "a whole cycle" in d.status_text
    d.close()


def test_a_task_with_every_linked_set_at_weight_0_is_said_to_be_skipped():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False)
    d.sliders["b/clean"].value = 0.0
    d.buttons["step"].click()
    assert "skipped by step(): b (all its linked sets have weight 0)" in d.counter.value
    assert "skipped (all its linked sets have weight 0)" in d.table.value
    assert "skipped b (all its linked sets have weight 0)" in d.status_text
    assert any("task b skipped" in text for _, text in d.events)
    d.sliders["b/clean"].value = 1.0
    assert any("task b trains again" in text for _, text in d.events)
    d.close()


def test_a_run_step_would_refuse_is_refused_without_a_thread():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False)
    d.buttons["minibatch"].click()
    before = threading.active_count()
    d.buttons["run"].click()
    assert "run refused" in d.status_text and "accumulated by hand" in d.status_text
    assert d.run is None and threading.active_count() == before
    tr.reset()
    for key in ("a", "b"):
        d.sliders[key].value = 0.0
    assert not d.start(0) and "every task is skipped" in d.status_text and d.run is None
    d.close()


def test_status_is_never_stale():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False)
    d.buttons["stop"].click()
    assert "no run in progress" in d.status_text
    d.buttons["pause"].click()
    assert "no run in progress" in d.status_text
    d.start(0)
    until(lambda: tr.step_count >= 1)
    d.buttons["pause"].click()
    until(lambda: d.run.state == "paused")
    until(lambda: d.status_text.startswith("paused at step"))
    assert d.buttons["pause"].description == "resume"
    time.sleep(0.6)
    run = d.run
    assert run.active_seconds() < (time.monotonic() - run.started) - 0.5  # paused time is not running time
    d.buttons["pause"].click()
    until(lambda: d.status_text == "running")
    d.buttons["stop"].click()
    d.wait(20)
    assert "run ended" in d.status_text
    d.close()


def test_one_clearable_error_area():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False)
    tr.models["enc"].register_forward_hook(lambda m, i, o: o * float("nan"))
    for _ in range(2):
        d.start(0)
        d.wait(20)
        assert isinstance(d.error, mtlab.NonFiniteError)
        tr.reset()
    assert d.error_box.value.count("Traceback") == 1 and "<details>" in d.error_box.value
    assert d.buttons["clear_error"].layout.display != "none"
    d.buttons["clear_error"].click()
    assert d.error_box.value == "" and d.buttons["clear_error"].layout.display == "none"
    d.close()


def test_every_button_and_slider_has_a_tooltip():
    d = mtlab.ui.dashboard(make_trainer(), plots=False)
    controls = [*d.buttons.values(), *d.sliders.values(), d.lr_slider, d.clip_slider, d.clip_toggle,
                d.task_dropdown, d.set_dropdown, d.steps_box, d.snapshot_dropdown, d.smoothing_slider, d.scale_toggle]
    missing = [getattr(c, "description", c) for c in controls if not (c.tooltip or "").strip()]
    assert not missing
    assert "Needs" in d.buttons["clip"].tooltip and "normalize()" in d.buttons["clip"].tooltip
    d.close()


@pytest.mark.slow
def test_exports_write_png_svg_and_csv(tmp_path):
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False, export_dir=tmp_path / "out")
    d.buttons["step"].click()
    d.buttons["step"].click()
    for kind, magic in (("png", b"\x89PNG"), ("svg", b"<?xml"), ("csv", b"step,")):
        d.buttons[f"export_{kind}"].click()
        assert f"exported {kind.upper()}" in d.status_text and "download" in d.export_links.value
        (path,) = (tmp_path / "out").glob(f"*.{kind}")
        assert path.read_bytes().startswith(magic)
    csv = next((tmp_path / "out").glob("*.csv")).read_text().splitlines()
    assert len(csv) == 3
    d.close()


@pytest.mark.slow
def test_choose_the_snapshot_and_keep_the_abandoned_branch_grey():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, refresh_s=0.0)
    d.buttons["step"].click()
    d.buttons["snapshot"].click()  # #1 at step 1
    d.buttons["step"].click()
    d.buttons["snapshot"].click()  # #2 at step 2
    for _ in range(3):
        d.buttons["step"].click()
    assert [label for label, _ in d.snapshot_dropdown.options] == ["#1: step 1", "#2: step 2"]
    d.snapshot_dropdown.value = 0
    d.buttons["restore"].click()
    assert tr.step_count == 1 and "restored snapshot #1 (step 1)" in d.status_text
    ghost = d.live.lines["ghost:a/loss"]
    assert list(ghost.get_xdata()) == [2, 3, 4, 5] and ghost.get_color() == mtlab.plots.GHOST
    assert ghost.get_zorder() < d.live.lines["a/loss"].get_zorder()  # the abandoned branch under the live one
    assert list(d.live.lines["a/loss"].get_xdata()) == [1]
    assert any("restored step 1" in t for _, t in d.events)
    d.close()


def test_progress_bar_and_validation_table():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False, refresh_s=0.0)
    assert d.start(4)
    d.wait(20)
    assert d.progress.max == 4 and d.progress.value == 4 and "4/4 steps" in d.progress_label.value
    # The loop's validation event, as mtlab.training.loop emits it to the trainer's callbacks.
    record = {"step": 4, "a/clean": 1.5, "a": 1.4, "b/clean": 0.9, "b": 0.9, "loss": 2.3, "lr": 0.01,
              "action": "better"}
    for cb in list(tr.callbacks):
        cb(Event.VALIDATION, ValidationInfo(step=4, record=record))
    d.refresh()
    assert "<th>valid loss</th>" in d.validation_table.value and "better" in d.validation_table.value
    assert "2.3" in d.validation_table.value
    d.close()


def fake_loop(validate_every: int = 2):
    """The training loop's contract (``mtlab.run``): between_steps before each step (True
    stops), "validation" events to the trainer's callbacks."""
    def run(trainer, schedule=None, steps=None, progress=True, expdir=None, between_steps=None):
        done = 0
        while not (between_steps is not None and between_steps()) and (steps is None or done < steps):
            trainer.step()
            done += 1
            if trainer.step_count % validate_every == 0:
                record = {"step": trainer.step_count, "a": 1.0 / trainer.step_count, "b": 0.5, "loss": 1.5,
                          "lr": trainer.lr, "action": "better"}
                for cb in list(trainer.callbacks):
                    cb(Event.VALIDATION, ValidationInfo(step=trainer.step_count, record=record))
        return None
    return run


@pytest.mark.slow
def test_a_run_goes_through_the_training_loop(monkeypatch):
    monkeypatch.setattr(mtlab.ui.runs, "run", fake_loop())  # the dashboard calls the one training loop
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, refresh_s=0.0)
    assert d.start(6)
    d.wait(20)
    assert tr.step_count == 6 and d.run.steps_done == 6 and d.run.reason == "steps"
    assert [r["step"] for r in d.records] == [2, 4, 6]
    assert "valid loss" in d.validation_table.value
    assert list(d.live.lines["valid:a"].get_xdata()) == [2, 4, 6]
    # Pause blocks inside between_steps; stop returns True from it.
    assert d.start(0)
    until(lambda: tr.step_count >= 8)
    d.pause()
    until(lambda: d.run.state == "paused")
    n = tr.step_count
    time.sleep(0.3)
    assert tr.step_count == n
    d.stop()
    assert not d.running and d.run.reason == "stopped" and tr.step_count == n
    d.close()


def test_the_interrupt_handler_is_put_back_after_the_runs():
    before = signal.getsignal(signal.SIGINT)
    d = mtlab.ui.dashboard(make_trainer(), plots=False)
    d.start(2)
    d.wait(20)
    assert signal.getsignal(signal.SIGINT) is before
    d.close()


@pytest.mark.slow
def test_a_dashboard_run_uses_the_loop_with_lr_decay_and_validation():
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, clip_grad_value=0.5, device="cpu")
    for ls in tr.tasks["a"].linkedsets.values():
        ls.valid = ex[:6]
    schedule = mtlab.Schedule(num_steps=6, initial_learning_rate=1e-2, learning_rate_decay=0.1, valid_frequency=2)
    d = mtlab.ui.dashboard(tr, schedule=schedule, refresh_s=0.0)
    assert d.start(0)
    d.wait(30)
    assert d.run.reason == "done" and tr.step_count == 6
    lrs = tr.history["lr"].tolist()
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < lrs[0] * 0.5  # decayed by the schedule
    assert [r["step"] for r in d.records] == [2, 4, 6] and "valid loss" in d.validation_table.value
    xs, _ = d.live.lines["valid:a"].get_data()
    assert list(xs) == [2, 4, 6]
    xs, _ = d.live.lines["valid:a/clean"].get_data()
    assert list(xs) == [2, 4, 6]  # one point per step, though evaluate events came too
    assert d.lr_slider.value == pytest.approx(tr.lr)
    assert "6/6 steps" in d.progress_label.value
    d.close()


def test_step_finishes_a_hand_accumulation_already_normalized():
    tr = make_trainer(numbatches_to_aggregate=1)
    d = mtlab.ui.dashboard(tr, plots=False)
    d.buttons["minibatch"].click()
    d.buttons["minibatch"].click()
    d.buttons["normalize"].click()
    d.buttons["step"].click()
    assert tr.step_count == 1 and tr.history.iloc[-1]["a/minibatches"] == 2
    assert "with clip, apply instead of a fresh step()" in d.status_text
    d.close()


def test_run_continues_a_finished_schedule_with_its_rules():
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, clip_grad_value=0.5, device="cpu")
    schedule = mtlab.Schedule(num_steps=4, initial_learning_rate=1e-2, learning_rate_decay=0.1)
    d = mtlab.ui.dashboard(tr, schedule=schedule, plots=False)
    assert d.start(0)  # 0: to the schedule's end
    d.wait(30)
    assert tr.step_count == 4 and d.run.reason == "done"
    planned = [schedule.lr_at(s) for s in range(4)]
    d.steps_box.value = "3"
    d.buttons["run"].click()  # the schedule is spent: the run button continues it, no code needed
    d.wait(30)
    assert tr.step_count == 7 and d.run.reason == "done" and d.error is None
    assert "set dash.schedule" not in d.status_text and "run ended after 3 step(s)" in d.status_text
    assert schedule.num_steps == 7 and any("schedule extended: 4 -> 7" in t for _, t in d.events)
    assert [schedule.lr_at(s) for s in range(4)] == pytest.approx(planned)  # the same decay per step
    lrs = tr.history["lr"].tolist()
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(1e-2 * 0.1 ** (6 / 4))
    assert "step 7 of 7" in d.progress_label.value and "3/3 steps" in d.progress_label.value
    assert "<b>step 7</b>" in d.counter.value  # one state: the counter and the schedule agree
    d.close()


def test_run_until_stopped_after_the_schedule_and_a_validation_stop_is_cleared():
    tr = make_trainer()
    schedule = mtlab.Schedule(num_steps=2)
    d = mtlab.ui.dashboard(tr, schedule=schedule, plots=False)
    d.buttons["step"].click()
    d.buttons["step"].click()
    schedule.stopped = "num_tries"  # as validation leaves it
    schedule.tries = 3
    assert d.start(0)  # spent: until stopped
    until(lambda: tr.step_count >= 8)  # past the old end and past one more stage length
    d.stop()
    assert d.run.reason == "stopped" and schedule.stopped is None and schedule.tries == 0
    assert schedule.num_steps >= tr.step_count
    d.close()


@pytest.mark.slow
def test_only_the_newest_dashboard_of_a_trainer_stays_attached():
    tr = make_trainer()
    old = mtlab.ui.dashboard(tr, refresh_s=0.0, draw_interval=0.05, max_draw_share=1.0)
    assert old.start(0)
    until(lambda: old.redraws >= 2, 60)
    before = len(tr.callbacks)
    dashes = [mtlab.ui.dashboard(tr, plots=False) for _ in range(5)]  # the cell re-run five times
    new = mtlab.ui.dashboard(tr, refresh_s=0.0, draw_interval=0.05, max_draw_share=1.0)
    assert len(tr.callbacks) == before and len(old.run._listeners) == 1  # no listener piles up
    assert all("replaced by a newer dashboard" in x.status_text for x in (old, *dashes))
    time.sleep(0.3)  # a draw in flight may finish
    n_old, n_new = old.redraws, new.redraws
    until(lambda: new.redraws >= n_new + 2, 60)
    assert old.redraws == n_old  # the replaced one no longer spends time drawing
    old.buttons["step"].click()  # and its controls do nothing
    new.stop()
    assert "run ended" in new.status_text and "replaced" in old.status_text
    for x in (old, *dashes, new):
        x.close()


@pytest.mark.slow
def test_inline_painter_draws_between_steps_in_the_run_thread():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, refresh_s=0.0, draw_interval=0.05, max_draw_share=1.0, painter="inline")
    assert d.start(0)
    until(lambda: d.redraws >= 3, 60)
    d.stop()
    assert d.painter._thread is None  # no drawing thread was started
    with pytest.raises(ValueError, match="painter"):
        mtlab.ui.dashboard(tr, painter="gpu")
    d.close()
