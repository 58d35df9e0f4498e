"""Core trainer semantics, with plain PyTorch as the oracle."""

from __future__ import annotations

import dataclasses

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from helpers.trainers import batches, ce_sum, processed_grad

import mtlab
from helpers import clone_models, make_examples, make_models, task_a, task_b
from mtlab.base.batching import collate


def test_accumulated_gradient_equals_one_pass_and_differs_from_mean_of_means():
    models = make_models()
    oracle_models = clone_models(models)
    tr = mtlab.Trainer(models, [task_a(weights=(1.0, 0.3))], lr=1e-3, device="cpu")
    bc, bn = batches(1), batches(2, sizes=(2, 5, 1), lengths=((10, 16), (1, 3), (4, 4)))
    plan = []
    for k in range(3):
        tr.process_minibatch("a", "clean", batch=bc[k]); plan.append((1.0, bc[k]))
        tr.process_minibatch("a", "noisy", batch=bn[k]); plan.append((0.3, bn[k]))
    tr.normalize()
    expected, loss = processed_grad(oracle_models, plan)
    st = tr.state("a")
    assert st.minibatches == 6 and st.phase == "normalized"
    assert set(st.grads) == set(expected)
    for name, g in expected.items():
        torch.testing.assert_close(st.grads[name], g, atol=1e-6, rtol=0)
    assert abs(float(st.normalized_loss) - loss) < 1e-9

    # The "mean of per-minibatch means" is a different (wrong) gradient on the same data.
    for m in oracle_models.values():
        m.zero_grad(set_to_none=True)
    means = sum(w * (lambda ln: ln[0] / ln[1])(ce_sum(oracle_models, b)) for w, b in plan) / sum(w for w, _ in plan)
    means.backward()
    diff = max((oracle_models["enc"].lin.weight.grad - st.grads["enc.lin.weight"]).abs().max().item(),
               (oracle_models["head_a"].weight.grad - st.grads["head_a.weight"]).abs().max().item())
    assert diff > 1e-4


def test_without_normalize_gradients_sums_are_kept():
    models = make_models()
    oracle = clone_models(models)
    tr = mtlab.Trainer(models, [task_a()], normalize_gradients=False, device="cpu")
    b = batches(3)
    tr.process_minibatch("a", "clean", batch=b[0])
    tr.process_minibatch("a", "noisy", batch=b[1])
    loss = ce_sum(oracle, b[0])[0] + 0.5 * ce_sum(oracle, b[1])[0]
    loss.backward()
    torch.testing.assert_close(tr.state("a").grads["head_a.weight"], oracle["head_a"].weight.grad)
    tr.apply()  # allowed: neither normalize nor clip is configured
    assert tr.step_count == 1


def test_clip_matches_clip_grad_value_():
    models = make_models()
    tr = mtlab.Trainer(models, [task_a()], clip_grad_value=0.05, device="cpu")
    b = batches(4)
    for k in range(3):
        tr.process_minibatch("a", "clean", batch=b[k])
    tr.normalize()
    before = {k: v.clone() for k, v in tr.state("a").grads.items()}
    refs = [nn.Parameter(v.clone()) for v in before.values()]
    for r, v in zip(refs, before.values()):
        r.grad = v.clone()
    torch.nn.utils.clip_grad_value_(refs, 0.05)
    tr.clip()
    st = tr.state("a")
    for r, name in zip(refs, before):
        assert torch.equal(st.grads[name], r.grad)
    total = sum(v.numel() for v in before.values())
    above = sum(int((v.abs() > 0.05).sum()) for v in before.values())
    assert above > 0
    assert float(st.clip_fraction) == pytest.approx(above / total)
    assert float(st.grad_norm) == pytest.approx(torch.linalg.vector_norm(torch.cat([v.flatten() for v in before.values()])).item())
    assert float(st.grad_norm_clipped) == pytest.approx(torch.linalg.vector_norm(torch.cat([r.grad.flatten() for r in refs])).item())
    # mtlab's clipping is idempotent: its own transform applied again to its result changes nothing.
    clipped = {k: v.clone() for k, v in st.grads.items()}
    tr.chain.transforms[-1](st)
    assert all(torch.equal(st.grads[k], v) for k, v in clipped.items())


