"""Property-based tests: any sequence of stepwise calls, weights, batches and graph specs either
works or raises an mtlab error with a message, and a refused call changes nothing."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from torch import nn

import mtlab
from campaign import record
from helpers import make_examples, make_models, task_a, task_b

EX = make_examples(16, 21)
TASKS = {"a": ["clean", "noisy"], "b": ["clean"]}
weights = st.one_of(st.sampled_from([0, 0.0, 0.3, 1.0, 2.5]), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.just("x"), st.none())


def fingerprint(tr: mtlab.Trainer):
    out = {"phase": tr.phase(), "step": tr.step_count, "weights": tr.weights(), "lr": tr.lr,
           "streams": {k: (s.epoch, s.position) for k, s in tr.streams.items()},
           "params": {k: p.detach().clone() for k, p in tr.params.items()},
           "opt": {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()}}
    for t in tr.tasks:
        s = tr.state(t)
        out[t] = (s.minibatches, len(s.records), {k: v.clone() for k, v in s.grads.items()})
    return out


def same(a, b) -> bool:
    if {k: v for k, v in a.items() if k not in ("params", "a", "b")} != {k: v for k, v in b.items() if k not in ("params", "a", "b")}:
        return False
    if any(not torch.equal(a["params"][k], b["params"][k]) for k in a["params"]):
        return False
    for t in ("a", "b"):
        if a[t][:2] != b[t][:2] or a[t][2].keys() != b[t][2].keys():
            return False
        if any(not torch.equal(a[t][2][k], b[t][2][k]) for k in a[t][2]):
            return False
    return True


class StepwiseCalls(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tr = mtlab.Trainer(make_models(), [task_a((EX, EX), batch_size=4), task_b(EX, batch_size=4)],
                                clip_grad_value=1.0, numbatches_to_aggregate=1, device="cpu")
        self.refused = 0

    def call(self, fn, *args):
        before = fingerprint(self.tr)
        try:
            fn(*args)
        except mtlab.MtlabError as exc:
            held = bool(str(exc)) and same(before, fingerprint(self.tr))
            record("refused stepwise call (state unchanged)", held)
            assert str(exc), "an mtlab error without a message"
            assert held, f"state changed by a refused call: {exc}"
            self.refused += 1
            return
        record("accepted stepwise call")

    @rule(task=st.sampled_from(["a", "b", "zz"]), linkedset=st.sampled_from(["clean", "noisy", "??"]))
    def process(self, task, linkedset):
        self.call(self.tr.process_minibatch, task, linkedset)

    @rule(task=st.sampled_from([None, "a", "b", "zz"]))
    def normalize(self, task):
        self.call(self.tr.normalize, task)

    @rule(task=st.sampled_from([None, "a", "b"]))
    def clip(self, task):
        self.call(self.tr.clip, task)

    @rule()
    def apply(self):
        self.call(self.tr.apply)

    @rule(task=st.sampled_from([None, "a", "b"]))
    def reset(self, task):
        self.call(self.tr.reset, task)

    @rule()
    def step(self):
        self.call(self.tr.step)

    @rule(task=st.sampled_from(["a", "b"]), linkedset=st.sampled_from(["clean", "noisy"]), w=weights)
    def set_weight(self, task, linkedset, w):
        self.call(self.tr.set_weight, task, linkedset, w)

    @rule(task=st.sampled_from(["a", "b"]), w=weights)
    def set_task_weight(self, task, w):
        self.call(self.tr.set_task_weight, task, w)

    @rule(lr=weights)
    def set_lr(self, lr):
        self.call(setattr, self.tr, "lr", lr)

    @rule(kind=st.sampled_from(["missing", "feature_dim", "not_a_tuple", "float_target", "empty"]))
    def bad_batch(self, kind):
        data, lens = mtlab.collate(EX[:2])
        batch = {"missing": ({"x": data["x"]}, lens),
                 "feature_dim": ({**data, "x": data["x"][..., :3]}, lens),
                 "not_a_tuple": data,
                 "float_target": ({**data, "y": data["y"].double() + 0.5}, lens),
                 "empty": ({}, {})}[kind]
        self.call(self.tr.process_minibatch, "a", "clean", batch)

    @invariant()
    def consistent(self):
        for t in self.tr.tasks:
            s = self.tr.state(t)
            assert s.phase in set(mtlab.Phase)
            assert s.minibatches == len(s.records)
        assert all(torch.isfinite(p).all() for p in self.tr.params.values())
        for w in self.tr.weights().values():
            assert math.isfinite(w) and w >= 0


TestStepwiseCalls = StepwiseCalls.TestCase
TestStepwiseCalls.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


node_names = st.sampled_from(["x", "h", "g", "o", "enc", "head"])


@st.composite
def graph_specs(draw):
    """Mostly well-formed chains (inputs from earlier names), with occasional mistakes."""
    n = draw(st.integers(1, 4))
    spec, seen = [], ["x"]
    for i in range(n):
        mistake = draw(st.integers(0, 9)) == 0  # about one node in ten is wrong somehow
        name = draw(st.sampled_from(seen)) if mistake and draw(st.booleans()) else f"n{i}"
        model = draw(st.sampled_from(["nope", "head"] if mistake else ["enc", "head"]))
        pool = ["later", "h"] if mistake else seen
        inputs = [] if mistake and draw(st.booleans()) else [draw(st.sampled_from(pool))]
        spec.append((name, model, inputs))
        seen.append(name)
    outputs = draw(st.lists(st.sampled_from(seen[1:] * 8 + ["x", "zz"]), min_size=1, max_size=2))
    return spec, outputs


@settings(max_examples=100, deadline=None)
@given(spec_outputs=graph_specs())
def test_any_graph_spec_builds_and_runs_or_raises_a_graph_error(spec_outputs):
    spec, outputs = spec_outputs
    models = {"enc": nn.Linear(4, 4).double(), "head": nn.Linear(4, 4).double()}
    try:
        nodes = [mtlab.Node(name, model, inputs) for name, model, inputs in spec]
        g = mtlab.ModelGraph(nodes, ["x"], outputs, models=models)
    except mtlab.GraphError as exc:
        record("invalid graph spec refused", bool(str(exc)))
        assert str(exc)
        return
    record("valid graph spec ran")
    data, lens = mtlab.collate(EX[:2])
    res = g.run(models, {"x": data["x"]}, {"x": lens["x"]})
    assert all(o in res.outputs for o in outputs)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5), dim=st.integers(1, 3),
       scalar=st.booleans())
def test_collate_is_exact_for_any_lengths(lengths, dim, scalar):
    ex = [{"x": torch.randn(t, dim), "c": torch.tensor(i)} if scalar else {"x": torch.randn(t, dim)}
          for i, t in enumerate(lengths)]
    data, lens = mtlab.collate(ex)
    record("batch padding")
    assert lens["x"].tolist() == lengths
    for i, e in enumerate(ex):
        assert torch.equal(data["x"][i, : lengths[i]], e["x"])
        assert not data["x"][i, lengths[i]:].any()
