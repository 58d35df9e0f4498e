"""The loop's progress bar: its time left counts validation. Until the first validation it shows none (the steps
alone gave the demo a first estimate of half the real time); from then on the run's average rate, validations
included (tqdm's smoothing off), gives it."""

from __future__ import annotations

import re

import pytest
from helpers.runs import plain, script

from mtlab.training.loop import NO_ESTIMATE_YET, Schedule, run

pytestmark = pytest.mark.usefixtures("one_thread")
TIME_LEFT = re.compile(r"\[\d\d:\d\d<\d\d:\d\d")  # tqdm's "[elapsed<remaining" once it has an estimate
NOT_YET = "time left: after the first validation"


def bar_lines(err: str) -> list[str]:
    return [line.strip() for line in re.split(r"[\r\n]", err) if line.strip().startswith("train:")]


def test_no_time_left_before_the_first_validation_then_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert NOT_YET in NO_ESTIMATE_YET
    tr = plain()
    script(tr, [1.0, 0.9, 0.8])
    run(tr, Schedule(num_steps=6, valid_frequency=2), progress=True)
    lines = bar_lines(capsys.readouterr().err)
    assert len(lines) >= 2, lines
    assert NOT_YET in lines[0] and not TIME_LEFT.search(lines[0]), lines[0]
    assert TIME_LEFT.search(lines[-1]) and NOT_YET not in lines[-1], lines[-1]


@pytest.mark.parametrize("valid_frequency,num_steps,steps", [(0, 3, None), (10, 3, None), (4, 10, 2)])
def test_a_run_without_a_validation_ahead_shows_the_time_left_from_the_start(
        valid_frequency: int, num_steps: int, steps: int | None, capsys: pytest.CaptureFixture[str]) -> None:
    """No validation in the schedule, none before its end, or none within the steps asked for."""
    tr = plain()
    script(tr, [1.0, 0.9])
    run(tr, Schedule(num_steps=num_steps, valid_frequency=valid_frequency), steps=steps, progress=True)
    lines = bar_lines(capsys.readouterr().err)
    assert lines and not any(NOT_YET in line for line in lines), lines