def test_apply_equals_torch_adam_over_several_steps():
    models = make_models()
    oracle = clone_models(models)
    tr = mtlab.Trainer(models, [task_a()], lr=1e-2, clip_grad_value=0.5, device="cpu")
    params = [p for m in oracle.values() for p in m.parameters()]
    used = [p for n in ("enc", "head_a") for p in oracle[n].parameters()]
    opt = torch.optim.Adam(used, lr=1e-2)
    for step in range(4):
        b = batches(10 + step)
        plan = [(1.0, b[0]), (0.5, b[1]), (1.0, b[2])]
        tr.process_minibatch("a", "clean", batch=b[0])
        tr.process_minibatch("a", "noisy", batch=b[1])
        tr.process_minibatch("a", "clean", batch=b[2])
        tr.normalize(); tr.clip(); tr.apply()
        grads, _ = processed_grad(oracle, plan, clip=0.5)
        for mn in ("enc", "head_a"):
            for pn, p in oracle[mn].named_parameters():
                p.grad = grads[f"{mn}.{pn}"]
        opt.step()
        for (_n1, p1), p2 in zip([(n, p) for m in models.values() for n, p in m.named_parameters()], params):
            torch.testing.assert_close(p1, p2, atol=1e-6, rtol=0)
    assert models["unused"].weight.grad is None
    assert models["unused"].weight not in tr.optimizer.state
    assert len(tr.history) == 4 and list(tr.history["step"]) == [1, 2, 3, 4]


def test_two_tasks_sharing_an_encoder():
    models = make_models()
    oracle = clone_models(models)
    a, b = task_a(), task_b(weight=0.5)
    a.weight = 2.0
    tr = mtlab.Trainer(models, [a, b], lr=1e-2, clip_grad_value=0.2, device="cpu")
    ba, bb = batches(20), batches(21, sizes=(2, 3, 2))
    tr.process_minibatch("a", "clean", batch=ba[0]); tr.process_minibatch("a", "noisy", batch=ba[1])
    tr.process_minibatch("b", "clean", batch=bb[0]); tr.process_minibatch("b", "clean", batch=bb[1])
    tr.normalize(); tr.clip()
    ga, _ = processed_grad(clone_models(oracle), [(1.0, ba[0]), (0.5, ba[1])], clip=0.2, task="a")
    gb, _ = processed_grad(clone_models(oracle), [(1.0, bb[0]), (1.0, bb[1])], clip=0.2, task="b")
    # Each task's state holds its own processed gradient, also for the shared encoder.
    for name in ("enc.lin.weight", "head_a.weight"):
        torch.testing.assert_close(tr.state("a").grads[name], ga[name], atol=1e-6, rtol=0)
    for name in ("enc.lin.weight", "head_b.bias"):
        torch.testing.assert_close(tr.state("b").grads[name], gb[name], atol=1e-6, rtol=0)
    assert "head_b.weight" not in tr.state("a").grads and "head_a.weight" not in tr.state("b").grads
    tr.apply()
    opt = torch.optim.Adam([p for n in ("enc", "head_a", "head_b") for p in oracle[n].parameters()], lr=1e-2)
    for mn in ("enc", "head_a", "head_b"):
        for pn, p in oracle[mn].named_parameters():
            key = f"{mn}.{pn}"
            p.grad = 2.0 * ga.get(key, torch.zeros_like(p)) + 0.5 * gb.get(key, torch.zeros_like(p)) \
                if mn == "enc" else (2.0 * ga[key] if mn == "head_a" else 0.5 * gb[key])
    opt.step()
    for mn in ("enc", "head_a", "head_b", "unused"):
        for p1, p2 in zip(models[mn].parameters(), oracle[mn].parameters()):
            torch.testing.assert_close(p1, p2, atol=1e-6, rtol=0)
    assert models["unused"].weight.grad is None and models["unused"].weight not in tr.optimizer.state
    # State stays readable after apply, unweighted.
    torch.testing.assert_close(tr.state("a").grads["head_a.weight"], ga["head_a.weight"], atol=1e-6, rtol=0)
    assert tr.phase() == {"a": "applied", "b": "applied"}


