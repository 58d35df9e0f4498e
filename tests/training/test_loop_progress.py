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


def test_in_a_log_every_line_carries_the_step_it_names(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """stderr a file or pipe: one whole line per refresh, each with the current step and that step's losses (the
    losses of step 1 stayed on every line up to the last)."""
    from mtlab.training import loop

    monkeypatch.setattr(loop, "LOG_PROGRESS_S", 0.0)  # a line per step
    tr = plain()
    run(tr, Schedule(num_steps=5), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in bar_lines(err) if re.search(r"step [1-9]", line)]
    history = tr.history.set_index("step")
    seen = set()
    for line in lines:
        step = int(re.search(r"step (\d+)/5", line).group(1))
        seen.add(step)
        for task in ("a", "b"):
            value = float(re.search(rf" {task}=([-\d.e+]+)", line).group(1))
            assert value == pytest.approx(history.loc[step, f"{task}/loss"], rel=1e-3), line
    assert seen >= {2, 3, 4, 5}, lines


def test_the_losses_stay_visible_at_80_columns() -> None:
    from tqdm import tqdm

    from mtlab.training.loop import _show

    tr = plain()
    tr.step()
    bar = tqdm(total=375, disable=False, unit="step", file=open("/dev/null", "w"))
    _show(bar, tr, Schedule(num_steps=375))
    line = tqdm.format_meter(**{**bar.format_dict, "ncols": 80})
    bar.close()
    assert len(line) <= 80 and "step 1/375" in line and " a=" in line and " b=" in line, line
