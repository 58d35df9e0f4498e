"""The update: directions Σ_t w_t·g_t read from the accumulators (never changed), any weight >= 0, and the
one place that skips a non-finite step on the device."""

from __future__ import annotations

import pytest
import torch

import mtlab
from helpers import clone_models, make_examples, make_models, task_a, task_b
from mtlab.core import update as update_mod


def two_tasks(models=None, **kw) -> mtlab.Trainer:
    ex = make_examples(16, 4)
    return mtlab.Trainer(models or make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5,
                         device="cpu", **kw)


def accumulate(tr: mtlab.Trainer) -> None:
    tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy"); tr.process_minibatch("b", "clean")
    tr.normalize(); tr.clip()


def oracle_adam(models, grads: dict[str, torch.Tensor], lr: float = 1e-2) -> None:
    """Plain torch: Adam over the parameters that have a gradient, one step."""
    params = {f"{m}.{n}": p for m, mod in models.items() for n, p in mod.named_parameters()}
    used = []
    for name, g in grads.items():
        params[name].grad = g.clone()
        used.append(params[name])
    torch.optim.Adam(used, lr=lr).step()


def test_weighted_directions_equal_plain_torch_and_leave_the_gradients_bit_identical() -> None:
    models = make_models()
    ref = clone_models(models)
    tr = two_tasks(models)
    tr.set_task_weight("a", 0.3); tr.set_task_weight("b", 0.7)
    accumulate(tr)
    grads = {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks}
    tr.apply()
    for t in tr.tasks:  # g·w·(1/w) != g in floating point: the update must never scale them in place
        for k, v in grads[t].items():
            assert torch.equal(tr.state(t).grads[k], v), (t, k)
    combined = {}
    for t, w in (("a", 0.3), ("b", 0.7)):
        for k, g in grads[t].items():
            combined[k] = combined[k] + w * g if k in combined else w * g
    oracle_adam(ref, combined)
    for k, p in tr.params.items():
        q = dict((f"{m}.{n}", x) for m, mod in ref.items() for n, x in mod.named_parameters())[k]
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_a_task_weight_set_to_zero_before_apply_leaves_that_task_out_of_a_whole_step() -> None:
    models = make_models()
    ref = clone_models(models)
    tr = two_tasks(models)
    accumulate(tr)  # a slider moves task b's weight to 0 between clip() and apply()
    grads_a = {k: v.clone() for k, v in tr.state("a").grads.items()}
    tr.set_task_weight("b", 0.0)
    tr.apply()
    assert tr.step_count == 1 and len(tr.history) == 1 and tr.phase() == {"a": "applied", "b": "applied"}
    oracle_adam(ref, grads_a)
    for k, p in tr.params.items():
        q = dict((f"{m}.{n}", x) for m, mod in ref.items() for n, x in mod.named_parameters())[k]
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    assert tr.params["head_b.weight"] not in tr.optimizer.state  # a weight-0 task's own parameters stay untouched
    with pytest.raises(mtlab.PhaseError):
        tr.apply()  # applied once, not twice


def test_every_weight_zero_at_apply_is_refused_and_changes_nothing() -> None:
    tr = two_tasks()
    accumulate(tr)
    tr.set_task_weight("a", 0.0); tr.set_task_weight("b", 0.0)
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    grads = {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks}
    with pytest.raises(mtlab.ConfigError, match="weight 0"):
        tr.apply()
    assert tr.step_count == 0 and len(tr.history) == 0 and tr.phase() == {"a": "clipped", "b": "clipped"}
    assert all(torch.equal(p, before[k]) for k, p in tr.params.items()) and not tr.optimizer.state
    assert all(torch.equal(tr.state(t).grads[k], v) for t in grads for k, v in grads[t].items())
    tr.set_task_weight("a", 1.0)
    tr.apply()  # raising a weight again lets the same accumulation through
    assert tr.step_count == 1


@pytest.mark.parametrize("fused", [True, False])
def test_optimizer_step_skips_on_found_inf_with_and_without_fused(fused: bool) -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1, fused=fused) if fused else torch.optim.Adam([p], lr=0.1, foreach=False)
    p.grad = torch.ones(3)
    assert update_mod.skips_on_device(opt) is fused
    update_mod.optimizer_step(opt, torch.tensor(True))
    assert torch.equal(p.detach(), torch.ones(3)) and not hasattr(opt, "found_inf")
    update_mod.optimizer_step(opt, torch.tensor(False))
    assert not torch.equal(p.detach(), torch.ones(3))


def test_found_inf_needs_torch_2_4_for_the_device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1, fused=True)
    monkeypatch.setattr(torch, "__version__", "2.3.1")
    assert not update_mod.skips_on_device(opt)
    p.grad = torch.ones(3)
    update_mod.optimizer_step(opt, torch.tensor(True))  # the host-read path still skips
    assert torch.equal(p.detach(), torch.ones(3))


def test_any_torch_optimizer_can_be_wrapped() -> None:
    models = make_models()
    ref = clone_models(models)
    ex = make_examples(16, 4)
    # the optimizer's own lr is the one it trains at (Trainer(lr=...) is not written over it)
    tr = mtlab.Trainer(models, [task_a((ex, ex))], device="cpu",
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    assert tr.lr == 0.1
    tr.process_minibatch("a", "clean"); tr.normalize()
    g = {k: v.clone() for k, v in tr.state("a").grads.items()}
    tr.apply()
    params = dict((f"{m}.{n}", x) for m, mod in ref.items() for n, x in mod.named_parameters())
    for k, v in g.items():
        params[k].grad = v
    torch.optim.SGD([params[k] for k in g], lr=0.1, momentum=0.9).step()
    for k in g:
        torch.testing.assert_close(tr.params[k], params[k], rtol=0, atol=1e-12)
