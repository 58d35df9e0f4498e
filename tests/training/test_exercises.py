"""The checked exercises grade right and wrong answers correctly; plain PyTorch is the oracle."""

from __future__ import annotations

import math

import pytest
import torch

import mtlab
from mtlab import exercises
from helpers import make_examples, make_models, task_a, task_b


def ce_sums(lengths, seed=0):
    """The check's own setting rebuilt with plain torch: (model, minibatches)."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(4, 3).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model, [(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))
                   for n in lengths]


def test_result_is_plain_for_graders():
    ok = exercises.CheckResult("x", True, "fine", {"a": 1})
    bad = exercises.CheckResult("x", False, "no")
    assert ok and not bad and ok.passed and not bad.passed
    assert repr(ok) == "PASS x: fine" and repr(bad) == "FAIL x: no"
    assert "FAIL" in bad._repr_html_() and "&lt;" in exercises.CheckResult("<x>", True, "m")._repr_html_()


def test_sum_then_divide_once_passes_and_mean_of_means_fails():
    right = exercises.accumulation_matches_one_pass(lambda sums, norms: sum(sums) / sum(norms))
    assert right and right.details["max_abs_diff"] < 1e-12
    wrong = exercises.accumulation_matches_one_pass(lambda sums, norms: sum(s / n for s, n in zip(sums, norms)) / 2)
    assert not wrong and "mean of per-minibatch means" in wrong.message
    # The oracle: plain autograd on the mean over every frame against the mean of the two minibatch means.
    model, batches = ce_sums((6, 100))
    ce = torch.nn.functional.cross_entropy
    exact = torch.autograd.grad(ce(model(torch.cat([x for x, _ in batches])), torch.cat([y for _, y in batches])),
                                list(model.parameters()))
    mom = torch.autograd.grad(sum(ce(model(x), y) for x, y in batches) / 2, list(model.parameters()))
    oracle = max(float((a - b).abs().max()) for a, b in zip(exact, mom))
    assert wrong.details["max_abs_diff"] == pytest.approx(oracle, rel=1e-9)


def test_a_scaled_loss_fails_with_its_size():
    wrong = exercises.accumulation_matches_one_pass(lambda sums, norms: sum(sums))  # never divided
    assert not wrong and wrong.details["norm_ratio"] == pytest.approx(106, rel=1e-9) and "106x" in wrong.message
    junk = exercises.accumulation_matches_one_pass(lambda sums, norms: 1.0)
    assert not junk and "one scalar tensor" in junk.message
    with pytest.raises(mtlab.ConfigError, match="reduce"):
        exercises.accumulation_matches_one_pass(3)


def shared_trainer(weight_b=1.0):
    ex = make_examples(6, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex), batch_size=6), task_b(ex, batch_size=6, weight=weight_b)],
                       lr=1e-2, device="cpu")
    return tr, ex


def oracle_norms(tr, ex):
    """w_t · ‖∇ Σ_s w_s loss_sum / Σ_s w_s frames‖ on the encoder, by plain autograd over the whole set."""
    models = tr.models
    enc = list(models["enc"].parameters())
    x, lens = mtlab.collate(ex)
    h = models["enc"](x["x"])
    mask = torch.arange(h.shape[1])[None, :] < lens["x"][:, None]
    logits = models["head_a"](h)
    sum_a = torch.nn.functional.cross_entropy(logits[mask], x["y"][mask], reduction="sum")
    frames = mask.sum()
    loss_a = (1.0 * sum_a + 0.5 * sum_a) / (1.0 * frames + 0.5 * frames)
    pooled = models["pool"](h, lens["x"])
    loss_b = torch.nn.functional.cross_entropy(models["head_b"](pooled), x["spk"], reduction="mean")
    ga = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_a, enc, retain_graph=True)])
    gb = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_b, enc)])
    return tr.task("a").weight * float(ga.norm()), tr.task("b").weight * float(gb.norm())


def test_weighted_gradient_norms_match_plain_autograd_and_leave_the_trainer_alone():
    tr, ex = shared_trainer()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    norms = exercises.weighted_gradient_norms(tr)
    streams = tr.streams.state_dict()
    a, b = oracle_norms(tr, ex)
    assert norms["a"] == pytest.approx(a, rel=1e-9) and norms["b"] == pytest.approx(b, rel=1e-9)
    assert all(torch.equal(p, before[k]) for k, p in tr.params.items())
    assert all(tr.state(t).minibatches == 0 for t in tr.tasks)
    assert exercises.weighted_gradient_norms(tr) == norms and tr.streams.state_dict() == streams
    assert all(s["position"] == 0 and s["epoch"] == 0 for s in streams.values())  # nothing drawn for good


def test_gradient_norm_ratio_passes_with_the_right_weight_only():
    tr, ex = shared_trainer()
    a, b = oracle_norms(tr, ex)
    first = exercises.gradient_norm_ratio(tr, "a", "b", ratio=0.5)
    assert not first and math.isclose(first.details["ratio"], b / a, rel_tol=1e-9)
    tr.set_task_weight("b", 0.5 * a / b)  # the weight the plain-autograd norms call for
    right = exercises.gradient_norm_ratio(tr, "a", "b", ratio=0.5)
    assert right and right.details["ratio"] == pytest.approx(0.5, rel=1e-9)
    assert first.details["suggested_weight_b"] == pytest.approx(0.5 * a / b, rel=1e-9)
    tr.set_task_weight("b", 0.5 * a / b * 1.2)
    assert not exercises.gradient_norm_ratio(tr, "a", "b", ratio=0.5)
    with pytest.raises(mtlab.ConfigError, match="no task"):
        exercises.gradient_norm_ratio(tr, "a", "zz")


def test_planted_nan_is_found_by_the_right_answer_only():
    tr, _ = shared_trainer()
    puzzle = exercises.plant_nan(tr, seed=3, minibatches=5)
    assert "minibatch" in repr(puzzle) and puzzle.linkedset not in repr(puzzle).split(":")[0]
    # The oracle: the poisoned batch holds a NaN, no other does, and its recorded loss alone is NaN.
    poisoned = [i for i, (data, _) in enumerate(puzzle.batches)
                if any(torch.isnan(v).any() for v in data.values() if v.is_floating_point())]
    assert len(poisoned) == 1
    records = tr.state(puzzle.task).records
    assert math.isnan(float(records[puzzle.minibatch].loss))
    assert records[puzzle.minibatch].linkedset == puzzle.linkedset
    assert sum(math.isnan(float(r.loss)) for t in tr.tasks for r in tr.state(t).records) == 1
    found = mtlab.debug.find_nonfinite(tr)
    assert exercises.found_planted_nan(puzzle, found)
    assert exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, puzzle.minibatch))
    other = (puzzle.task, puzzle.linkedset, puzzle.minibatch + 1)
    verdict = exercises.found_planted_nan(puzzle, other)
    assert not verdict and "minibatch" in verdict.message
    with pytest.raises(mtlab.ConfigError, match="already holds"):
        exercises.plant_nan(tr)
    with pytest.raises(mtlab.ConfigError, match="task"):
        exercises.found_planted_nan(puzzle, {"linkedset": "clean"})


def test_a_wrong_type_is_told_apart_from_a_wrong_value():
    tr, _ = shared_trainer()
    puzzle = exercises.plant_nan(tr, seed=3, minibatches=5)
    as_text = exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, str(puzzle.minibatch)))
    assert not as_text and "differs" not in as_text.message
    assert f"the minibatch must be a whole number (an int, counted from 0 within the task) (got str '{puzzle.minibatch}')" \
        in as_text.message
    wrong = exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, puzzle.minibatch + 1))
    assert not wrong and "the minibatch differs (minibatches count from 0 within the task)" in wrong.message
    assert exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, puzzle.minibatch))
