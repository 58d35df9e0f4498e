"""The schedule: lr decay, validation with tries / go_back / valid_adapt, Ctrl-C, exact resume, NaN skip."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from helpers import make_examples, script_validations
from helpers.recipes import write_tiny_recipe

pytestmark = pytest.mark.usefixtures("one_thread")
from helpers.runs import assert_same, plain, script

from mtlab.core.state import load_safe
from mtlab.training.loop import Schedule, run
from mtlab.apps.recipe import from_recipe, load


def test_lr_follows_the_formula_and_valid_adapt_halves_it() -> None:
    tr = plain()
    run(tr, Schedule(num_steps=8, initial_learning_rate=0.01, learning_rate_decay=0.1), progress=False)
    assert tr.history["lr"].tolist() == [0.01 * 0.1 ** (s / 8) for s in range(8)]
    tr = plain()
    script(tr, [1.0, 2.0, 3.0])
    sch = Schedule(num_steps=6, initial_learning_rate=0.01, learning_rate_decay=0.1, valid_frequency=2,
                   valid_adapt=True, num_tries=10)
    run(tr, sch, progress=False)
    scale = [1, 1, 1, 1, 0.5, 0.5]  # the validation at step 4 is worse
    assert tr.history["lr"].tolist() == [0.01 * scale[s] * 0.1 ** (s / 6) for s in range(6)]
    assert sch.lr_scale == 0.25 and [r["action"] for r in sch.validation] == ["better", "worse+halve_lr", "worse+halve_lr"]


def test_go_back_restores_exactly_the_best_state() -> None:
    ref = plain()
    run(ref, Schedule(num_steps=100), steps=2, progress=False)
    tr = plain()
    seen = script(tr, [1.0, 2.0])
    sch = Schedule(num_steps=100, valid_frequency=2, go_back=True, num_tries=5)
    run(tr, sch, steps=4, progress=False)
    assert seen == [2, 4] and sch.validation[-1]["action"] == "worse+go_back_to_2"
    assert tr.step_count == 2 and sch.best_step == 2 and sch.tries == 1
    mine, theirs = tr.state_dict(), ref.state_dict()
    for key in ("models", "update", "tasks", "streams", "rng", "step", "history"):
        assert_same(mine[key], theirs[key], key)
    a, b = next(tr.stream("a", "clean")), next(ref.stream("a", "clean"))
    assert torch.equal(a[0]["x"], b[0]["x"])


@pytest.mark.parametrize("reset_tries,values,stop_at", [
    (True, [1.0, 0.9, 0.95, 0.96, 0.97, 0.5], 5),
    (True, [1.0, 1.1, 0.9, 1.0, 1.0, 0.5], 5),
    (False, [1.0, 1.1, 0.9, 1.0, 0.5, 0.5], 4),
])
def test_validation_stops_after_num_tries_worse_results(reset_tries: bool, values: list[float], stop_at: int) -> None:
    tr = plain()
    seen = script(tr, values)
    num_tries = 3 if values[1] < values[0] else 2
    sch = Schedule(num_steps=100, valid_frequency=1, num_tries=num_tries, reset_tries=reset_tries)
    run(tr, sch, progress=False)
    assert sch.last_stop == "num_tries" and sch.finished and tr.step_count == stop_at == len(seen)
    assert sch.tries == num_tries and sch.validation[-1]["action"] == "worse+stop"
    assert [r["loss"] for r in sch.validation] == [2 * v for v in values[:stop_at]]  # two tasks of weight 1
    run(tr, sch, progress=False)  # a finished schedule trains no further
    assert tr.step_count == stop_at and sch.last_stop == "num_tries"


@pytest.mark.slow
def test_nan_minibatch_is_skipped_under_nonfinite_skip(tmp_path: Path) -> None:
    ex = make_examples(30, 3)
    ex[7] = {**ex[7], "x": ex[7]["x"].clone()}
    ex[7]["x"][0, 0] = float("nan")
    tr = plain("skip", clean=ex)
    sch = run(tr, Schedule(num_steps=10), progress=False, expdir=tmp_path)  # one epoch: the NaN batch once
    skipped = tr.history["skipped"]
    assert skipped.sum() == 1 and sch.skipped == [int(tr.history["step"][skipped].iloc[0])]
    assert all(torch.isfinite(p).all() for p in tr.params.values())
    assert "skipped       1 non-finite steps" in (tmp_path / "summary.txt").read_text()


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_saves_and_resumes_exactly(tmp_path: Path) -> None:
    ref = plain()
    run(ref, Schedule(num_steps=8), progress=False)
    tr = plain()

    def on_event(event: str, info: dict) -> None:
        if event == "apply" and info["step"] == 3:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while step 3 is being applied

    tr.add_callback(on_event)
    sch = run(tr, Schedule(num_steps=8), progress=False, expdir=tmp_path)
    assert sch.last_stop == "interrupted" and tr.step_count == 3
    assert (tmp_path / "final.pt").exists() and (tmp_path / "history.csv").exists()
    other = plain()
    other.load_checkpoint(tmp_path / "final.pt")
    sch2 = Schedule.from_state(load_safe(tmp_path / "final.pt")["schedule"], other)
    run(other, sch2, progress=False)
    assert all(torch.equal(p, ref.params[k]) for k, p in other.params.items())
    assert other.history.equals(ref.history)


def test_interrupt_inside_a_step_discards_it() -> None:
    ref = plain()
    run(ref, Schedule(num_steps=6), progress=False)
    tr = plain()
    calls = {"n": 0}

    def on_event(event: str, info: dict) -> None:
        if event == "minibatch" and tr.step_count == 3:
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt  # a second Ctrl-C in the middle of step 4

    tr.add_callback(on_event)
    sch = run(tr, Schedule(num_steps=6), progress=False)
    assert sch.last_stop == "interrupted" and tr.step_count == 3
    assert set(tr.phase().values()) == {"empty"}
    tr.events.listeners.clear()
    run(tr, sch, progress=False)
    assert all(torch.equal(p, ref.params[k]) for k, p in tr.params.items())
    assert tr.history.equals(ref.history)


@pytest.mark.slow
def test_n_steps_save_load_n_steps_equals_2n_steps(tiny_corpus: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    values = [1.0, 2.0, 0.5, 0.7, 0.6, 0.8]  # better, worse (go back), better, then three worse: stop
    calls = script_validations(monkeypatch, values)
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=6, valid_frequency=2)
    full_exp = from_recipe(recipe)
    full = full_exp.trainer
    run(full_exp, progress=False)
    assert calls == [2, 4, 4, 6, 6, 6] and full_exp.schedule.last_stop == "num_tries"
    calls.clear()
    half = from_recipe(recipe)
    run(half, steps=3, progress=False, expdir=tmp_path / "exp")
    resumed_exp = load(tmp_path / "exp" / "final.pt")
    resumed = resumed_exp.trainer
    assert resumed.step_count == 3 and resumed_exp.schedule.best_step == 2
    sch = run(resumed_exp, progress=False, expdir=tmp_path / "exp")  # goes back to step 2 from final.pt's best state
    assert calls == [2, 4, 4, 6, 6, 6] and sch.last_stop == "num_tries" and resumed.step_count == 4
    assert [r["action"] for r in sch.validation] == [
        "better", "worse+go_back_to_2+halve_lr", "better", "worse+go_back_to_4+halve_lr",
        "worse+go_back_to_4+halve_lr", "worse+stop+go_back_to_4"]
    a, b = full.state_dict(), resumed.state_dict()
    for key in ("models", "update", "tasks", "streams", "rng", "step", "knobs", "history"):
        assert_same(a[key], b[key], key)
    assert full.history.equals(resumed.history)
    assert_same(full_exp.schedule.state_dict(include_best=False), sch.state_dict(include_best=False), "schedule")
    for t, task in full.tasks.items():
        for s in task.linkedsets:
            x, y = next(full.stream(t, s)), next(resumed.stream(t, s))
            assert torch.equal(x[0]["features"], y[0]["features"])
    files = {p.name for p in (tmp_path / "exp").iterdir()}
    assert {"recipe.toml", "recipe.json", "stats", "best.pt", "final.pt", "history.csv", "validation.csv",
            "losses.png", "grad_norms.png", "summary.json", "summary.txt"} <= files
