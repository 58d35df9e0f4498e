"""Gradient transforms as a chain: the phases, the calls and the errors follow from the chain."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mtlab
from helpers import clone_models, make_examples, make_models, task_a, task_b
from mtlab.core.transforms import Chain, ClipByGlobalNorm, ClipByValue, Normalize


def test_chain_from_settings_gives_the_calls_in_order() -> None:
    assert Chain.from_settings(True, 1.0, None).calls() == ["normalize", "clip"]
    assert Chain.from_settings(False, None, 2.0).calls() == ["clip"]
    assert Chain.from_settings(True, 1.0, 2.0).calls() == ["normalize", "clip"]
    assert len(Chain.from_settings(True, 1.0, 2.0)) == 3
    with pytest.raises(mtlab.ConfigError, match="clip_grad_norm must be > 0"):
        ClipByGlobalNorm(0)


@pytest.mark.parametrize("max_norm", [1e-3, 0.05, 100.0])
def test_clip_by_global_norm_equals_torch_clip_grad_norm_per_task(max_norm: float) -> None:
    ex = make_examples(12, 7)
    models = make_models()
    tr = mtlab.Trainer(models, [task_a((ex, ex)), task_b(ex)], clip_grad_norm=max_norm, device="cpu")
    tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy"); tr.process_minibatch("b", "clean")
    tr.normalize()
    before = {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks}
    tr.clip()
    for t in tr.tasks:
        params = [nn.Parameter(torch.zeros_like(v)) for v in before[t].values()]
        for p, v in zip(params, before[t].values()):
            p.grad = v.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        st = tr.state(t)
        torch.testing.assert_close(st.grad_norm, total, rtol=1e-12, atol=0)
        for p, (k, v) in zip(params, st.grads.items()):
            torch.testing.assert_close(v, p.grad, rtol=1e-12, atol=1e-15)
        assert float(st.grad_norm_clipped) <= max_norm * (1 + 1e-9) or max_norm > float(total)
    assert tr.phase() == {"a": "clipped", "b": "clipped"}
    tr.apply()


def test_value_then_norm_clipping_runs_both_in_one_clip_call() -> None:
    ex = make_examples(12, 8)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], clip_grad_value=0.02, clip_grad_norm=0.01, device="cpu")
    tr.process_minibatch("a", "clean"); tr.normalize()
    g = {k: v.clone() for k, v in tr.state("a").grads.items()}
    tr.clip()
    ref = [nn.Parameter(torch.zeros_like(v)) for v in g.values()]
    for p, v in zip(ref, g.values()):
        p.grad = v.clone()
    torch.nn.utils.clip_grad_value_(ref, 0.02)
    torch.nn.utils.clip_grad_norm_(ref, 0.01)
    for p, v in zip(ref, tr.state("a").grads.values()):
        torch.testing.assert_close(v, p.grad, rtol=1e-12, atol=1e-15)
    assert tr.state("a").position == 3 and tr.next_calls() == {"a": "apply"}


def test_phase_errors_follow_the_chain() -> None:
    ex = make_examples(12, 9)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], normalize_gradients=False, clip_grad_value=1.0, device="cpu")
    tr.process_minibatch("a", "clean")
    with pytest.raises(mtlab.PhaseError, match="no normalize step"):
        tr.normalize()
    with pytest.raises(mtlab.PhaseError, match="has not been clipped; call clip"):
        tr.apply()
    tr.clip()
    tr.apply()
    off = mtlab.Trainer(make_models(), [task_a((ex, ex))], device="cpu")
    off.process_minibatch("a", "clean"); off.normalize()
    with pytest.raises(mtlab.PhaseError, match="no clip step"):
        off.clip()
    off.apply()  # no clipping configured: normalize -> apply
    # turning clipping on between calls extends the chain: the next call is clip
    off.clip_grad_value = 0.5
    off.process_minibatch("a", "clean"); off.normalize()
    assert off.next_calls() == {"a": "clip"}
    assert "ClipByValue(0.5)" in mtlab.debug.explain(off)


def test_normalize_divides_by_the_accumulated_normalizer_once() -> None:
    ex = make_examples(12, 10)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], device="cpu")
    tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy")
    acc = tr.state("a")
    raw = {k: v.clone() for k, v in acc.grads.items()}
    Normalize()(acc)
    for k, v in acc.grads.items():
        torch.testing.assert_close(v, raw[k] / acc.normalizer.to(v.dtype))
    assert repr(ClipByValue(1.0)) == "ClipByValue(1)"