def test_apply_leaves_tasks_that_did_not_accumulate_alone():
    models = make_models()
    ex = make_examples(12, 5)
    tr = mtlab.Trainer(models, [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu")
    tr.step()
    head_b = models["head_b"].weight.detach().clone()
    b_grad = tr.state("b").grads["head_b.weight"].clone()
    tr.process_minibatch("a", "clean"); tr.normalize(); tr.apply()
    assert torch.equal(models["head_b"].weight, head_b)  # b's old gradient was not applied again
    assert torch.equal(tr.state("b").grads["head_b.weight"], b_grad)
    assert tr.phase() == {"a": "applied", "b": "applied"}


def snapshot(tr: mtlab.Trainer, models):
    out = {"phase": tr.phase(), "step": tr.step_count,
           "params": {k: p.detach().clone() for k, p in tr.params.items()},
           "opt": {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for p, s in tr.optimizer.state.items()}}
    for t in tr.tasks:
        st = tr.state(t)
        out[t] = (st.minibatches, float(st.loss), float(st.normalizer),
                  {k: v.clone() for k, v in st.grads.items()})
    return out


def assert_same(a, b):
    assert a["phase"] == b["phase"] and a["step"] == b["step"]
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k])
    assert a["opt"].keys() == b["opt"].keys()
    for t in ("a", "b"):
        assert a[t][:3] == b[t][:3]
        assert a[t][3].keys() == b[t][3].keys()
        for k in a[t][3]:
            assert torch.equal(a[t][3][k], b[t][3][k])


@pytest.mark.parametrize("scenario, call, expect", [
    ("fresh", lambda tr: tr.normalize(), "process_minibatch"),
    ("fresh", lambda tr: tr.clip(), "process_minibatch"),
    ("fresh", lambda tr: tr.apply(), "process_minibatch"),
    ("fresh", lambda tr: tr.normalize("a"), "process_minibatch"),
    ("accumulated", lambda tr: tr.clip(), "normalize()"),
    ("accumulated", lambda tr: tr.apply(), "normalize()"),
    ("normalized", lambda tr: tr.normalize(), "clip()"),
    ("normalized", lambda tr: tr.apply(), "clip()"),
    ("normalized", lambda tr: tr.process_minibatch("a", "clean"), "apply()"),
    ("clipped", lambda tr: tr.clip(), "apply()"),
    ("clipped", lambda tr: tr.normalize(), "apply()"),
    ("applied", lambda tr: tr.apply(), "process_minibatch"),
    ("applied", lambda tr: tr.normalize(), "process_minibatch"),
])
def test_phase_errors_name_the_call_and_change_nothing(scenario, call, expect):
    models = make_models()
    ex = make_examples(12, 7)
    tr = mtlab.Trainer(models, [task_a((ex, ex)), task_b(ex)], clip_grad_value=1.0, device="cpu")
    if scenario == "applied":
        tr.step()
    if scenario in ("accumulated", "normalized", "clipped"):
        tr.process_minibatch("a", "clean")
        tr.process_minibatch("b", "clean")
    if scenario in ("normalized", "clipped"):
        tr.normalize()
    if scenario == "clipped":
        tr.clip()
    before = snapshot(tr, models)
    stream_before = {k: s.state_dict() for k, s in tr.streams.items()}
    with pytest.raises(mtlab.PhaseError) as err:
        call(tr)
    assert expect in str(err.value)
    assert_same(before, snapshot(tr, models))
    assert stream_before == {k: s.state_dict() for k, s in tr.streams.items()}


def test_zero_normalizer_is_refused_and_changes_nothing():
    models = make_models()
    ex = make_examples(6, 8)
    tr = mtlab.Trainer(models, [task_a((ex, ex), weights=(0.0, 0.0)), task_b(ex)], device="cpu")
    tr.process_minibatch("a", "clean")
    before = snapshot(tr, models)
    with pytest.raises(mtlab.ZeroNormalizerError, match="normalizer of 0"):
        tr.normalize()
    assert_same(before, snapshot(tr, models))


