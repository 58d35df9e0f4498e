"""Loss-based weightings from the exact per-step losses: uncertainty, DWA, FAMO (torchjd), random; their
coefficients in the history, their state in checkpoints (bit for bit)."""

from __future__ import annotations

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b


def trainer(method, lr=1e-2, **kw) -> mtlab.Trainer:
    ex = make_examples(16, 4)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex, weight=0.6)], lr=lr, device="cpu",
                         combine=method, **kw)


def losses(tr: mtlab.Trainer) -> torch.Tensor:
    h = tr.history
    return torch.tensor(h[["a/loss", "b/loss"]].to_numpy(), dtype=torch.float64)


def coefs(tr: mtlab.Trainer) -> torch.Tensor:
    h = tr.history
    return torch.tensor(h[["weighting/a", "weighting/b"]].to_numpy(), dtype=torch.float64)


def test_uncertainty_weighting_equals_plain_torch_and_scales_each_tasks_gradient() -> None:
    tr = trainer("uncertainty")
    for _ in range(3):
        tr.step()
    s = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([s], lr=1e-2)
    for L, got in zip(losses(tr), coefs(tr)):
        torch.testing.assert_close(got, 0.5 * torch.exp(-s.detach()), atol=1e-12, rtol=0)
        opt.zero_grad()
        (0.5 * torch.exp(-s) * L + 0.5 * s).sum().backward()
        opt.step()
    learned = torch.stack([tr.update.weighting.log_vars[t] for t in "ab"]).detach()
    torch.testing.assert_close(learned, s.detach(), atol=1e-12, rtol=0)
    # the update: each task's gradient times task weight × coefficient (SGD with lr 1 shows the direction)
    tr2 = trainer("uncertainty", optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0), lr=None)
    before = tr2.params["head_b.weight"].detach().clone()
    tr2.process_minibatch("b", "clean"); tr2.process_minibatch("a", "clean"); tr2.normalize()
    g = tr2.state("b").grads["head_b.weight"].clone()
    tr2.apply()
    torch.testing.assert_close(before - tr2.params["head_b.weight"].detach(), 0.6 * 0.5 * g, atol=1e-12, rtol=0)


def test_uncertainty_weighting_saves_and_resumes_bit_for_bit(tmp_path) -> None:
    tr = trainer("uncertainty+upgrad")
    for _ in range(2):
        tr.step()
    path = tr.save(tmp_path / "ck.pt")
    for _ in range(2):
        tr.step()
    again = trainer("uncertainty+upgrad")
    again.load_checkpoint(path)
    again.step()
    first = again.update.weighting.log_vars["a"].detach().clone()
    again.step()
    for t in "ab":
        assert torch.equal(again.update.weighting.log_vars[t], tr.update.weighting.log_vars[t])
        assert float(tr.update.weighting.log_vars[t].detach()) != 0.0  # they did move
    assert all(torch.equal(p, tr.params[k]) for k, p in again.params.items())
    assert again.history[["weighting/a", "weighting/b"]].equals(tr.history[["weighting/a", "weighting/b"]])
    fresh = trainer("uncertainty+upgrad")  # without the saved optimizer state the run would differ
    fresh.load_checkpoint(path)
    fresh.update.weighting.optimizer.state.clear()
    fresh.step()
    assert not torch.equal(fresh.update.weighting.log_vars["a"].detach(), first)


def test_dwa_follows_its_formula_on_the_step_losses() -> None:
    tr = trainer({"type": "dwa", "temperature": 2.0, "period": 1})
    for _ in range(5):
        tr.step()
    L, c = losses(tr), coefs(tr)
    assert torch.equal(c[:2], torch.ones(2, 2, dtype=torch.float64))  # uniform until two periods are done
    for k in range(2, 5):
        torch.testing.assert_close(c[k], 2 * torch.softmax((L[k - 1] / L[k - 2]) / 2.0, dim=0), atol=1e-12, rtol=0)


def test_famo_coefficients_are_torchjds_famo() -> None:
    scalarization = pytest.importorskip("torchjd.scalarization", reason="FAMO comes from torchjd (mtlab[mtl])")
    tr = trainer("famo")
    for _ in range(4):
        tr.step()
    famo = scalarization.FAMO(2).double()
    for k, (L, got) in enumerate(zip(losses(tr), coefs(tr))):
        if k:
            famo.update(L)  # FAMO's own logit step, from the previous step's losses to these
        values = L.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(famo(values), values)
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
    assert not torch.allclose(coefs(tr)[-1], coefs(tr)[0])  # the logits moved


@pytest.mark.slow
def test_random_loss_weights_are_seeded_by_the_step_and_resume_exactly() -> None:
    tr = trainer("random_loss")
    tr.step()
    snap = tr.state_dict()
    for _ in range(3):
        tr.step()
    c = coefs(tr)
    assert torch.allclose(c.sum(1), torch.ones(4, dtype=torch.float64)) and (c > 0).all()
    assert len({tuple(r.tolist()) for r in c}) == 4
    tr.load_state_dict(snap)
    for _ in range(3):
        tr.step()
    assert torch.equal(coefs(tr), c)


def test_a_skipped_step_leaves_the_weighting_state_alone() -> None:
    tr = trainer("uncertainty", nonfinite="skip")
    tr.step()
    before = {t: p.detach().clone() for t, p in tr.update.weighting.log_vars.items()}
    tr.process_minibatch("a", "clean"); tr.process_minibatch("b", "clean"); tr.normalize()
    tr.state("a").buffers[0][0] = float("nan")  # a non-finite gradient: the step is dropped on the device
    tr.apply()
    assert bool(tr.history["skipped"].iloc[-1])
    assert all(torch.equal(tr.update.weighting.log_vars[t], v) for t, v in before.items())
