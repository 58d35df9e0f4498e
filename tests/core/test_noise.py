"""The gradient noise scale from the accumulation: a float64 autograd oracle, a linear regression with a
known noise level, and no extra backward or host read in the step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from helpers.trainers import no_host_reads


def oracle(models: dict[str, nn.Module], plan, batches, weights):  # noqa: ANN001
    """tr(Σ)^ and |G|²^ per model and in total, from per-minibatch gradients taken one by one."""
    names = list(models)
    per_mb, ms, ns = [], [], []
    for batch, w in zip(batches, weights):
        result = plan.loss(batch, require_grad=True)
        params = [(m, p) for m in names for p in models[m].parameters() if p.requires_grad]
        grads = torch.autograd.grad(result.loss_sum * w, [p for _, p in params], allow_unused=True)
        flat = {m: torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                              for (mm, p), g in zip(params, grads) if mm == m]) for m in names}
        per_mb.append(flat)
        ms.append(float(result.normalizer) * w)
        ns.append(float(result.normalizer))
    m, n = torch.tensor(ms, dtype=torch.float64), torch.tensor(ns, dtype=torch.float64)
    pi = m / m.sum()
    a, b = (pi / n).sum(), (pi ** 2 / n).sum()
    out = {}
    for key in [*names, None]:
        c = [torch.cat([f[k] for k in names]) if key is None else f[key] for f in per_mb]
        big = (sum(c) / m.sum()).pow(2).sum()
        small = sum(p * (ci / mi).pow(2).sum() for p, ci, mi in zip(pi, c, m))
        out[key] = ((small - big) / (a - b), (a * big - b * small) / (a - b))
    return out


def test_noise_scale_equals_an_autograd_oracle_in_float64():
    ex, ex2 = make_examples(24, 3), make_examples(24, 4)
    tasks = [task_a((ex, ex2), weights=(1.0, 0.5)), task_b(ex)]
    tr = mtlab.Trainer(make_models(), tasks, clip_grad_value=0.01, numbatches_to_aggregate=2, device="cpu",
                       noise_scale=True)
    twin = make_models()
    plan = mtlab.Trainer(twin, [task_a((ex, ex2)), task_b(ex)], device="cpu").plans["a"]
    batches = [next(tr.stream("a", s)) for s in ("clean", "noisy", "clean", "noisy")]
    for batch, s in zip(batches, ("clean", "noisy", "clean", "noisy")):
        tr.process_minibatch("a", s, batch=batch)
    tr.finish()
    want = oracle({k: twin[k] for k in ("enc", "head_a")}, plan, batches, [1.0, 0.5, 1.0, 0.5])
    row = tr.history.iloc[-1]
    trace, g2 = want[None]
    assert abs(row["gns_trace/a"] - float(trace)) <= 1e-6 * abs(float(trace))
    assert abs(row["gns_g2/a"] - float(g2)) <= 1e-6 * abs(float(g2))
    assert abs(row["gns/a"] - float(trace / g2)) <= 1e-6 * abs(float(trace / g2))
    for model in ("enc", "head_a"):
        t, g = want[model]
        assert abs(row[f"gns/a/{model}"] - float(t / g)) <= 1e-6 * abs(float(t / g)), model


def test_one_minibatch_per_step_says_two_are_needed():
    ex = make_examples(12, 3)
    tr = mtlab.Trainer(make_models(), [task_b(ex)], device="cpu", noise_scale=True)
    tr.step()
    assert tr.history["gns/b"].isna().all()
    assert "two minibatches" in tr.noise_scale.message("b")
    assert tr.noise_scale.suggest(tr) == {"b": None}


class Linear(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, 1, bias=False, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


@pytest.mark.slow  # 200 steps
def test_linear_regression_recovers_the_analytic_noise_scale():
    """Per-example gradient of (x·θ − y)² with x ~ N(0, I_d), y = x·θ* + σε: G = 2δ (δ = θ − θ*) and
    tr(Σ) = 4((d + 1)|δ|² + dσ²), so B_simple = ((d + 1)|δ|² + dσ²) / |δ|². θ stays put (a tiny lr)."""
    d, sigma, n = 6, 0.7, 4000
    g = torch.Generator().manual_seed(0)
    theta_star = torch.randn(d, generator=g, dtype=torch.float64)
    examples = []
    for _ in range(n):
        x = torch.randn(1, d, generator=g, dtype=torch.float64)
        examples.append({"x": x, "y": x @ theta_star[:, None] + sigma * torch.randn(1, 1, generator=g,
                                                                                    dtype=torch.float64)})
    model = Linear(d)
    task = mtlab.Task("reg", nodes=[mtlab.Node("yhat", model="lin", inputs=["x"])], inputs=["x"], targets=["y"],
                      outputs=["yhat"], loss=mtlab.losses.MSE(output="yhat", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(examples)}, batch_size=8)
    tr = mtlab.Trainer({"lin": model}, [task], lr=1e-12, numbatches_to_aggregate=4, device="cpu",
                       noise_scale=mtlab.NoiseScale(beta=0.99))
    for _ in range(200):
        tr.step()
    delta2 = float((model.lin.weight.detach()[0] - theta_star).pow(2).sum())
    want = ((d + 1) * delta2 + d * sigma ** 2) / delta2
    h = tr.history
    got_ratio_of_means = h["gns_trace/reg"].mean() / h["gns_g2/reg"].mean()
    assert abs(got_ratio_of_means / want - 1) < 0.10, (got_ratio_of_means, want)
    assert abs(h["gns/reg"].iloc[-1] / want - 1) < 0.10, (h["gns/reg"].iloc[-1], want)
    assert abs(h["gns/reg/lin"].iloc[-1] - h["gns/reg"].iloc[-1]) < 1e-9 * want
    assert tr.noise_scale.suggest(tr)["reg"] == max(1, -(-h["gns/reg"].iloc[-1] // 8))


def test_no_extra_backward_and_no_host_read_in_the_step(monkeypatch):
    ex = make_examples(24, 3)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex, weight=0.5)], clip_grad_value=0.5,
                       numbatches_to_aggregate=2, device="cpu", nonfinite="skip", noise_scale=True)
    tr.step()
    calls = []
    real = torch.Tensor.backward

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", counted)
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: (_ for _ in ()).throw(AssertionError("grad()")))
    with no_host_reads():
        for _ in range(3):
            tr.step()
    assert len(calls) == 3 * (2 * 2 + 2)  # one backward per minibatch: a has 2 sets x 2, b 1 set x 2
    h = tr.history
    assert h["gns/a"].notna().all() and h["gns/b"].notna().any() and "gns/a/enc" in h
    assert (h["gns/b"].dropna() > 0).all()  # undefined (NaN) while an average is not positive, never negative


def test_noise_scale_state_survives_a_checkpoint(tmp_path):
    ex = make_examples(24, 3)
    build = lambda: mtlab.Trainer(make_models(), [task_b(ex)], numbatches_to_aggregate=3, device="cpu",  # noqa: E731
                                  noise_scale=True)
    tr = build()
    for _ in range(3):
        tr.step()
    other = build()
    other.load_state_dict(tr.state_dict())
    tr.step(), other.step()
    assert tr.history["gns/b"].iloc[-1] == other.history["gns/b"].iloc[-1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on GPU machines)")
def test_noise_scale_is_sync_free_on_cuda():
    ex = make_examples(24, 3)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], clip_grad_value=0.5,
                       numbatches_to_aggregate=2, device="cuda", nonfinite="skip", noise_scale=True)
    tr.step()
    batches = [(t, s, next(tr.stream(t, s))) for t, sets in tr.active_tasks().items() for s in sets] * 2
    torch.cuda.set_sync_debug_mode("error")  # any device-to-host wait in the step raises
    try:
        for t, s, b in batches:
            tr.process_minibatch(t, s, batch=b)
        tr.finish()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert tr.history["gns/a"].notna().all()