def test_nonfinite_loss_is_refused_at_apply_by_default():
    models = make_models()
    tr = mtlab.Trainer(models, [task_a()], device="cpu")
    b = batches(30)
    bad = ({k: v.clone() for k, v in b[1][0].items()}, b[1][1])
    bad[0]["x"][0, 0, 0] = float("nan")
    tr.process_minibatch("a", "clean", batch=b[0])
    tr.process_minibatch("a", "noisy", batch=bad)
    tr.normalize()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    with pytest.raises(mtlab.NonFiniteError, match="minibatch 1 of linked set 'noisy'"):
        tr.apply()
    for k, p in tr.params.items():
        assert torch.equal(p, before[k])
    assert len(tr.optimizer.state) == 0 and tr.step_count == 0
    assert tr.phase() == {"a": "normalized"}


def test_nonfinite_skip_policy_drops_the_step_without_touching_parameters():
    models = make_models()
    tr = mtlab.Trainer(models, [task_a()], device="cpu", nonfinite="skip", clip_grad_value=1.0)
    b = batches(31)
    tr.process_minibatch("a", "clean", batch=b[0]); tr.normalize(); tr.clip(); tr.apply()
    after_first = {k: p.detach().clone() for k, p in tr.params.items()}
    steps_before = {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()}
    bad = ({k: v.clone() for k, v in b[1][0].items()}, b[1][1])
    bad[0]["x"][0, 0, 0] = float("inf")
    tr.process_minibatch("a", "clean", batch=bad); tr.normalize(); tr.clip(); tr.apply()
    for k, p in tr.params.items():
        assert torch.equal(p, after_first[k]) and torch.isfinite(p).all()
    assert {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()} == steps_before
    assert list(tr.history["skipped"]) == [False, True]
    tr.process_minibatch("a", "clean", batch=b[2]); tr.normalize(); tr.clip(); tr.apply()
    assert not torch.equal(tr.params["head_a.weight"], after_first["head_a.weight"])


def test_step_runs_the_whole_cycle_and_weights_change_what_is_drawn():
    models = make_models()
    ex_c, ex_n = make_examples(20, 40), make_examples(20, 41)
    tr = mtlab.Trainer(models, [task_a((ex_c, ex_n)), task_b(ex_c)], numbatches_to_aggregate=3, device="cpu")
    states = tr.step()
    assert states["a"].minibatches == 6 and states["b"].minibatches == 3
    tr.set_weight("a", "noisy", 0.0)
    tr.set_task_weight("b", 0.0)
    states = tr.step()
    assert set(states) == {"a"} and states["a"].minibatches == 3
    assert all(r.linkedset == "clean" for r in states["a"].records)
    h = tr.history
    assert list(h["a/noisy/weight"]) == [0.5, 0.0] and list(h["b/weight"]) == [1.0, 0.0]
    with pytest.raises(mtlab.ConfigError, match=">= 0 and finite"):
        tr.set_weight("a", "clean", -1)
    with pytest.raises(mtlab.ConfigError, match="linked sets: \\['clean', 'noisy'\\]"):
        tr.set_weight("a", "nope", 1)


def test_step_after_minibatches_processed_by_hand_refuses_instead_of_discarding_them():
    ex = make_examples(12, 42)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], clip_grad_value=1.0, device="cpu")
    tr.process_minibatch("a", "clean")
    tr.process_minibatch("a", "noisy")
    grads = {k: v.clone() for k, v in tr.state("a").grads.items()}
    positions = {k: (s.epoch, s.position) for k, s in tr.streams.items()}
    with pytest.raises(mtlab.PhaseError, match=r"'a': 2 minibatch\(es\).*normalize\(\), clip\(\), apply\(\).*reset\(\)"):
        tr.step()
    assert tr.state("a").minibatches == 2 and tr.step_count == 0  # nothing discarded, nothing drawn
    assert all(torch.equal(grads[k], v) for k, v in tr.state("a").grads.items())
    assert {k: (s.epoch, s.position) for k, s in tr.streams.items()} == positions
    tr.normalize(); tr.clip()
    with pytest.raises(mtlab.PhaseError, match=r"phase clipped.*finish them with finish\(\) \(it makes apply\(\)\)"):
        tr.step()
    tr.apply()  # finished by hand; step() goes on from there
    assert tr.step()["a"].minibatches == 2 and tr.step_count == 2


