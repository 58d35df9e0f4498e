"""job.dashboard(): the live figure over the job's history, a control per knob moving it in the job through
job.set, the change log, pause and stop, and the end of the job said in red (a job in a thread of this process,
reached over its socket)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from helpers import make_examples, make_models, task_a
from helpers.jobs import start_job

import mtlab
from mtlab.training.loop import Schedule
from mtlab.ui.remote import JobDashboard

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # a figure and a job: a few seconds


def test_the_dashboard_of_a_job_shows_its_history_moves_its_knobs_and_says_its_end(tmp_path) -> None:
    task = task_a((make_examples(24, 1), make_examples(24, 2)))
    tr = mtlab.Trainer(make_models(), [task], lr=0.01, numbatches_to_aggregate=2, device="cpu", seed=3)
    exp = SimpleNamespace(trainer=tr, schedule=Schedule(num_steps=10**6, initial_learning_rate=0.01), recipe={})
    steering, thread = start_job(exp, tmp_path)
    thread.start()
    job = mtlab.attach(tmp_path, timeout=10)
    dash = job.dashboard(refresh_s=0.2)
    try:
        assert isinstance(dash, JobDashboard)
        assert ("weight", "a", "noisy") in dash.controls and ("lr", None, None) in dash.controls
        while not dash.view.data.series:
            time.sleep(0.1)
            dash.refresh()
        assert dash.image.value[:4] == b"\x89PNG" and "running at step" in dash.status.value
        dash.controls[("weight", "a", "noisy")].value = 0.25  # the slider moves the knob in the job
        assert tr.get("weight", "a", "noisy") == 0.25 and "in force from step" in dash.view.status
        dash.refresh()
        assert any("a/noisy weight" in line and "(attached)" in line for line in dash.view.lines)
        dash.buttons["stop"].click()
        thread.join(30)
        time.sleep(0.5)
        dash.refresh()
        assert "ended at step" in dash.status.value and "#b00" in dash.status.value  # said, in red
        assert all(b.disabled for b in dash.buttons.values())
    finally:
        dash.close()
        steering.stopping.set()
        thread.join(30)
