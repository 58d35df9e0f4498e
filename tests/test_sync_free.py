"""The step path (process_minibatch -> apply) never reads a device value back to the host."""

from __future__ import annotations

import contextlib

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b


@contextlib.contextmanager
def no_host_reads():
    """Make Tensor.item / float() / int() / bool() / .cpu() raise (a CPU stand-in for CUDA sync debug mode;
    ``tolist`` stays allowed: the data sampler reads its own CPU permutations with it)."""
    names = ("item", "__float__", "__int__", "__bool__", "cpu")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def boom(name):
        def f(*args, **kwargs):
            raise AssertionError(f"host read through Tensor.{name} inside the step path")
        return f

    for n in names:
        setattr(torch.Tensor, n, boom(n))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


@pytest.mark.parametrize("read", [float, int, bool, lambda t: t.item(), lambda t: t.cpu()])
def test_the_guard_catches_a_host_read(read):
    with no_host_reads(), pytest.raises(AssertionError, match="host read"):
        read(torch.ones(()))


@pytest.mark.parametrize("acc_steps", [False, True])
def test_step_path_is_sync_free_under_the_skip_policy(acc_steps):
    ex = make_examples(24, 3)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex, weight=0.5)], clip_grad_value=0.5,
                       numbatches_to_aggregate=2, device="cpu", nonfinite="skip", acc_steps=acc_steps)
    tr.step()  # first step creates optimizer state
    with no_host_reads():
        for _ in range(3):
            tr.step()
        tr.process_minibatch("a", "clean")
        tr.process_minibatch("b", "clean")
        tr.normalize(); tr.clip(); tr.apply()
    h = tr.history  # statistics materialize when read, afterwards
    assert len(h) == 5 and not h["skipped"].any()
    assert all(torch.isfinite(p).all() for p in tr.params.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on GPU machines)")
def test_step_path_is_sync_free_on_cuda():
    ex = make_examples(24, 3)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], clip_grad_value=0.5,
                       numbatches_to_aggregate=2, device="cuda", nonfinite="skip")
    tr.step()
    stream = tr.stream("a", "clean")  # data comes from the host; prefetch one batch outside the check
    batch = next(stream)
    torch.cuda.set_sync_debug_mode("error")
    try:
        tr.process_minibatch("a", "clean", batch=batch)
        tr.normalize(); tr.clip(); tr.apply()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(tr.history) == 2