def test_evaluate_uses_eval_mode_and_no_gradients():
    torch.manual_seed(0)
    models = make_models()
    models["enc"] = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Tanh()).double()
    ex = make_examples(9, 50)
    tr = mtlab.Trainer(models, [task_a((ex, ex))], device="cpu")
    v1 = tr.evaluate("a", "clean")
    v2 = tr.evaluate("a", "clean")
    assert v1 == v2  # dropout off
    assert models["enc"].training  # training mode restored
    data, lens = collate(ex)
    with torch.no_grad():
        models["enc"].eval()
        logits = models["head_a"](models["enc"](data["x"]))
        mask = torch.arange(data["y"].shape[1])[None] < lens["y"][:, None]
        per = F.cross_entropy(logits.transpose(1, 2), data["y"], reduction="none")
        ref = float((per * mask).sum() / mask.sum())
    assert v1 == pytest.approx(ref, rel=1e-12)
    assert all(p.grad is None for p in tr.params.values())


def test_bad_batches_and_settings_give_clear_errors():
    models = make_models()
    with pytest.raises(mtlab.ConfigError, match="numbatches_to_aggregate"):
        mtlab.Trainer(models, [task_a()], numbatches_to_aggregate=0)
    with pytest.raises(mtlab.ConfigError, match="nonfinite"):
        mtlab.Trainer(models, [task_a()], nonfinite="ignore")
    tr = mtlab.Trainer(models, [task_a()], device="cpu")
    with pytest.raises(mtlab.ConfigError, match="no examples"):
        tr.process_minibatch("a", "clean")
    data, lens = batches(1)[0]
    with pytest.raises(mtlab.BatchError, match="lacks \\['y'\\]"):
        tr.process_minibatch("a", "clean", batch=({"x": data["x"]}, lens))
    with pytest.raises(mtlab.ConfigError, match="unknown task 'z'"):
        tr.state("z")
    with pytest.raises(mtlab.ConfigError, match="clip_grad_value must be > 0"):
        tr.clip_grad_value = 0
    assert tr.phase() == {"a": "empty"}


def test_graph_validation_errors_name_the_node():
    n = mtlab.Node
    with pytest.raises(mtlab.GraphError, match="node 'h' uses unknown model 'nope'"):
        mtlab.ModelGraph([n("h", "nope", ["x"])], ["x"], ["h"], models={"enc": nn.Linear(1, 1)})
    with pytest.raises(mtlab.GraphError, match="node 'o' takes input 'z'"):
        mtlab.ModelGraph([n("h", "enc", ["x"]), n("o", "enc", ["z"])], ["x"], ["o"])
    with pytest.raises(mtlab.GraphError, match="node 'o' takes input 'later'"):
        mtlab.ModelGraph([n("o", "enc", ["later"]), n("later", "enc", ["x"])], ["x"], ["o"])
    with pytest.raises(mtlab.GraphError, match="duplicate node name 'h'"):
        mtlab.ModelGraph([n("h", "enc", ["x"]), n("h", "enc", ["x"])], ["x"], ["h"])
    with pytest.raises(mtlab.GraphError, match="output 'q' is produced by no node"):
        mtlab.ModelGraph([n("h", "enc", ["x"])], ["x"], ["q"])
    with pytest.raises(mtlab.GraphError, match="output 'x' is produced by no node"):
        mtlab.ModelGraph([n("h", "enc", ["x"])], ["x"], ["x"])
    with pytest.raises(mtlab.GraphError, match="already used"):
        mtlab.ModelGraph([n("x", "enc", ["x"])], ["x"], ["x"])
    with pytest.raises(mtlab.GraphError, match="unknown model 'nope'"):
        mtlab.Trainer({"enc": nn.Linear(4, 8)}, [mtlab.Task("t", [n("h", "nope", ["x"])], ["x"], ["y"], ["h"],
                      mtlab.losses.MSE(output="h", target="y"), {"s": mtlab.LinkedSet()})])


class TwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x, seq_lengths):
        h = self.lin(x)
        return h[..., :3], h[..., 3:] * seq_lengths[:, None, None]


def test_graph_multi_output_lengths_and_identity():
    models = {"two": TwoOut(), "outlayer": nn.Linear(3, 2), "outlayer_2spk": nn.Linear(3, 2)}
    g = mtlab.ModelGraph([mtlab.Node("split", "two", ["x"], outputs=["p", "q"]),
                          mtlab.Node("o", "outlayer", ["q"])], ["x"], ["o", "p"], models=models)
    data, lens = collate(make_examples(3, 1, dtype=torch.float32))
    res = g.run(models, {"x": data["x"]}, {"x": lens["x"]})
    assert set(res.outputs) >= {"p", "q", "o"}
    assert torch.equal(res.seq_lengths["o"], lens["x"]) and torch.equal(res.seq_lengths["p"], lens["x"])
    tr = mtlab.Trainer(models, [mtlab.Task("t", g.nodes, ["x"], ["y"], ["o"],
                       loss=lambda t, o, l: (o["o"].sum(), torch.tensor(1.0)),
                       linkedsets={"s": mtlab.LinkedSet()})], device="cpu")
    # Name-prefix matching would wrongly catch outlayer_2spk; identity does not.
    assert "outlayer_2spk.weight" not in tr.task_params["t"]
    bad = mtlab.ModelGraph([mtlab.Node("split", "two", ["x"], outputs=["p", "q", "r"])], ["x"], ["p"], models=models)
    with pytest.raises(mtlab.GraphError, match="names 3 outputs"):
        bad.run(models, {"x": data["x"]}, {"x": lens["x"]})


