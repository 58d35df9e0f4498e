"""The experiment folder's figures after go_backs: the validation points are those of the run the history kept,
one per step and none past the end of the training curves (validation.csv keeps every record)."""

from __future__ import annotations

import pytest
from helpers.runs import plain, script

from mtlab.training.loop import Schedule, run
from mtlab.training.plots import history_figures, kept_validation

pytestmark = pytest.mark.usefixtures("one_thread")


def run_with_go_backs() -> tuple[object, Schedule]:
    tr = plain()
    script(tr, [1.0, 2.0, 0.5, 0.7, 0.6, 0.8])  # better, worse (back to 2), better, then three worse: stop
    sch = Schedule(num_steps=100, valid_frequency=2, go_back=True, num_tries=3, valid_adapt=True)
    run(tr, sch, progress=False)
    return tr, sch


def test_the_saved_loss_plot_shows_each_kept_validation_once_and_none_past_the_curves() -> None:
    tr, sch = run_with_go_backs()
    steps = [r["step"] for r in sch.validation]
    assert steps == [2, 4, 4, 6, 6, 6] and tr.step_count == 4  # the records repeat steps and run past the history
    last = int(tr.history["step"].max())
    assert last == 4

    figures = history_figures(tr.history, sch.validation)
    for name in ("losses", "history"):
        fig = figures[name]
        ax = next(a for a in fig.axes if a.get_title() == "normalized loss" or any(
            str(ln.get_label()).endswith("(valid)") for ln in a.lines))
        valid = [ln for ln in ax.lines if str(ln.get_label()).endswith("(valid)")]
        assert valid, f"{name}: no validation points drawn"
        for line in valid:
            xs = [float(x) for x in line.get_xdata()]
            assert xs == [2.0, 4.0], (name, line.get_label(), xs)  # step 4's kept value, once; nothing at 6
            ys = [float(y) for y in line.get_ydata()]
            assert ys == [1.0, 0.5], (name, line.get_label(), ys)  # the accepted values, not the undone ones
        lo, hi = ax.get_xlim()
        assert hi < last + 1, f"{name}: the step axis runs to {hi}, past the last step {last}"


def test_kept_validation_follows_each_go_back() -> None:
    records = [{"step": 2, "action": "better"}, {"step": 4, "action": "better"},
               {"step": 6, "action": "worse+go_back_to_2+halve_lr"}, {"step": 4, "action": "worse+halve_lr"},
               {"step": 6, "action": "better"}, {"step": 8, "action": "worse+stop+go_back_to_6"},
               {"step": 8, "task": "a", "linkedset": "clean", "loss": 1.0}]
    assert [(r["step"], r.get("action")) for r in kept_validation(records)] == [
        (2, "better"), (4, "worse+halve_lr"), (6, "better"), (8, None)]
    assert kept_validation(None) == []
