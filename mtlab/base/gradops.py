"""Gradient processing over lists of tensors: a fast path and a readable reference path.

Each op has the grouped ``torch._foreach_*`` fast path (by device and dtype, as torch's optimizers) and a
per-tensor reference path (``foreach=False``); tests check that both agree. Nothing here reads a value
back to the host: results are 0-d tensors on the tensors' device.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor


def group(tensors: Sequence[Tensor]) -> list[list[Tensor]]:
    """Tensors grouped by (device, dtype), in a stable order."""
    if len(tensors) == 1:  # one flat buffer per task (the accumulator's usual case): nothing to group
        return [list(tensors)]
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = defaultdict(list)
    for t in tensors:
        groups[(t.device, t.dtype)].append(t)
    return list(groups.values())


def div_(tensors: Sequence[Tensor], denom: Tensor, foreach: bool = True) -> None:
    """In place: every tensor /= denom (a 0-d tensor; no host read)."""
    for g in group(tensors) if len(tensors) != 1 else [list(tensors)]:  # one flat buffer: nothing to group
        d = denom.to(device=g[0].device, dtype=g[0].dtype)
        if foreach:
            torch._foreach_div_(g, d)
        else:
            for t in g:
                t.div_(d)


def mul_(tensors: Sequence[Tensor], factor: float | Tensor, foreach: bool = True) -> None:
    """In place: every tensor *= factor (a number or a 0-d tensor)."""
    for g in group(tensors) if len(tensors) != 1 else [list(tensors)]:  # one flat buffer: nothing to group
        f = factor.to(device=g[0].device, dtype=g[0].dtype) if isinstance(factor, Tensor) else factor
        if foreach:
            torch._foreach_mul_(g, f)
        else:
            for t in g:
                t.mul_(f)


def clamp_(tensors: Sequence[Tensor], value: float, foreach: bool = True) -> None:
    """In place: clip element-wise to ``[-value, value]`` (as ``torch.nn.utils.clip_grad_value_``)."""
    for g in group(tensors) if len(tensors) != 1 else [list(tensors)]:  # one flat buffer: nothing to group
        if foreach:
            torch._foreach_clamp_min_(g, -value)
            torch._foreach_clamp_max_(g, value)
        else:
            for t in g:
                t.clamp_(-value, value)


def norms(tensors: Sequence[Tensor], foreach: bool = True) -> list[Tensor]:
    """Per-tensor L2 norms (0-d tensors), in the input order."""
    if not foreach:
        return [torch.linalg.vector_norm(t) for t in tensors]
    same = bool(tensors)
    if same:  # a plain loop, not all(<genexpr>): this runs at every clip of every step
        device, dtype = tensors[0].device, tensors[0].dtype
        for t in tensors:
            if t.device != device or t.dtype != dtype:
                same = False
                break
    groups = [list(tensors)] if same else group(tensors)
    if len(groups) == 1:  # one device and dtype (the usual case): already in the input order
        return list(torch._foreach_norm(groups[0]))
    out: dict[int, Tensor] = {}
    for g in groups:
        for t, n in zip(g, torch._foreach_norm(g)):
            out[id(t)] = n
    return [out[id(t)] for t in tensors]


def total_norm(tensors: Sequence[Tensor], foreach: bool = True) -> Tensor:
    """Global L2 norm of all tensors, as a float32/float64 0-d tensor on their device."""
    if not tensors:
        return torch.zeros(())
    per = norms(tensors, foreach)
    dtype = torch.float64 if torch.float64 in [t.dtype for t in per] else torch.float32
    return torch.linalg.vector_norm(torch.stack([n.to(dtype) for n in per]))


def count_above(tensors: Sequence[Tensor], value: float, foreach: bool = True) -> Tensor:
    """Number of elements with ``|x| > value`` (0-d int64 tensor).

    The fast path compares each tensor against both bounds (one-byte temporaries, no ``abs`` copy)."""
    if not tensors:
        return torch.zeros((), dtype=torch.long)
    if not foreach:
        return torch.stack([(t.abs() > value).sum() for t in tensors]).sum()
    counts = [torch.count_nonzero(t > value) + torch.count_nonzero(t < -value) for t in tensors]
    return counts[0] if len(counts) == 1 else torch.stack(counts).sum()


def grouped_norms(views: Sequence[Tensor], groups: Sequence[int], device: torch.device) -> tuple[list[Tensor], Tensor]:
    """L2 norms of consecutive groups of ``views`` (``groups[i]`` views each) and over all of them: one grouped
    kernel for every view's norm, then one per group and one for the total, whatever the number of tensors."""
    if not views:
        return [], torch.zeros((), device=device)
    parts = torch._foreach_norm(list(views))
    if len(parts) == 1:
        return [parts[0]], parts[0]
    stacked = torch.stack(parts)
    if stacked.dtype not in (torch.float32, torch.float64):
        stacked = stacked.float()  # half-precision gradients: their norms summed in float32
    out, k = [], 0
    for n in groups:
        out.append(parts[k] if n == 1 else torch.linalg.vector_norm(stacked[k:k + n]))
        k += n
    return out, torch.linalg.vector_norm(stacked)


def add_scaled_(dst: Tensor, srcs: Sequence[tuple[float, Tensor]]) -> Tensor:
    """``dst = Σ w·src`` written into ``dst`` (no new buffer)."""
    first = True
    for w, src in srcs:
        if first:
            torch.mul(src, w, out=dst)
            first = False
        else:
            dst.add_(src, alpha=w)
    return dst
