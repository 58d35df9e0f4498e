"""Gradient transforms as a chain: the phases, the calls and the errors follow from the chain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn

import mtlab
from helpers import DecayingScale, clone_models, make_examples, make_models, task_a, task_b
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
        for p, (_k, v) in zip(params, st.grads.items()):
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


# ------------------------------------------------------------------ a transform with state: AutoClip
def autoclip_run(steps: int, percentile: float, **kw: object) -> tuple[mtlab.Trainer, dict[str, nn.Module]]:
    """mtlab with ``clip_grad_percentile`` against AutoClip as its authors wrote it: each task's norm history
    in a Python list, numpy's (linear) percentile, ``clip_grad_norm_``'s coefficient, the weighted sum of the
    tasks' clipped gradients, ``torch.optim.Adam``. The reference accumulates and normalizes with a second,
    unclipped trainer on a copy of the models (that part is checked against plain PyTorch elsewhere)."""
    import numpy as np

    ex = make_examples(12, 7)
    models = make_models()
    ref_models = clone_models(models)
    tr = mtlab.Trainer(models, [task_a((ex, ex)), task_b(ex)], device="cpu", clip_grad_percentile=percentile, **kw)
    ref = mtlab.Trainer(ref_models, [task_a((ex, ex)), task_b(ex)], device="cpu")
    params = dict(ref.params)
    opt = torch.optim.Adam(params.values(), lr=tr.lr)
    history: dict[str, list[float]] = {"a": [], "b": []}
    for _ in range(steps):
        tr.step()
        ref.reset()
        for task, sets in ref.active_tasks().items():
            for s in sets:
                ref.process_minibatch(task, s)
        ref.normalize()
        direction = {n: torch.zeros_like(p) for n, p in params.items()}
        for task in ("a", "b"):
            grads = ref.state(task).grads
            norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads.values()])))
            history[task].append(norm)
            coef = min(1.0, float(np.percentile(history[task], percentile)) / (norm + 1e-6))
            for n, g in grads.items():
                direction[n] += ref.tasks[task].weight * coef * g
        for n, p in params.items():
            p.grad = direction[n]
        opt.step()
        ref.reset()
    return tr, ref_models


def test_clip_by_history_equals_autoclip_written_by_hand() -> None:
    tr, ref_models = autoclip_run(5, 25.0)
    assert any(float(tr.state(t).clip_fraction) > 0 for t in tr.tasks)  # it clipped something
    for name, p in tr.params.items():
        model, pname = name.split(".", 1)
        torch.testing.assert_close(p, ref_models[model].get_parameter(pname))
    assert [len(h) for h in tr.chain.transforms[-1].history.values()] == [5, 5]


def test_clip_by_history_state_is_checkpointed_and_survives_a_clip_value_change() -> None:
    tr, _ = autoclip_run(3, 25.0)
    state = tr.state_dict()
    assert state["chain"][-1]["type"] == "ClipByHistory" and len(state["chain"][-1]["state"]["history"]["a"]) == 3
    tr.step(); tr.step()
    tr2, _ = autoclip_run(0, 25.0)
    tr2.load_state_dict(state)
    tr2.step(); tr2.step()
    for name, p in tr.params.items():
        torch.testing.assert_close(tr2.params[name], p, rtol=0, atol=0)
    tr2.clip_grad_value = 5.0  # a new chain with ClipByValue in front: the history carries over
    assert repr(tr2.chain) == "Chain([Normalize(), ClipByValue(5), ClipByHistory(25)])"
    assert len(tr2.chain.transforms[-1].history["a"]) == 5


def test_clip_by_history_refuses_a_bad_percentile_and_a_stateless_transform_refuses_state() -> None:
    with pytest.raises(mtlab.ConfigError, match="clip_grad_percentile = 0"):
        Chain.from_settings(True, None, None, 0)
    with pytest.raises(mtlab.ConfigError, match="keeps no state"):
        ClipByValue(1.0).load_state_dict({"history": {}})


def make(chain: mtlab.Chain) -> mtlab.Trainer:
    ex = make_examples(12, 4)
    return mtlab.Trainer(make_models(), [task_a((ex, ex), weights=(1.0, 0.3))], lr=1e-2, device="cpu", chain=chain)


def test_the_chain_state_is_restored_on_load(one_thread) -> None:
    """A stateful transform's state (a user's, and AutoClip's norm history) comes back with load_state_dict:
    resuming from a state continues exactly as not stopping."""
    for chain in (lambda: mtlab.Chain([mtlab.Normalize(), DecayingScale(0.5)]),
                  lambda: mtlab.Chain([mtlab.Normalize(), mtlab.ClipByHistory(10.0)])):
        tr = make(chain())
        tr.step(); tr.step()
        saved = tr.state_dict()
        kept = [t.state_dict() for t in tr.chain]
        tr.step()
        after = {k: p.detach().clone() for k, p in tr.params.items()}
        tr.load_state_dict(saved)
        assert same([t.state_dict() for t in tr.chain], kept)
        tr.step()
        for k, p in tr.params.items():
            torch.testing.assert_close(p.detach(), after[k], rtol=0, atol=0)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_chain_that_cannot_work_is_refused_with_the_fix() -> None:
    class NoCall(mtlab.Transform):
        def __call__(self, acc: mtlab.Accumulator) -> None:
            return None

    with pytest.raises(mtlab.ConfigError, match="Python identifier"):
        mtlab.Chain([NoCall()])
    with pytest.raises(mtlab.ConfigError, match="not a transform; subclass mtlab.Transform"):
        mtlab.Chain([lambda acc: None])  # type: ignore[list-item]
    with pytest.raises(mtlab.ConfigError, match="not next to each other"):
        mtlab.Chain([mtlab.ClipByValue(1.0), DecayingScale(1.0), mtlab.ClipByGlobalNorm(1.0)])
    with pytest.raises(mtlab.ConfigError, match="either chain= or"):
        mtlab.Trainer(make_models(), [task_a()], chain=mtlab.Chain([]), clip_grad_value=1.0, device="cpu")
    tr = make(mtlab.Chain([DecayingScale(1.0)]))
    tr.clip_grad_value = 0.5  # a shortcut on a user's chain: the built-in takes its usual place
    tr.normalize_gradients = True
    assert [type(t).__name__ for t in tr.chain] == ["Normalize", "ClipByValue", "DecayingScale"]


@pytest.mark.parametrize("call", ["normalize", "clip"])
def test_on_one_process_a_call_reaches_the_gradient_math_in_three_calls(call: str) -> None:
    """normalize() -> call() -> chain.run() -> the transform (whose body is the gradient math): agreement and
    reduction add no layers on one process."""
    import sys

    ex = make_examples(12, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], clip_grad_value=1.0, device="cpu")
    tr.process_minibatch("a", "clean")
    if call == "clip":
        tr.normalize()
    paths: list[list[str]] = []

    def watch(frame, event, arg) -> None:  # noqa: ANN001
        if event == "call" and not paths and frame.f_code.co_name == "__call__" \
                and frame.f_code.co_filename.endswith("transforms.py"):
            names, f = [], frame
            while f is not None and f.f_code.co_name != call:
                names.append(f.f_code.co_qualname)
                f = f.f_back
            paths.append(names[::-1])

    sys.setprofile(watch)
    try:
        getattr(tr, call)()
    finally:
        sys.setprofile(None)
    assert paths and len(paths[0]) <= 3, paths
