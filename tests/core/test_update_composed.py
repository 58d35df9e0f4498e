"""The step core's pieces composed by hand, without a Trainer: accumulators, a transform chain and an update.

The oracle is plain PyTorch: each task's gradient of Σloss / Σnormalizer, clipped with
``torch.nn.utils.clip_grad_norm_``, combined as Σ_t w_t·g_t and stepped with ``torch.optim.SGD``.
"""

from __future__ import annotations

import torch
from torch import nn

from mtlab.core.accumulator import Accumulator, Phase
from mtlab.core.transforms import Chain, ClipByGlobalNorm, ClipByValue, Normalize
from mtlab.core.update import Update


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def batches(seed: int, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4 + i, 3, generator=g), torch.randn(4 + i, 2, generator=g)) for i in range(n)]


DATA = {"a": batches(1), "b": batches(2)}
WEIGHTS = {"a": 1.0, "b": 0.3}


def summed_loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ((m(x) - y) ** 2).sum(), torch.tensor(float(x.shape[0]))


def test_accumulators_chain_and_update_equal_plain_pytorch() -> None:
    m = model()
    params = {f"enc.{n}": p for n, p in m.named_parameters()}
    users = {n: ["a", "b"] for n in params}
    accs = {t: Accumulator(t, params, shared=list(params)) for t in DATA}
    chain = Chain([Normalize(), ClipByGlobalNorm(0.5)])
    for task, data in DATA.items():
        acc = accs[task]
        for x, y in data:
            loss, norm = summed_loss(m, x, y)
            acc.begin()
            loss.backward()
            acc.end()
            acc.record("clean", x.shape[0], 1.0, loss, norm)
        assert acc.phase is Phase.ACCUMULATING and chain.next_call(acc) == "normalize"
        for call in chain.calls():
            chain.run(call, acc)
        assert chain.next_call(acc) == "apply"
    update = Update(params, users, lambda ps: torch.optim.SGD(ps, lr=0.1))
    update.step(accs, WEIGHTS, lr=0.1, found_inf=None)

    ref = model()
    direction = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for task, data in DATA.items():
        ref.zero_grad()
        total = sum(summed_loss(ref, x, y)[0] for x, y in data)
        count = sum(x.shape[0] for x, _ in data)
        (total / count).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        for n, p in ref.named_parameters():
            direction[n] += WEIGHTS[task] * p.grad
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for n, p in ref.named_parameters():
        p.grad = direction[n]
    opt.step()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(m.get_parameter(n), p)


def accumulated(chain: Chain) -> Accumulator:
    m = model()
    params = {f"enc.{n}": p for n, p in m.named_parameters()}
    acc = Accumulator("a", params)
    for x, y in DATA["a"]:
        loss, norm = summed_loss(m, x, y)
        acc.begin()
        (loss * 50).backward()  # large enough that clipping bites
        acc.end()
        acc.record("clean", x.shape[0], 1.0, loss, norm)
    for call in chain.calls():
        chain.run(call, acc)
    return acc


def test_clipping_twice_equals_clipping_once() -> None:
    once = accumulated(Chain([ClipByValue(0.2), ClipByGlobalNorm(0.7)]))
    twice = accumulated(Chain([ClipByValue(0.2), ClipByGlobalNorm(0.7), ClipByValue(0.2), ClipByGlobalNorm(0.7)]))
    assert float(once.clip_fraction) > 0
    for name, g in once.grads.items():
        torch.testing.assert_close(twice.grads[name], g)


def test_normalize_then_clip_is_not_clip_then_normalize() -> None:
    """The chain's order matters (the original normalizes first): a check that the test above can fail."""
    a = accumulated(Chain([Normalize(), ClipByGlobalNorm(0.7)]))
    b = accumulated(Chain([ClipByGlobalNorm(0.7), Normalize()]))
    assert any(not torch.allclose(a.grads[n], b.grads[n]) for n in a.grads)
