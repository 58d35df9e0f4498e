"""Ctrl-C and exceptions inside stepwise calls leave the trainer fully before or fully after the call."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import mtlab
from campaign import record
from helpers import make_examples, make_models, task_a, task_b


def build():
    ex = make_examples(20, 9)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], clip_grad_value=1.0,
                         numbatches_to_aggregate=2, device="cpu")


def test_ctrl_c_during_backward_is_delivered_after_the_minibatch_is_fully_accumulated():
    tr = build()
    hook_calls = []

    def interrupt_once(grad):
        if not hook_calls:
            os.kill(os.getpid(), signal.SIGINT)  # as if Ctrl-C were pressed mid-backward
        hook_calls.append(1)
        return grad

    handle = tr.params["head_a.weight"].register_hook(interrupt_once)
    with pytest.raises(KeyboardInterrupt, match="stopped between calls"):
        tr.process_minibatch("a", "clean")
    handle.remove()
    st = tr.state("a")
    record("Ctrl-C inside process_minibatch (backward)", st.minibatches == 1 and len(st.records) == 1)
    assert st.minibatches == 1 and len(st.records) == 1 and st.phase == "accumulating"
    assert set(st.grads) == set(tr.task_params["a"])
    tr.process_minibatch("a", "noisy"); tr.process_minibatch("b", "clean")
    tr.normalize(); tr.clip(); tr.apply()
    assert tr.step_count == 1


@pytest.mark.parametrize("where", ["normalize", "clip", "apply"])
def test_ctrl_c_inside_a_call_lets_it_finish(where, monkeypatch):
    tr = build()
    tr.process_minibatch("a", "clean"); tr.process_minibatch("b", "clean")
    if where in ("clip", "apply"):
        tr.normalize()
    if where == "apply":
        tr.clip()
    target = {"normalize": "div_", "clip": "clamp_", "apply": None}[where]
    if target:
        original = getattr(mtlab.gradops, target)

        def interrupted(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            return original(*args, **kwargs)

        monkeypatch.setattr(mtlab.gradops, target, interrupted)
    else:
        original_step = tr.optimizer.step

        def interrupted_step(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            return original_step(*args, **kwargs)

        monkeypatch.setattr(tr.optimizer, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        getattr(tr, where)()
    expected = {"normalize": "normalized", "clip": "clipped", "apply": "applied"}[where]
    record(f"Ctrl-C inside {where}", tr.phase() == {"a": expected, "b": expected})
    assert tr.phase() == {"a": expected, "b": expected}
    if where == "apply":
        assert tr.step_count == 1 and len(tr.history) == 1


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
