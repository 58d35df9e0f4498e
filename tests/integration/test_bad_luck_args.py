"""Bad luck, round 5, in the arguments: `adam_tf1`'s options, `NoiseScale`'s, every exercise's, and a checkpoint
from a newer mtlab given to `mtlab resume`. Each refusal is an mtlab error that names the argument and the value
expected; each case says what it tried (tests/helpers/campaign.py)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_examples, make_models, task_a, task_b
from helpers.campaign import record

import mtlab
from mtlab import exercises
from mtlab.core.optimizers import AdamTF1

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(16, 31)
    return mtlab.Trainer(make_models(), [task_a((ex, ex), batch_size=4), task_b(ex, batch_size=4)],
                         numbatches_to_aggregate=2, device="cpu", lr=1e-2, **kw)


# ------------------------------------------------------------------ 7. adam_tf1's options
@pytest.mark.parametrize("options, named", [
    ({"betas": (0.9,)}, "betas"), ({"betas": "0.9,0.999"}, "betas"), ({"betas": ("0.9", "0.999")}, "betas"),
    ({"betas": (0.9, 1.5)}, "betas"), ({"eps": "1e-8"}, "eps"), ({"eps": True}, "eps"), ({"eps": -1.0}, "eps"),
    ({"lr": 0.1}, "lr"), ({"momentum": 0.9}, "momentum"),
])
def test_bad_adam_tf1_options_are_refused_at_construction_naming_the_option(options, named):
    with pytest.raises(mtlab.ConfigError) as info:
        _trainer(optimizer="adam_tf1", adam=options)
    text = str(info.value)
    held = f"'{named}'" in text and ("must be" in text or "may not" in text or "takes the options" in text)
    record(f"option checked: adam_tf1 {named}", held)
    assert held, text


def test_the_optimizer_class_checks_its_arguments_too():
    with pytest.raises(mtlab.ConfigError, match="'betas'"):
        AdamTF1(torch.nn.Linear(2, 1).parameters(), betas=(0.9,))
    with pytest.raises(mtlab.ConfigError, match="lr"):
        AdamTF1(torch.nn.Linear(2, 1).parameters(), lr="1e-3")
    _trainer(optimizer="adam_tf1", adam={"betas": [0.8, 0.99], "eps": 1e-7}).step()  # good options still train


# ------------------------------------------------------------------ 6. NoiseScale's options and its estimates
@pytest.mark.parametrize("beta", ["high", None, True, 1.0, -0.1, math.nan])
def test_noise_scale_beta_is_checked_naming_it(beta):
    with pytest.raises(mtlab.ConfigError) as info:
        mtlab.NoiseScale(beta=beta)
    held = "beta" in str(info.value) and "[0, 1)" in str(info.value)
    record("option checked: NoiseScale beta", held)
    assert held, str(info.value)


def test_the_noise_scale_is_never_negative_and_suggest_says_why_it_has_none():
    tr = _trainer(noise_scale=True)  # task b: few examples, noise swamps |G|², its estimate goes below zero
    for _ in range(4):
        tr.step()
    h = tr.history
    g2 = h["gns_g2/b"]
    assert (g2 < 0).any(), "the case needs a negative |G|² estimate"  # the per-step unbiased estimate may be
    columns = [c for c in h if c.startswith("gns/") or c.startswith("gns_minibatches/")]
    values = h[columns].to_numpy().ravel()
    held = not (values[~pd_isnan(values)] <= 0).any()
    record("noise scale: no negative value in the history", held)
    assert held, h[columns]
    tr2 = _trainer(noise_scale=True)
    tr2.step()
    tr2.noise_scale.tasks["b"].ema_g2 = -tr2.noise_scale.tasks["b"].ema_g2.abs()  # as after a run of negative ones
    got = tr2.noise_scale.suggest(tr2)
    held = got["b"] is None and "not positive" in got.why["b"] and "b" in repr(got) and "not positive" in repr(got)
    record("noise scale: suggest() says why it has none", held)
    assert held, (dict(got), got.why)


def test_suggest_says_one_minibatch_is_not_enough():
    tr = _trainer(noise_scale=True)
    tr.numbatches_to_aggregate = 1
    tr.set_weight("a", "noisy", 0.0)
    tr.step()
    got = tr.noise_scale.suggest(tr)
    assert got == {"a": None, "b": None} and "two minibatches" in got.why["a"], got.why


def pd_isnan(values):
    import numpy as np

    return np.isnan(values.astype(float))


# ------------------------------------------------------------------ 8. the exercises' arguments
def _reduce(sums, norms):
    return sum(sums) / sum(norms)


EXERCISE_CALLS = {
    "lengths as an int": (lambda tr: exercises.accumulation_matches_one_pass(_reduce, lengths=6), "lengths"),
    "lengths as text": (lambda tr: exercises.accumulation_matches_one_pass(_reduce, lengths="6,100"), "lengths"),
    "lengths of floats": (lambda tr: exercises.accumulation_matches_one_pass(_reduce, lengths=(6.5, 100)), "lengths"),
    "seed as text": (lambda tr: exercises.accumulation_matches_one_pass(_reduce, seed="0"), "seed"),
    "seed as a float": (lambda tr: exercises.plant_nan(tr, seed=1.5), "seed"),
    "minibatches as text": (lambda tr: exercises.plant_nan(tr, minibatches="4"), "minibatches"),
    "minibatches as a float": (lambda tr: exercises.plant_nan(tr, minibatches=4.0), "minibatches"),
    "ratio as text": (lambda tr: exercises.gradient_norm_ratio(tr, "a", "b", ratio="0.5"), "ratio"),
    "rtol as text": (lambda tr: exercises.gradient_norm_ratio(tr, "a", "b", rtol="5%"), "rtol"),
    "rounds as text": (lambda tr: exercises.weighted_gradient_norms(tr, rounds="2"), "rounds"),
    "rounds as a float": (lambda tr: exercises.weighted_gradient_norms(tr, rounds=1.0), "rounds"),
    "tasks as one name": (lambda tr: exercises.weighted_gradient_norms(tr, tasks="a"), "tasks"),
    "trainer=None (norms)": (lambda tr: exercises.weighted_gradient_norms(None), "trainer"),
    "trainer=None (ratio)": (lambda tr: exercises.gradient_norm_ratio(None, "a", "b"), "trainer"),
    "trainer=None (plant)": (lambda tr: exercises.plant_nan(None), "trainer"),
    "puzzle=None": (lambda tr: exercises.found_planted_nan(None, ("a", "clean", 0)), "puzzle"),
}


@pytest.mark.parametrize("case", list(EXERCISE_CALLS))
def test_an_exercise_given_a_wrong_argument_names_it(case):
    call, named = EXERCISE_CALLS[case]
    tr = _trainer()
    with pytest.raises(mtlab.ConfigError) as info:
        call(tr)
    text = str(info.value)
    held = named in text and ("must be" in text or "must list" in text)
    record(f"option checked: exercise {case}", held)
    assert held, text


def test_plant_nan_right_after_a_step_plants_and_the_answer_counts_from_the_fresh_step():
    tr = _trainer()
    tr.step()
    puzzle = exercises.plant_nan(tr, seed=3, minibatches=4)
    found = mtlab.debug.find_nonfinite(tr)
    held = bool(exercises.found_planted_nan(puzzle, found))
    record("option checked: exercise plant_nan after a step", held)
    assert held, (puzzle.task, puzzle.linkedset, puzzle.minibatch, found)
    with pytest.raises(mtlab.ConfigError, match="already holds part of a step"):
        exercises.plant_nan(tr)  # now the step is in progress


# ------------------------------------------------------------------ 9. a checkpoint from a newer mtlab, by `mtlab resume`
def test_resume_of_a_newer_checkpoint_names_the_file(tmp_path, capsys):
    from mtlab.apps import cli
    from mtlab.core.state import save_atomic

    path = tmp_path / "final.pt"
    _trainer().save(path, extra={"recipe": {"name": "from a newer mtlab"}})
    state = torch.load(path, weights_only=True)
    state["version"] = 99
    state.pop("checksum")
    save_atomic(state, path)  # with a checksum that matches: only the version is new
    code = cli.main(["resume", str(tmp_path), "--threads", "1", "--no-progress"])
    err = capsys.readouterr().err.splitlines()[-1]
    held = code == cli.EXIT_USAGE and str(path) in err and "version 99" in err and "upgrade" in err
    record("message: newer checkpoint by mtlab resume names the file", held)
    assert held, err
