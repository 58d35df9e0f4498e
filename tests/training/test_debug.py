"""mtlab.training.debug: plain PyTorch as the oracle."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mtlab
from helpers import clone_models, make_examples, make_models, task_a, task_b
from mtlab.base.batching import collate
from mtlab.training.debug import MinibatchTrace, check_equivalence, explain, find_nonfinite, gradient_conflict, next_call


def batch(seed: int, n: int = 3, lengths: tuple[int, int] = (2, 9)):
    return collate(make_examples(n, seed, lengths=lengths))


def trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(12, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", **kw)


def test_explain_follows_the_cycle():
    tr = trainer(clip_grad_value=1.0, numbatches_to_aggregate=2)
    text = explain(tr)
    assert "2 round(s)" in text and "a (task weight 1): clean (w=1), noisy (w=0.5) -> 4 minibatches" in text
    assert "ClipByValue(1)" in text and text.splitlines()[-1].startswith("next: step()")
    tr.process_minibatch("a", "clean")
    assert "next: process_minibatch('a', 'noisy')" in explain(tr)
    assert "a: accumulating, 1 minibatch(es) (clean 1)" in explain(tr)
    tr.normalize()
    assert next_call(tr).startswith("clip()")
    tr.clip()
    assert next_call(tr).startswith("apply()")
    tr.apply()
    assert "a: applied" in explain(tr) and "1 step(s) applied" in explain(tr)


def test_equivalence_is_exact_and_leaves_the_trainer_alone():
    tr = trainer()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    events: list[str] = []
    tr.add_callback(lambda e, i: events.append(e))
    plan = [("clean", batch(1, 3, (2, 4))), ("noisy", batch(2, 2, (10, 14))), ("clean", batch(3, 4, (1, 3))),
            ("noisy", None)]
    report = check_equivalence(tr, "a", plan)
    assert report["ok"] and report["max_abs_diff"] < 1e-12 and report["minibatches"] == 4
    assert set(report["per_param"]) == {"enc.lin.weight", "enc.lin.bias", "head_a.weight", "head_a.bias"}
    assert abs(report["loss_accumulated"] - report["loss_one_pass"]) < 1e-12
    assert report["mean_of_means_max_abs_diff"] > 1e-4  # the wrong recipe is measurably different
    assert events == [] and tr.phase() == {"a": "empty", "b": "empty"} and tr.step_count == 0
    assert all(torch.equal(p, before[k]) for k, p in tr.params.items())
    # batch=None peeked: the stream still yields that minibatch next.
    tr.process_minibatch("a", "noisy")
    assert tr.state("a").records[0].num_examples == 3


def test_equivalence_against_hand_written_autograd():
    tr = trainer()
    b1, b2 = batch(7), batch(8, 2, (5, 11))
    report = check_equivalence(tr, "a", [("clean", b1), ("noisy", b2)])
    models = clone_models(tr.models)
    total, norm = 0.0, 0.0
    for w, (data, lens) in ((1.0, b1), (0.5, b2)):
        logits = models["head_a"](models["enc"](data["x"]))
        mask = torch.arange(data["y"].shape[1])[None] < lens["y"][:, None]
        per = F.cross_entropy(logits.transpose(1, 2), data["y"], reduction="none")
        total = total + w * (per * mask).sum()
        norm = norm + w * mask.sum()
    (total / norm).backward()
    assert abs(report["loss_one_pass"] - float((total / norm).detach())) < 1e-12
    tr.process_minibatch("a", "clean", batch=b1)
    tr.process_minibatch("a", "noisy", batch=b2)
    tr.normalize()
    torch.testing.assert_close(tr.state("a").grads["enc.lin.weight"], models["enc"].lin.weight.grad, atol=1e-12, rtol=0)


def test_conflict_equals_hand_computed_cosine():
    tr = trainer(clip_grad_value=0.1)
    tr.step()
    ga, gb = tr.state("a").grads, tr.state("b").grads
    va = torch.cat([ga["enc.lin.weight"].flatten(), ga["enc.lin.bias"]])
    vb = torch.cat([gb["enc.lin.weight"].flatten(), gb["enc.lin.bias"]])
    expected = float(torch.dot(va, vb) / (va.norm() * vb.norm()))
    conflict = gradient_conflict(tr)
    assert list(conflict) == ["enc"] and list(conflict["enc"]) == [("a", "b")]
    assert abs(conflict["enc"][("a", "b")] - expected) < 1e-12


def test_conflict_of_a_task_with_itself_is_one():
    t2 = task_a()
    t2.name = "a2"
    tr = mtlab.Trainer(make_models(), [task_a(), t2], device="cpu")
    b = batch(40)
    for name in ("a", "a2"):
        tr.process_minibatch(name, "clean", batch=b)
    tr.normalize()
    assert abs(gradient_conflict(tr)["enc"][("a", "a2")] - 1.0) < 1e-12
    assert "head_a" in gradient_conflict(tr)


def test_trace_contributions_match_per_minibatch_gradients():
    tr = trainer()
    trace = MinibatchTrace().attach(tr)
    bs = [batch(11), batch(12, 2, (6, 12)), batch(13)]
    sets = ["clean", "noisy", "clean"]
    for s, b in zip(sets, bs):
        tr.process_minibatch("a", s, batch=b)
    df = trace.frame()
    assert list(df["linkedset"]) == sets and list(df["minibatch"]) == [0, 1, 2]
    for i, (s, b) in enumerate(zip(sets, bs)):
        models = clone_models(tr.models)
        data, lens = b
        logits = models["head_a"](models["enc"](data["x"]))
        mask = torch.arange(data["y"].shape[1])[None] < lens["y"][:, None]
        per = F.cross_entropy(logits.transpose(1, 2), data["y"], reduction="none")
        ((per * mask).sum() * tr.tasks["a"].linkedsets[s].weight).backward()
        enc = torch.cat([p.grad.flatten() for p in models["enc"].parameters()]).norm()
        assert abs(df["grad_norm/enc"][i] - float(enc)) < 1e-9
        assert abs(float(tr.state("a").records[i].trace["enc"]) - float(enc)) < 1e-9
    assert df["share/head_a"][0] == 1.0 and 0 < df["share/head_a"][2] < 2
    tr.normalize(); tr.apply()
    tr.process_minibatch("a", "clean", batch=bs[0])  # a fresh step starts from zero again
    assert trace.frame()["step"].tolist()[-1] == 1 and trace.frame()["minibatch"].tolist()[-1] == 0
    trace.detach()
    tr.process_minibatch("a", "clean", batch=bs[1])
    assert len(trace) == 4 and trace not in tr.events.listeners


def test_planted_nan_is_found_with_and_without_trace():
    for traced in (False, True):
        tr = trainer()
        if traced:
            MinibatchTrace().attach(tr)
        bad = batch(21)
        bad[0]["x"][1, 0, 2] = float("nan")
        tr.process_minibatch("a", "clean", batch=batch(20))
        tr.process_minibatch("a", "noisy", batch=batch(22))
        tr.process_minibatch("a", "noisy", batch=bad)
        tr.process_minibatch("a", "clean", batch=batch(23))
        tr.process_minibatch("b", "clean", batch=batch(24))
        found = find_nonfinite(tr)
        assert found["task"] == "a" and found["linkedset"] == "noisy" and found["minibatch"] == 2
        assert found["where"] == "loss" and found["model"] == "enc"
        assert find_nonfinite(tr, "b") is None
        tr.normalize()
        try:
            tr.apply()
        except mtlab.NonFiniteError:
            pass
        assert find_nonfinite(tr)["minibatch"] == 2


def test_nan_gradient_with_finite_loss_needs_the_trace():
    tr = trainer()
    trace = MinibatchTrace().attach(tr)
    tr.process_minibatch("a", "clean", batch=batch(30))
    # Planted after the minibatch: a NaN in the encoder's gradient only (loss stays finite).
    hook = tr.models["enc"].lin.weight.register_hook(lambda g: torch.full_like(g, float("nan")))
    tr.process_minibatch("a", "noisy", batch=batch(31))
    hook.remove()
    tr.process_minibatch("a", "clean", batch=batch(32))
    found = find_nonfinite(tr)
    assert (found["where"], found["minibatch"], found["linkedset"], found["model"]) == ("gradient", 1, "noisy", "enc")
    trace.detach()
    for r in tr.state("a").records:
        r.trace = None
    coarse = find_nonfinite(tr)
    assert coarse["minibatch"] is None and coarse["model"] == "enc" and "MinibatchTrace" in coarse["message"]


def test_all_finite_gives_none():
    tr = trainer(clip_grad_value=1.0)
    tr.step()
    assert find_nonfinite(tr) is None
