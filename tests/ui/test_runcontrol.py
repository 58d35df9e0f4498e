"""The run half of the dashboard's controller (``mtlab/ui/runcontrol.py``): run on a paused run resumes it, a
long step shows its minibatches and a stop ends it early (the step abandoned as if it had not begun), and
Ctrl-C during ``wait()`` names the step the run stopped at."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from helpers import make_examples, make_models, task_a, task_b

import mtlab
import mtlab.ui
from mtlab.core.events import Event
from mtlab.ui.controller import Controller
from mtlab.ui.runs import Run
from mtlab.ui.texts import counter_html


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", clip_grad_value=0.5,
                         **kw)


def until(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for the training thread"
        time.sleep(0.005)


def slow_minibatches(trainer: mtlab.Trainer, seconds: float) -> None:
    """Every minibatch of ``trainer`` takes ``seconds`` more (a slow model)."""
    trainer.add_callback(lambda event, info: time.sleep(seconds) if event == Event.MINIBATCH else None)


@pytest.fixture
def ctl(one_thread):
    states = []
    c = Controller(make_trainer())
    c.subscribe(states.append)
    c.states = states
    yield c
    c.close()
    assert mtlab.ui.stop_all(wait=True) == 0, "a test left a run going"


def test_run_on_a_paused_run_resumes_it(ctl):
    assert ctl.start(0)
    until(lambda: ctl.trainer.step_count >= 1)
    ctl.pause()
    until(lambda: ctl.run.state == "paused")
    assert ctl.state().run_refusal is None  # nothing on screen says run is refused
    n = ctl.trainer.step_count
    assert ctl.start(0), ctl.states[-1].status
    assert "resumed the paused run" in ctl.states[-1].status and not ctl.states[-1].status_error
    until(lambda: ctl.trainer.step_count > n + 1)  # the same run goes on
    assert ctl.running and mtlab.ui.runs.runs() == [ctl.run]


def test_run_with_another_length_on_a_paused_run_says_it_goes_on_as_started(ctl):
    assert ctl.start(1000)
    until(lambda: ctl.trainer.step_count >= 1)
    ctl.pause()
    until(lambda: ctl.run.state == "paused")
    assert ctl.start(5)
    assert "not 5 steps: stop it first" in ctl.states[-1].status and ctl.run.steps == 1000


def test_a_long_step_shows_its_minibatches_and_a_stop_ends_it_early(ctl, monkeypatch):
    monkeypatch.setattr(Run, "LONG_STEP_S", 0.0)
    tr = ctl.trainer
    tr.set_minibatches_per_step(50)  # 50 rounds of a/clean, a/noisy, b/clean: 150 minibatches a step
    oracle = make_trainer()  # plain trainer, same seed: what the trainer holds if the abandoned step never began
    slow_minibatches(tr, 0.01)
    assert ctl.start(0)
    until(lambda: any(s.run is not None and s.run.minibatch >= 3 for s in ctl.states))
    shown = next(s for s in ctl.states if s.run is not None and s.run.minibatch >= 3)
    assert shown.run.minibatches == 150 and shown.step == 0
    assert f"step 0, minibatch {shown.run.minibatch} of 150" in counter_html(shown)
    ctl.stop(wait=True)
    assert tr.step_count == 0 and ctl.run.abandoned is not None and ctl.run.abandoned[0] == 0
    assert ctl.run.abandoned[1] < 150 and ctl.run.reason == "stopped"
    end = ctl.states[-1].status
    assert "step 0 was abandoned at minibatch" in end and "discarded" in end, end
    assert all(str(p) == "empty" for p in tr.phase().values())  # nothing accumulated is left
    # Data positions and RNG as before the step: the next step is the one a fresh trainer takes first.
    oracle.set_minibatches_per_step(1)
    tr.set_minibatches_per_step(1)
    tr.step()
    oracle.step()
    for name, p in tr.params.items():
        torch.testing.assert_close(p.detach(), oracle.params[name].detach(), rtol=0, atol=0)


def test_a_short_step_is_finished_before_a_stop(ctl):
    tr = ctl.trainer
    assert ctl.start(0)
    until(lambda: tr.step_count >= 1)
    ctl.stop(wait=True)
    assert ctl.run.abandoned is None and ctl.run.reason == "stopped"
    assert all(str(p) in ("empty", "applied") for p in tr.phase().values())


@pytest.fixture
def sigint_raises():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_during_wait_names_the_step_the_run_stopped_at(ctl, sigint_raises, capsys):
    tr = ctl.trainer
    slow_minibatches(tr, 0.05)  # a step takes ~0.15 s: Ctrl-C lands inside one
    assert ctl.start(0)
    until(lambda: tr.step_count >= 1)
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    ctl.wait()
    printed = capsys.readouterr().out
    assert ctl.run.state == "ended" and mtlab.ui.runs.runs() == []  # ended, not still stopping
    assert f"the run stopped at step {tr.step_count};" in printed, (printed, tr.step_count)
