"""Property-based tests: any sequence of stepwise calls, weights, batches and graph specs either
works or raises an mtlab error with a message, and a refused call changes nothing. The composite calls
keep their own, documented promise: a refused ``step()`` keeps what it accumulated (the minibatches it
drew) for inspection and says so, a step refused inside ``mtlab.run`` is rolled back; neither touches
parameters, optimizer, step count, weights or learning rate.

Derandomized in CI (tests/conftest.py); ``HYPOTHESIS_PROFILE=long`` searches at random for longer."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from torch import nn
from helpers.campaign import record

import mtlab
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


def identical(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-equal, NaN included (a refused step may keep non-finite gradients for inspection)."""
    return x.shape == y.shape and torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)


def untouched(a, b) -> bool:
    """What no refused call may change: parameters, optimizer, step count, weights, learning rate."""
    return (all(a[k] == b[k] for k in ("step", "weights", "lr", "opt"))
            and all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"]))


def drawn_and_kept(tr: mtlab.Trainer, drawn: list[tuple[str, str]]) -> bool:
    """A refused step() keeps exactly the minibatches it drew, task by task."""
    return all([r.linkedset for r in tr.state(t).records] == [s for t2, s in drawn if t2 == t] for t in tr.tasks
               if any(t2 == t for t2, _ in drawn))


def notes(exc: BaseException) -> str:
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def same(a, b) -> bool:
    if {k: v for k, v in a.items() if k not in ("params", "a", "b")} != {k: v for k, v in b.items() if k not in ("params", "a", "b")}:
        return False
    if any(not torch.equal(a["params"][k], b["params"][k]) for k in a["params"]):
        return False
    for t in ("a", "b"):
        if a[t][:2] != b[t][:2] or a[t][2].keys() != b[t][2].keys():
            return False
        if any(not identical(a[t][2][k], b[t][2][k]) for k in a[t][2]):
            return False
    return True


class StepwiseCalls(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tr = mtlab.Trainer(make_models(), [task_a((EX, EX), batch_size=4), task_b(EX, batch_size=4)],
                                clip_grad_value=1.0, numbatches_to_aggregate=1, device="cpu")
        self.refused = 0

    def call(self, fn, *args, composite: str | None = None):
        before = fingerprint(self.tr)
        drawn: list[tuple[str, str]] = []

        def on_event(event, info):
            if event == "minibatch":
                drawn.append((info["task"], info["linkedset"]))

        self.tr.add_callback(on_event)
        try:
            fn(*args)
        except mtlab.MtlabError as exc:
            after = fingerprint(self.tr)
            if composite == "step" and drawn:  # kept for inspection, and the error says so
                held = (untouched(before, after) and drawn_and_kept(self.tr, drawn)
                        and "kept for inspection" in notes(exc))
                kind = "refused step(): accumulation kept and said, parameters untouched"
            elif composite == "run":  # rolled back: data positions as before, accumulation discarded
                held = same(before, after) or (untouched(before, after) and after["streams"] == before["streams"]
                                               and set(self.tr.phase().values()) == {mtlab.Phase.EMPTY}
                                               and "rolled back" in notes(exc))
                kind = "refused mtlab.run step: rolled back, parameters untouched"
            else:
                held = same(before, after)
                kind = "refused stepwise call (state unchanged)"
            held = held and bool(str(exc))
            record(kind, held)
            assert str(exc), "an mtlab error without a message"
            assert held, f"a refused call broke its promise ({kind}): {notes(exc)}"
            self.refused += 1
            return
        finally:
            self.tr.remove_callback(on_event)
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
        self.call(self.tr.step, composite="step")

    @rule()
    def run_one_step(self):
        self.call(lambda: mtlab.run(self.tr, steps=1, progress=False), composite="run")

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
TestStepwiseCalls.pytestmark = [pytest.mark.slow]  # a search over call sequences: over a second
TestStepwiseCalls.settings = settings(max_examples=settings.default.max_examples, stateful_step_count=25)


def test_a_refused_step_keeps_its_accumulation_and_says_so() -> None:
    """The sequence that once broke the promise: step() x4, a huge weight and lr, step(), step()."""
    machine = StepwiseCalls()
    for _ in range(4):
        machine.step()
    machine.set_weight("a", "clean", 2.5e224)
    machine.set_lr(2.5e224)
    machine.step()  # applies: the huge weight is normalized away, the huge lr is not
    machine.step()  # non-finite loss: apply refuses, the step's accumulation is kept and said
    assert machine.refused == 1 and machine.tr.phase()["a"] == mtlab.Phase.CLIPPED
    machine.step()  # refused, as after minibatches processed by hand: nothing discarded silently
    assert machine.refused == 2
    machine.run_one_step()  # mtlab.run refuses too, and discards nothing it did not start
    machine.reset(None)
    machine.run_one_step()  # non-finite again: rolled back, data positions as before the step
    assert machine.refused == 4 and set(machine.tr.phase().values()) == {mtlab.Phase.EMPTY}


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


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
@settings(max_examples=4 * settings.default.max_examples)
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


@settings(max_examples=2 * settings.default.max_examples)
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


def test_property_tests_are_derandomized_unless_a_long_search_is_asked_for() -> None:
    import os

    long = os.environ.get("HYPOTHESIS_PROFILE") == "long"
    for s in (TestStepwiseCalls.settings, settings.default):
        assert s.derandomize is not long and s.deadline is None
        assert s.max_examples <= (4000 if long else 100)
