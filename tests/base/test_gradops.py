"""gradops: the grouped _foreach fast path equals the per-tensor reference path; invariants of each op."""

from __future__ import annotations

import pytest
import torch

from mtlab.base import gradops


def tensors(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(3, 4, generator=g), torch.randn(7, generator=g, dtype=torch.float64) * 3,
           torch.randn(2, 2, 2, generator=g), torch.zeros(0)]
    return out


def clone(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in ts]


@pytest.mark.parametrize("op", ["div_", "mul_", "clamp_"])
def test_fast_path_equals_reference_path(op: str) -> None:
    arg = {"div_": torch.tensor(2.5, dtype=torch.float64), "mul_": torch.tensor(0.3), "clamp_": 0.7}[op]
    fast, ref = clone(tensors()), clone(tensors())
    getattr(gradops, op)(fast, arg, foreach=True)
    getattr(gradops, op)(ref, arg, foreach=False)
    assert all(torch.equal(a, b) for a, b in zip(fast, ref))


def test_norms_and_counts_agree_between_paths_and_with_torch() -> None:
    ts = tensors(1)
    fast, ref = gradops.norms(ts), gradops.norms(ts, foreach=False)
    for a, b, t in zip(fast, ref, ts):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, torch.linalg.vector_norm(t))
    torch.testing.assert_close(gradops.total_norm(ts), gradops.total_norm(ts, foreach=False))
    expected = sum(int((t.abs() > 0.5).sum()) for t in ts)
    assert int(gradops.count_above(ts, 0.5)) == int(gradops.count_above(ts, 0.5, foreach=False)) == expected


def test_clip_twice_equals_clip_once_and_matches_torch() -> None:
    once = clone(tensors(2))
    gradops.clamp_(once, 0.4)
    twice = clone(once)
    gradops.clamp_(twice, 0.4)
    assert all(torch.equal(a, b) for a, b in zip(once, twice))
    params = [torch.nn.Parameter(t.clone()) for t in tensors(2)]
    for p, t in zip(params, tensors(2)):
        p.grad = t.clone()
    torch.nn.utils.clip_grad_value_(params, 0.4)
    assert all(torch.equal(p.grad, o) for p, o in zip(params, once))
    assert all(bool(t.abs().max() <= torch.tensor(0.4, dtype=t.dtype)) for t in once if t.numel())


def test_add_scaled_writes_the_weighted_sum_into_the_destination() -> None:
    a, b = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    dst = torch.empty(5, dtype=torch.float64)
    out = gradops.add_scaled_(dst, [(0.3, a), (2.0, b)])
    assert out is dst
    torch.testing.assert_close(dst, 0.3 * a + 2.0 * b)