@pytest.mark.slow
def test_import_mtlab_pulls_in_no_ui_library():
    code = ("import sys, mtlab; bad = [m for m in ('ipywidgets', 'matplotlib', 'IPython') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("normalize_weights", [False, True])
def test_acc_steps_matches_per_task_adam_by_hand(normalize_weights):
    models = make_models()
    oracle = clone_models(models)
    a, b = task_a(), task_b(weight=0.5)
    a.weight = 2.0
    tr = mtlab.Trainer(models, [a, b], lr=1e-2, clip_grad_value=0.3, device="cpu", acc_steps=True,
                       normalize_weights_acc_steps=normalize_weights)
    wa, wb = 2.0, 0.5
    enc_a = wa / (wa + wb) if normalize_weights else wa
    enc_b = wb / (wa + wb) if normalize_weights else wb
    head_a = 1.0 if normalize_weights else wa
    head_b = 1.0 if normalize_weights else wb
    opt_a = torch.optim.Adam([{"params": list(oracle["enc"].parameters()), "lr": 1e-2 * enc_a},
                              {"params": list(oracle["head_a"].parameters()), "lr": 1e-2 * head_a}])
    opt_b = torch.optim.Adam([{"params": list(oracle["enc"].parameters()), "lr": 1e-2 * enc_b},
                              {"params": list(oracle["head_b"].parameters()), "lr": 1e-2 * head_b}])
    for step in range(3):
        ba, bb = batches(60 + step), batches(70 + step, sizes=(2, 3, 2))
        tr.process_minibatch("a", "clean", batch=ba[0]); tr.process_minibatch("a", "noisy", batch=ba[1])
        tr.process_minibatch("b", "clean", batch=bb[0])
        tr.normalize(); tr.clip(); tr.apply()
        ga, _ = processed_grad(oracle, [(1.0, ba[0]), (0.5, ba[1])], clip=0.3, task="a")
        gb, _ = processed_grad(oracle, [(1.0, bb[0])], clip=0.3, task="b")
        for mn in ("enc", "head_a"):
            for pn, p in oracle[mn].named_parameters():
                p.grad = ga[f"{mn}.{pn}"]
        opt_a.step()
        for mn in ("enc", "head_b"):
            for pn, p in oracle[mn].named_parameters():
                p.grad = gb[f"{mn}.{pn}"]
        opt_b.step()
        for m in oracle.values():
            m.zero_grad(set_to_none=True)
        for mn in ("enc", "head_a", "head_b"):
            for p1, p2 in zip(models[mn].parameters(), oracle[mn].parameters()):
                torch.testing.assert_close(p1, p2, atol=1e-6, rtol=0)


def test_snapshot_restore_and_checkpoint_continue_bit_for_bit(tmp_path):
    ex = make_examples(30, 80)

    def build(seed=0):
        return mtlab.Trainer(make_models(seed), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=1.0,
                             numbatches_to_aggregate=2, device="cpu")

    tr = build()
    tr.step()
    snap = tr.state_dict()
    tr.step(); tr.step()
    ref_params = {k: v.detach().clone() for k, v in tr.params.items()}
    ref_hist = tr.history.copy()
    tr.load_state_dict(snap)
    assert tr.step_count == 1 and len(tr.history) == 1
    tr.step(); tr.step()
    assert all(torch.equal(ref_params[k], v) for k, v in tr.params.items())
    assert tr.history.equals(ref_hist)
    # mid-accumulation state survives a save/load too
    tr.process_minibatch("a", "noisy")
    tr.save(tmp_path / "ck.pt")
    other = build(seed=9)
    other.load_checkpoint(tmp_path / "ck.pt")
    assert other.phase() == tr.phase() and other.state("a").minibatches == 1
    for t in (tr, other):
        t.process_minibatch("a", "clean"); t.normalize(); t.clip(); t.apply(); t.step()
    assert all(torch.equal(other.params[k], v) for k, v in tr.params.items())
    assert other.history.equals(tr.history)
    s1, s2 = tr.stream("a", "clean"), other.stream("a", "clean")
    assert torch.equal(next(s1)[0]["x"], next(s2)[0]["x"])


def test_normalize_all_covers_the_tasks_still_accumulating():
    ex = make_examples(12, 90)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], clip_grad_value=1.0, device="cpu")
    tr.process_minibatch("a", "clean"); tr.process_minibatch("b", "clean")
    tr.normalize("b")
    with pytest.raises(mtlab.PhaseError, match="task 'a' has not been normalized"):
        tr.clip("a")
    tr.normalize()  # only 'a' is left to normalize
    assert tr.phase() == {"a": "normalized", "b": "normalized"}
    with pytest.raises(mtlab.PhaseError, match="already normalized; next call: clip"):
        tr.normalize()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_failed_minibatch_puts_the_data_position_back(where, monkeypatch):
    """A minibatch whose forward or backward fails is not consumed: the stream is where it was, and the next
    minibatch is the one a trainer that never failed draws."""
    ex = make_examples(12, 3)
    tr, twin = (mtlab.Trainer(make_models(), [task_a((ex, ex))], device="cpu") for _ in range(2))
    for t in (tr, twin):
        t.process_minibatch("a", "clean")
    stream = tr.stream("a", "clean")
    before = (stream.epoch, stream.position)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # noqa: ANN001, ANN205
            return x.clone()

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            raise RuntimeError("backward failed")

    if where == "forward":
        monkeypatch.setattr(tr.plans["a"], "loss", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("forward failed")))
    else:
        real = tr.plans["a"].loss
        monkeypatch.setattr(tr.plans["a"], "loss", lambda *a, **k: dataclasses.replace(
            real(*a, **k), loss_sum=Boom.apply(real(*a, **k).loss_sum)))
    with pytest.raises(RuntimeError, match=f"{where} failed"):
        tr.process_minibatch("a", "clean")
    monkeypatch.undo()
    assert (stream.epoch, stream.position) == before
    tr.reset(); twin.reset()
    tr.process_minibatch("a", "clean"); twin.process_minibatch("a", "clean")
    assert torch.equal(tr.state("a").loss, twin.state("a").loss)
