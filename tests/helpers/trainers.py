"""Plain-PyTorch oracles and checks shared by the trainer's tests."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from helpers import make_examples
from mtlab.base.batching import collate


def batches(seed: int, sizes=(3, 2, 4), lengths=((2, 5), (9, 14), (3, 8))):
    out = []
    for i, (n, lr) in enumerate(zip(sizes, lengths)):
        out.append(collate(make_examples(n, seed * 100 + i, lengths=lr)))
    return out


def ce_sum(models, batch, task="a"):
    """Plain PyTorch: summed loss and norm of one minibatch for the helper tasks."""
    data, lens = batch
    h = models["enc"](data["x"])
    if task == "a":
        logits = models["head_a"](h)
        mask = torch.arange(data["y"].shape[1])[None] < lens["y"][:, None]
        per = F.cross_entropy(logits.transpose(1, 2), data["y"], reduction="none")
        return (per * mask).sum(), mask.sum().double()
    pooled = models["pool"](h, lens["x"])
    logits = models["head_b"](pooled)
    return F.cross_entropy(logits, data["spk"], reduction="sum"), torch.tensor(float(data["spk"].shape[0]), dtype=torch.float64)


def processed_grad(models, plan, clip=None, task="a"):
    """Oracle: gradient of Σ w·loss / Σ w·normalizer over every minibatch in ONE pass, then clip."""
    for m in models.values():
        m.zero_grad(set_to_none=True)
    total, norm = 0.0, 0.0
    for w, batch in plan:
        loss, n = ce_sum(models, batch, task)
        total = total + w * loss
        norm = norm + w * n
    (total / norm).backward()
    grads = {f"{mn}.{pn}": p.grad.clone() for mn, m in models.items() for pn, p in m.named_parameters()
             if p.grad is not None}
    if clip is not None:
        for g in grads.values():
            g.clamp_(-clip, clip)
    return grads, float((total / norm).detach())


def assert_trees_equal(x, y, where="state"):
    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), where
    elif isinstance(x, Mapping):
        assert set(x) == set(y), f"{where}: {sorted(map(str, x))} != {sorted(map(str, y))}"
        for k in x:
            assert_trees_equal(x[k], y[k], f"{where}/{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (a, b) in enumerate(zip(x, y)):
            assert_trees_equal(a, b, f"{where}[{i}]")
    else:
        assert x == y, f"{where}: {x!r} != {y!r}"


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
