"""The trainer's optimizers by name: ``"adam_tf1"`` equals TensorFlow 1's ``tf.train.AdamOptimizer``, steps and
skips like torch's fused Adam, survives a checkpoint, and works one optimizer per task (``acc_steps``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_examples, make_models, task_a, task_b

import mtlab
from mtlab.base.errors import ConfigError
from mtlab.core.optimizers import AdamTF1, make_adam_tf1
from mtlab.core.update import optimizer_step, skips_on_device

pytestmark = pytest.mark.usefixtures("one_thread")

LR = 0.05  # large enough that the two updates differ well above float32 rounding


class NumpyAdamTF1:
    """A NumPy transcription of TensorFlow 1's ``tf.train.AdamOptimizer`` in float32, as TensorFlow runs it.

    ``tensorflow/python/training/adam.py`` (r1.15): ``_create_slots`` makes ``beta1_power`` = β1 and
    ``beta2_power`` = β2 (float32 variables, one per optimizer), ``_apply_dense`` calls ``training_ops.apply_adam``
    and ``_finish`` multiplies the powers by β1 and β2. ``tensorflow/core/kernels/training_ops.cc``,
    ``ApplyAdamNonCuda``::

        const T alpha = lr() * Eigen::numext::sqrt(T(1) - beta2_power()) / (T(1) - beta1_power());
        m.device(d) += (grad - m) * (T(1) - beta1());
        v.device(d) += (grad.square() - v) * (T(1) - beta2());
        var.device(d) -= (m * alpha) / (v.sqrt() + epsilon());
    """

    def __init__(self, params: dict[str, np.ndarray], lr: float, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8) -> None:
        f = np.float32
        self.var = {k: v.astype(f).copy() for k, v in params.items()}
        self.m = {k: np.zeros_like(v) for k, v in self.var.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.var.items()}
        self.lr, self.beta1, self.beta2, self.eps = f(lr), f(beta1), f(beta2), f(epsilon)
        self.beta1_power, self.beta2_power = f(beta1), f(beta2)

    def apply_gradients(self, grads: dict[str, np.ndarray]) -> None:
        one = np.float32(1)
        alpha = self.lr * np.sqrt(one - self.beta2_power) / (one - self.beta1_power)
        for k, g in grads.items():
            g = g.astype(np.float32)
            self.m[k] += (g - self.m[k]) * (one - self.beta1)
            self.v[k] += (np.square(g) - self.v[k]) * (one - self.beta2)
            self.var[k] -= (self.m[k] * alpha) / (np.sqrt(self.v[k]) + self.eps)
        self.beta1_power = self.beta1_power * self.beta1
        self.beta2_power = self.beta2_power * self.beta2


def one_task(optimizer: str | None = "adam_tf1", lr: float | None = LR, **kw) -> mtlab.Trainer:
    ex = make_examples(16, 3, dtype=torch.float32)
    return mtlab.Trainer(make_models(dtype=torch.float32), [task_a((ex, ex))], lr=lr, clip_grad_value=0.5,
                         device="cpu", optimizer=optimizer, **kw)


def params_np(tr: mtlab.Trainer) -> dict[str, np.ndarray]:
    return {k: p.detach().numpy().copy() for k, p in tr.params.items() if k in tr.task_params["a"]}


def run_steps(tr: mtlab.Trainer, n: int) -> list[dict[str, np.ndarray]]:
    """``n`` steps by hand; the direction each applied (the task's processed gradient, weight 1)."""
    grads = []
    for _ in range(n):
        tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy")
        tr.normalize(); tr.clip()
        grads.append({k: g.detach().numpy().copy() for k, g in tr.state("a").grads.items()})
        tr.apply()
    return grads


def test_adam_tf1_equals_tensorflows_adam_over_three_steps_to_float32_rounding() -> None:
    tr = one_task()
    assert tr.optimizer_name == "adam_tf1" and isinstance(tr.optimizer, AdamTF1)
    tf = NumpyAdamTF1(params_np(tr), lr=LR)
    torch_ref = one_task(optimizer="adam")  # same seed: same initial weights, data and first gradient
    for step in range(3):
        grads = run_steps(tr, 1)[0]
        tf.apply_gradients(grads)
        for k, v in tf.var.items():
            np.testing.assert_allclose(tr.params[k].detach().numpy(), v, rtol=2e-6, atol=2e-7, err_msg=f"{k} step {step}")
        st = tr.optimizer.state[tr.params["enc.lin.weight"]]
        assert float(st["step"]) == step + 1
        np.testing.assert_allclose(st["exp_avg_sq"].numpy(), tf.v["enc.lin.weight"], rtol=2e-6, atol=1e-12)
    # the test can tell: torch's Adam (epsilon on sqrt of the corrected v) lands measurably elsewhere
    run_steps(torch_ref, 3)
    gap = max(float(np.abs(torch_ref.params[k].detach().numpy() - v).max()) for k, v in tf.var.items())
    assert gap > 1e-5


def test_a_skipped_step_on_the_device_changes_nothing_and_a_kept_one_equals_a_plain_step() -> None:
    torch.manual_seed(0)
    p, q = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
    q.data.copy_(p.data)
    a, b = AdamTF1([p], lr=0.1), AdamTF1([q], lr=0.1)
    assert skips_on_device(a)
    for _ in range(2):
        p.grad = q.grad = torch.randn(5)
        optimizer_step(a, torch.tensor(False))
        optimizer_step(b, None)
        assert torch.equal(p, q)
    before = {k: v.clone() for k, v in a.state[p].items()}
    p.grad = torch.full((5,), float("nan"))
    optimizer_step(a, torch.tensor(True))
    assert torch.equal(p, q)
    for k, v in a.state[p].items():
        assert torch.equal(v, before[k]), k
    p.grad = q.grad = torch.randn(5)  # the step after a skip is the one that would have come
    optimizer_step(a, torch.tensor(False)); optimizer_step(b, None)
    assert torch.equal(p, q)


def test_a_checkpoint_continues_exactly_and_refuses_another_optimizers_state() -> None:
    whole = one_task()
    run_steps(whole, 3)
    first = one_task()
    run_steps(first, 2)
    state = first.state_dict()
    assert state["settings"]["optimizer"] == "adam_tf1"
    again = one_task()
    again.load_state_dict(state)
    run_steps(again, 1)
    for k, p in whole.params.items():
        assert torch.equal(p, again.params[k]), k
    with pytest.raises(ConfigError, match="optimizer='adam_tf1'"):
        one_task(optimizer="adam").load_state_dict(state)


def test_one_optimizer_per_task_under_acc_steps_is_tensorflows_with_lr_times_task_weight() -> None:
    ex = make_examples(16, 3, dtype=torch.float32)
    tr = mtlab.Trainer(make_models(dtype=torch.float32), [task_a((ex, ex)), task_b(ex, weight=0.5)], lr=LR,
                       device="cpu", optimizer="adam_tf1", acc_steps=True)
    assert all(isinstance(o, AdamTF1) for o in tr.task_optimizers.values())
    head = {k: p.detach().numpy().copy() for k, p in tr.params.items() if k.startswith("head_b.")}
    tf = NumpyAdamTF1(head, lr=LR * 0.5)
    for _ in range(2):
        tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy"); tr.process_minibatch("b", "clean")
        tr.normalize()
        tf.apply_gradients({k: tr.state("b").grads[k].numpy().copy() for k in head})
        tr.apply()
    for k, v in tf.var.items():
        np.testing.assert_allclose(tr.params[k].detach().numpy(), v, rtol=2e-6, atol=2e-7, err_msg=k)


def test_names_and_options_are_checked() -> None:
    assert isinstance(one_task(optimizer=None).optimizer, torch.optim.Adam)  # a hand-built Trainer: torch's Adam
    with pytest.raises(ConfigError, match="adam_tf1"):
        one_task(optimizer="adamw")
    with pytest.raises(ConfigError, match="betas"):
        one_task(adam={"weight_decay": 0.1})
    assert one_task(adam={"eps": 1e-6}).optimizer.defaults["eps"] == 1e-6
    custom = one_task(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), lr=None)
    assert custom.optimizer_name == "custom" and isinstance(custom.optimizer, torch.optim.SGD)
    with pytest.raises(ConfigError, match="sparse"):
        e = torch.nn.Embedding(3, 2, sparse=True)
        e(torch.tensor([1])).sum().backward()
        make_adam_tf1(list(e.parameters()), lr=0.1).step()


def test_a_trainer_with_nonfinite_skip_drops_a_nan_step_on_the_device_and_goes_on() -> None:
    tr = one_task(nonfinite="skip")
    run_steps(tr, 1)
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    state = {k: v.clone() for k, v in tr.optimizer.state[tr.params["enc.lin.weight"]].items()}
    tr.process_minibatch("a", "clean")
    tr.state("a").grads["enc.lin.weight"][0, 0] = float("nan")  # before normalize(), which records the norm
    tr.normalize(); tr.clip(); tr.apply()
    assert all(torch.equal(p, before[k]) for k, p in tr.params.items())
    assert all(torch.equal(v, state[k]) for k, v in tr.optimizer.state[tr.params["enc.lin.weight"]].items())
    run_steps(tr, 1)
    assert float(tr.optimizer.state[tr.params["enc.lin.weight"]]["step"]) == 2
