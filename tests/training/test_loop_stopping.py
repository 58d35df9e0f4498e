"""The original's stopping rules in the loop: best model final, relative-improvement stop, step-0 validation,
num_tries none, per-task validation, and a go_back that continues the data instead of replaying it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.runs import assert_same, plain, script

import mtlab
from mtlab.core.state import load_safe
from mtlab.base.errors import ConfigError
from mtlab.training.loop import Schedule, run

pytestmark = pytest.mark.usefixtures("one_thread")


def trained(steps: int, num_steps: int = 100) -> mtlab.Trainer:
    """The reference: ``steps`` steps of plain training (no validation) under the same lr schedule."""
    ref = plain()
    run(ref, Schedule(num_steps=num_steps), steps=steps, progress=False)
    return ref


def script_tasks(trainer: mtlab.Trainer, values: dict[str, list[float]]) -> list[int]:
    """Every validation returns the next value of ``values[task]`` for each linked set of that task."""
    seen: list[int] = []

    def evaluate_totals(task: str, linkedset: str, num_batches: int | None = None,
                        examples: Any = None) -> tuple[float, float]:
        if (task, linkedset) == ("a", "clean"):
            seen.append(trainer.step_count)
        return values[task][len(seen) - 1], 1.0

    trainer.evaluate_totals = evaluate_totals  # type: ignore[method-assign]
    return seen


# ---------------------------------------------------------------------------------- best model final
@pytest.mark.slow
def test_a_stop_restores_the_best_model_which_is_final(tmp_path: Path) -> None:
    tr = plain()
    seen = script(tr, [1.0, 0.8, 0.9, 0.95])  # better, better, worse, worse: stops at step 4 (num_tries 2)
    sch = Schedule(num_steps=100, valid_frequency=1, num_tries=2, best_model_final=True)
    run(tr, sch, progress=False, expdir=tmp_path)
    assert seen == [1, 2, 3, 4] and sch.last_stop == "num_tries" and sch.finished
    assert sch.validation[-1]["action"] == "worse+stop+go_back_to_2"
    assert tr.step_count == 2 and sch.best_step == 2
    ref = trained(2)
    assert all(torch.equal(p, ref.params[k]) for k, p in tr.params.items())
    final = load_safe(tmp_path / "final.pt")  # the final model is the best one
    for name, model in ref.models.items():
        assert_same(final["models"][name], model.state_dict(), name)
    assert final["schedule"]["best_step"] == 2 and "best_state" in final["schedule"]


def test_without_best_model_final_the_last_model_stays() -> None:
    tr = plain()
    script(tr, [1.0, 0.8, 0.9, 0.95])
    sch = Schedule(num_steps=100, valid_frequency=1, num_tries=2)
    run(tr, sch, progress=False)
    assert tr.step_count == 4 and sch.validation[-1]["action"] == "worse+stop"
    assert all(torch.equal(p, trained(4).params[k]) for k, p in tr.params.items())


# ---------------------------------------------------------------------------------- relative improvement
# Relative improvements (prev - cur) / prev of the values 1.0, 0.999, 0.998, 0.9985, 0.999:
# 1 (first), 0.001, 0.0010010, -0.00050100, -0.00050075. Sum of |.| over the last 3 at step 4: 0.0025020;
# at step 5: 0.0020028. Both under 0.004; the step-4 and step-5 validations are worse than the best 0.998,
# the step-6 one is better again (so num_tries = 3 is never reached).
SLOW = [1.0, 0.999, 0.998, 0.9985, 0.999, 0.9975]


@pytest.mark.parametrize("after,window,threshold,stop_at", [
    (3, 0, 0.004, 4),      # window = num_tries = 3, full at step 3, step 4 > 3: stops at the first worse one
    (4, 0, 0.004, 5),      # step 4 is not after step 4: the next worse validation stops
    (3, 0, 0.0024, 5),     # 0.0025020 is not under 0.0024, 0.0020028 is
    (3, 5, 0.004, None),   # a window of 5 still holds the first validation's improvement of 1: never
    (3, 0, 0.0, None),     # off (mtlab's default)
])
def test_relative_improvement_stop(after: int, window: int, threshold: float, stop_at: int | None) -> None:
    tr = plain()
    script(tr, SLOW)
    sch = Schedule(num_steps=6, valid_frequency=1, num_tries=3, relative_improvement_threshold=threshold,
                   relative_improvement_after_step=after, relative_improvement_window=window, best_model_final=True)
    run(tr, sch, progress=False)
    if stop_at is None:
        assert sch.last_stop == "done" and len(sch.validation) == 6
        return
    assert sch.last_stop == "relative_improvement" and len(sch.validation) == stop_at
    assert sch.validation[-1]["action"] == "worse+stop_relative_improvement+go_back_to_3"
    assert tr.step_count == 3 and sch.tries < 3


def test_relative_improvement_never_stops_a_better_validation() -> None:
    tr = plain()
    script(tr, [1.0, 0.9999, 0.9998, 0.9997, 0.9996])  # tiny improvements, but each one is better
    sch = Schedule(num_steps=5, valid_frequency=1, num_tries=2, relative_improvement_threshold=0.004,
                   relative_improvement_after_step=0)
    run(tr, sch, progress=False)
    assert sch.last_stop == "done" and [r["action"] for r in sch.validation] == ["better"] * 5


def test_relative_improvement_needs_a_window() -> None:
    with pytest.raises(ConfigError, match="relative_improvement_window"):
        Schedule(num_steps=5, num_tries=None, relative_improvement_threshold=0.004)
    assert Schedule(num_steps=5, num_tries=None, relative_improvement_threshold=0.004,
                    relative_improvement_window=3).window == 3


# ---------------------------------------------------------------------------------- step 0, num_tries none
def test_validation_of_the_untrained_model_at_step_0() -> None:
    tr = plain()
    seen = script(tr, [1.0, 0.5, 0.4])
    sch = Schedule(num_steps=4, valid_frequency=2, validate_at_step_0=True)
    run(tr, sch, steps=1, progress=False)
    run(tr, sch, progress=False)  # a second run does not validate step 0 again
    assert seen == [0, 2, 4] and [r["step"] for r in sch.validation] == [0, 2, 4]
    assert sch.validation[0]["loss"] == 2.0 and sch.validation[0]["action"] == "better"
    tr = plain()
    seen = script(tr, [1.0, 0.5])
    run(tr, Schedule(num_steps=4, valid_frequency=2), progress=False)
    assert seen == [2, 4]  # mtlab's default: the first validation after valid_frequency steps


def test_going_back_to_step_0_does_not_validate_it_again() -> None:
    tr = plain()
    seen = script(tr, [1.0, 2.0, 0.5])  # step 0 best, step 2 worse (back to 0), step 2 again better
    sch = Schedule(num_steps=100, valid_frequency=2, validate_at_step_0=True, go_back=True)
    run(tr, sch, steps=4, progress=False)
    assert seen == [0, 2, 2] and [r["action"] for r in sch.validation] == ["better", "worse+go_back_to_0", "better"]


def test_num_tries_none_never_stops_on_tries() -> None:
    tr = plain()
    script(tr, [1.0 + i for i in range(8)])  # every validation worse than the first
    sch = Schedule(num_steps=8, valid_frequency=1, num_tries=None)
    run(tr, sch, progress=False)
    assert sch.last_stop == "done" and tr.step_count == 8 and sch.tries == 7 and not sch.finished
    with pytest.raises(ConfigError, match="num_tries"):
        Schedule(num_steps=8, num_tries=0)


# ---------------------------------------------------------------------------------- per task
def test_per_task_validation_stops_when_one_task_runs_out() -> None:
    values = {"a": [1.0, 0.5, 0.3, 0.2], "b": [1.0, 1.1, 1.2, 1.3]}  # totals 2.0, 1.6, 1.5: better each time
    tr = plain()
    script_tasks(tr, values)
    sch = Schedule(num_steps=100, valid_frequency=1, num_tries=2, per_task_validation=True, best_model_final=True)
    run(tr, sch, progress=False)
    assert sch.last_stop == "num_tries" and len(sch.validation) == 3
    assert [r["action"] for r in sch.validation] == ["better", "worse", "worse+stop+go_back_to_1"]
    assert sch.task_best == {"a": 0.3, "b": 1.0} and sch.task_tries == {"a": 0, "b": 2}
    assert sch.validation[-1]["worse_tasks"] == "b" and sch.best_step == 1 and tr.step_count == 1
    total = plain()
    script_tasks(total, values)
    sch = Schedule(num_steps=3, valid_frequency=1, num_tries=2)
    run(total, sch, progress=False)  # judged on the weighted total, no task is ever worse
    assert sch.last_stop == "done" and [r["action"] for r in sch.validation] == ["better"] * 3


@pytest.mark.parametrize("reset_tries,stop_at", [(True, None), (False, 4)])
def test_per_task_tries_reset_per_task(reset_tries: bool, stop_at: int | None) -> None:
    # a worse at 2 and 4, b worse at 3: with reset_tries each better result zeroes that task's count only
    values = {"a": [1.0, 1.1, 0.9, 1.0, 0.8], "b": [1.0, 0.9, 1.1, 0.8, 0.7]}
    tr = plain()
    script_tasks(tr, values)
    sch = Schedule(num_steps=5, valid_frequency=1, num_tries=2, reset_tries=reset_tries, per_task_validation=True)
    run(tr, sch, progress=False)
    if stop_at is None:
        assert sch.last_stop == "done" and sch.task_tries == {"a": 0, "b": 0}
    else:
        assert sch.last_stop == "num_tries" and tr.step_count == stop_at and sch.task_tries == {"a": 2, "b": 1}


# ---------------------------------------------------------------------------------- go_back and the data
@pytest.mark.parametrize("go_back_data,data_after", [("continue", 5), ("rewind", 3)])
def test_go_back_continues_the_data(go_back_data: str, data_after: int) -> None:
    tr = plain()
    script(tr, [1.0, 2.0])  # step 2 best; step 4 worse: back to step 2, then one more step
    sch = Schedule(num_steps=100, valid_frequency=2, go_back=True, num_tries=5, go_back_data=go_back_data)
    run(tr, sch, steps=5, progress=False)
    assert tr.step_count == 3 and sch.validation[-1]["action"] == "worse+go_back_to_2"
    # continue: the step after going back draws what a straight run draws at its 5th step (no replay);
    # rewind: what it drew at step 3, so the step is an exact replay.
    assert_same(tr.streams.state_dict(), trained(data_after).streams.state_dict(), "streams")
    replay = all(torch.equal(p, trained(3).params[k]) for k, p in tr.params.items())
    assert replay == (go_back_data == "rewind")


@pytest.mark.slow
def test_a_checkpoint_between_go_back_and_the_next_step_continues_the_same(tmp_path: Path) -> None:
    ref = plain()
    script(ref, [1.0, 2.0, 3.0, 4.0])
    run(ref, Schedule(num_steps=100, valid_frequency=2, go_back=True, num_tries=5), steps=7, progress=False)
    tr = plain()
    script(tr, [1.0, 2.0, 3.0, 4.0])
    sch = run(tr, Schedule(num_steps=100, valid_frequency=2, go_back=True, num_tries=5), steps=4, progress=False,
              expdir=tmp_path)
    assert sch.resume_streams is not None
    other = plain()
    script(other, [3.0, 4.0])  # its first validation is the run's third
    other.load_checkpoint(tmp_path / "final.pt")
    sch2 = Schedule.from_state(load_safe(tmp_path / "final.pt")["schedule"], other)
    run(other, sch2, steps=3, progress=False)
    assert other.step_count == ref.step_count
    mine, theirs = other.state_dict(), ref.state_dict()
    for key in ("models", "update", "streams", "step"):
        assert_same(mine[key], theirs[key], key)


def test_a_stage_without_tries_limit_needs_a_window_for_the_relative_stop() -> None:
    stage = {"segment_length": "full", "num_steps": 3, "num_tries": "none"}
    with pytest.raises(ConfigError, match=r"stages\[0\] has num_tries none"):
        Schedule(num_steps=3, stages=[stage], relative_improvement_threshold=0.004)
    Schedule(num_steps=3, stages=[stage], relative_improvement_threshold=0.004, relative_improvement_window=2)


def test_per_task_relative_improvement_judges_each_task_on_its_own_values() -> None:
    # a: SLOW's first four values (step 4 worse, |relative improvements| 0.0025020 over the last 3);
    # b improves fast, so the weighted total (2.0, 1.499, 1.248, 1.1235) improves every time.
    values = {"a": SLOW[:4], "b": [1.0, 0.5, 0.25, 0.125]}
    for per_task, stop in ((True, "relative_improvement"), (False, "done")):
        tr = plain()
        script_tasks(tr, values)
        sch = Schedule(num_steps=4, valid_frequency=1, num_tries=3, per_task_validation=per_task,
                       relative_improvement_threshold=0.004, relative_improvement_after_step=3, valid_adapt=True)
        run(tr, sch, progress=False)
        assert sch.last_stop == stop and len(sch.validation) == 4
    assert sch.lr_scale == 1.0
    tr = plain()
    script_tasks(tr, {"a": [1.0, 1.1, 1.2], "b": [1.0, 1.1, 0.9]})  # both worse at step 2: the lr halves once
    sch = Schedule(num_steps=3, valid_frequency=1, num_tries=3, per_task_validation=True, valid_adapt=True)
    run(tr, sch, progress=False)
    assert [r["action"] for r in sch.validation] == ["better", "worse+halve_lr", "worse+halve_lr"]
    assert sch.lr_scale == 0.25 and sch.task_tries == {"a": 2, "b": 0}


# ---------------------------------------------------------------------------------- the summary says why
@pytest.mark.slow
def test_the_summary_explains_an_early_stop_in_plain_words(tmp_path: Path) -> None:
    tr = plain()
    script(tr, [1.0, 0.8, 0.9, 0.95])  # better, better, worse, worse: stops at step 4 of 100 (num_tries 2)
    sch = Schedule(num_steps=100, valid_frequency=1, num_tries=2)
    run(tr, sch, progress=False, expdir=tmp_path)
    text = (tmp_path / "summary.txt").read_text()
    assert "stop: num_tries" in text
    why = next(line for line in text.splitlines() if line.startswith("why stopped"))
    for part in ("early stopping", "did not improve 2 times in a row", "num_tries = 2", "step 4 of 100",
                 "expected", "best.pt", "step 2"):
        assert part in why, why


def test_without_matplotlib_the_summary_says_no_plots_were_written(tmp_path: Path, monkeypatch) -> None:
    import sys

    # The plots module imports matplotlib at its top: without matplotlib, importing it fails like this.
    monkeypatch.setitem(sys.modules, "mtlab.training.plots", None)
    tr = plain()
    run(tr, Schedule(num_steps=2), progress=False, expdir=tmp_path)
    assert not list(tmp_path.glob("*.png"))
    assert "plots skipped: matplotlib is not installed" in (tmp_path / "summary.txt").read_text()


def test_a_run_without_schedule_ends_because_its_steps_are_done():
    """No schedule: the steps asked for end the run (reason "steps"), never "done" (a schedule's end)."""
    tr = plain()
    sch = run(tr, steps=2, progress=False)
    assert tr.step_count == 2 and sch.last_stop == "steps"
