"""Ctrl-C and exceptions: inside a run the loop finishes or abandons the step in flight; outside a run every
stepwise call either completes or changes nothing (the core itself handles no signals)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from helpers.campaign import record

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.core.state import load_safe
from mtlab.training.loop import Schedule, run

STEPS = 6


def build() -> mtlab.Trainer:
    ex = make_examples(20, 9)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=1.0,
                         numbatches_to_aggregate=2, device="cpu")


def press(times: int) -> None:
    """As if Ctrl-C were pressed ``times`` times right now."""
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGINT)


class Trigger:
    """Presses Ctrl-C ``times`` times inside ``where`` (process_minibatch's backward, normalize or the
    optimizer step of apply) during the third step, once."""

    def __init__(self, tr: mtlab.Trainer, where: str, times: int) -> None:
        self.tr, self.times, self.fired = tr, times, False
        if where == "process_minibatch":
            tr.params["head_a.weight"].register_hook(self._hook)
        elif where == "normalize":
            tr.parallel.reducer = self  # the reduction hook is called inside normalize()
        else:
            step = tr.optimizer.step

            def interrupted_step(*args, **kwargs):
                self.fire()
                return step(*args, **kwargs)

            tr.optimizer.step = interrupted_step

    def fire(self) -> None:
        if not self.fired and self.tr.step_count == 2:
            self.fired = True
            press(self.times)

    def _hook(self, grad: torch.Tensor) -> torch.Tensor:
        self.fire()
        return grad

    def reduce(self, call, accs) -> None:
        self.fire()


def reference() -> mtlab.Trainer:
    ref = build()
    run(ref, Schedule(num_steps=STEPS), progress=False)
    return ref


@pytest.fixture(scope="module")
def ref() -> mtlab.Trainer:
    return reference()


@pytest.mark.slow
@pytest.mark.parametrize("times", [1, 2], ids=["first", "second"])
@pytest.mark.parametrize("where", ["process_minibatch", "normalize", "apply"])
def test_ctrl_c_inside_a_run(where: str, times: int, tmp_path: Path, ref: mtlab.Trainer, sigint_raises) -> None:
    tr = build()
    trigger = Trigger(tr, where, times)
    sch = run(tr, Schedule(num_steps=STEPS), progress=False, expdir=tmp_path)
    assert trigger.fired and sch.last_stop == "interrupted"
    # A first Ctrl-C finishes the step in flight; a second abandons it at once, except inside apply's update,
    # which completes first.
    expected = 3 if times == 1 or where == "apply" else 2
    held = tr.step_count == expected and len(tr.history) == expected
    record(f"Ctrl-C x{times} inside {where} during a run", held)
    assert held, (tr.step_count, len(tr.history))
    assert set(tr.phase().values()) <= {mtlab.Phase.APPLIED, mtlab.Phase.EMPTY}
    assert all(torch.equal(p, q) for p, q in zip(tr.params.values(), build_after(expected).params.values()))
    # The checkpoint written on the way out resumes to exactly the uninterrupted run.
    other = build()
    state = load_safe(tmp_path / "final.pt")
    other.load_state_dict(state)
    run(other, Schedule.from_state(state["schedule"], other), progress=False)
    assert other.step_count == STEPS
    assert all(torch.equal(p, ref.params[k]) for k, p in other.params.items())
    assert other.history.equals(ref.history)


_AFTER: dict[int, mtlab.Trainer] = {}


def build_after(steps: int) -> mtlab.Trainer:
    """A trainer run uninterrupted for ``steps`` steps (the state an interrupted run must be in)."""
    if steps not in _AFTER:
        tr = build()
        run(tr, Schedule(num_steps=STEPS), steps=steps, progress=False)
        _AFTER[steps] = tr
    return _AFTER[steps]


def fingerprint(tr: mtlab.Trainer) -> dict:
    return {"phase": dict(tr.phase()), "step": tr.step_count,
            "params": {k: p.detach().clone() for k, p in tr.params.items()},
            "grads": {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks},
            "streams": {k: s.state_dict() for k, s in tr.streams.items()}}


def same(a: dict, b: dict) -> bool:
    return (a["phase"] == b["phase"] and a["step"] == b["step"] and a["streams"] == b["streams"]
            and all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
            and all(a["grads"][t].keys() == b["grads"][t].keys()
                    and all(torch.equal(a["grads"][t][k], b["grads"][t][k]) for k in a["grads"][t]) for t in a["grads"]))


def prepare(where: str) -> mtlab.Trainer:
    tr = build()
    tr.step()
    tr.process_minibatch("a", "clean"); tr.process_minibatch("b", "clean")
    if where in ("clip", "apply"):
        tr.normalize()
    if where == "apply":
        tr.clip()
    return tr


@pytest.mark.parametrize("where", ["normalize", "clip", "apply"])
def test_ctrl_c_in_a_stepwise_call_outside_a_run_completes_it_or_changes_nothing(where: str, monkeypatch,
                                                                                 sigint_raises) -> None:
    tr = prepare(where)
    before = fingerprint(tr)
    done = prepare(where)
    getattr(done, where)()
    after = fingerprint(done)
    if where == "apply":
        step = tr.optimizer.step

        def interrupted_step(*args, **kwargs):
            press(1)
            return step(*args, **kwargs)

        monkeypatch.setattr(tr.optimizer, "step", interrupted_step)
    else:
        original = getattr(mtlab.base.gradops, {"normalize": "div_", "clip": "clamp_"}[where])

        def interrupted(*args, **kwargs):
            press(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(mtlab.base.gradops, {"normalize": "div_", "clip": "clamp_"}[where], interrupted)
    with pytest.raises(KeyboardInterrupt):
        getattr(tr, where)()
    monkeypatch.undo()
    now = fingerprint(tr)
    held = same(now, before) or same(now, after)
    record(f"Ctrl-C inside {where}", held)
    assert held
    # Whatever happened, the cycle goes on from there.
    for call in ("normalize", "clip", "apply"):
        if tr.chain.next_call(tr.state("a")) == call or call == "apply":
            getattr(tr, call)()
    assert tr.step_count == 2


def test_ctrl_c_during_a_backward_outside_a_run_discards_that_tasks_accumulation() -> None:
    tr = build()
    tr.process_minibatch("a", "clean")
    pos = tr.stream("a", "noisy").state_dict()
    fired = []

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if not fired:
            fired.append(1)
            raise KeyboardInterrupt  # what a Ctrl-C raises in a notebook cell
        return grad

    handle = tr.params["head_a.weight"].register_hook(hook)
    with pytest.raises(KeyboardInterrupt) as info:
        tr.process_minibatch("a", "noisy")
    handle.remove()
    st = tr.state("a")
    held = st.phase == "empty" and st.grads == {} and tr.stream("a", "noisy").state_dict() == pos
    record("Ctrl-C inside process_minibatch (backward)", held)
    assert held and "accumulation was discarded" in "".join(getattr(info.value, "__notes__", []))
    assert tr.params["head_a.weight"].grad is None
    tr.process_minibatch("a", "clean"); tr.normalize(); tr.clip(); tr.apply()
    assert tr.step_count == 1


def test_exception_in_forward_or_loss_changes_nothing_and_keeps_the_stream_position():
    tr = build()
    tr.step()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    pos = tr.stream("a", "clean").state_dict()
    grads_b = {k: v.clone() for k, v in tr.state("b").grads.items()}

    def bad_loss(targets, outputs, seq_lengths):
        raise RuntimeError("loss exploded")

    good = tr.tasks["a"].loss
    tr.tasks["a"].loss = bad_loss
    with pytest.raises(mtlab.BatchError, match="loss computer .* failed .*RuntimeError: loss exploded") as err:
        tr.process_minibatch("a", "clean")
    assert isinstance(err.value.__cause__, RuntimeError)
    tr.tasks["a"].loss = good
    assert tr.phase() == {"a": "applied", "b": "applied"}
    assert tr.stream("a", "clean").state_dict() == pos
    assert all(torch.equal(before[k], p) for k, p in tr.params.items())
    assert all(torch.equal(grads_b[k], v) for k, v in tr.state("b").grads.items())


def test_a_model_failing_on_a_batch_names_the_node_and_shapes():
    tr = build()
    data, lens = mtlab.collate(make_examples(2, 3, din=6))
    pos = tr.stream("a", "clean").state_dict()
    with pytest.raises(mtlab.BatchError, match=r"node 'h' \(model 'enc'\) failed on inputs x\[2, \d+, 6\]"):
        tr.process_minibatch("a", "clean", batch=(data, lens))
    assert tr.phase() == {"a": "empty", "b": "empty"} and tr.stream("a", "clean").state_dict() == pos
