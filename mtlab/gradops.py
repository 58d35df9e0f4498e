"""Gradient processing as small pieces over lists of tensors.

Each op has the fast ``torch._foreach_*`` path grouped by (device, dtype). Nothing here reads a
value back to the host: results are 0-d tensors on the gradients' device.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor


def group(tensors: Sequence[Tensor]) -> list[list[Tensor]]:
    """Tensors grouped by (device, dtype), in a stable order."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = defaultdict(list)
    for t in tensors:
        groups[(t.device, t.dtype)].append(t)
    return list(groups.values())


def div_(tensors: Sequence[Tensor], denom: Tensor) -> None:
    """In place: every tensor /= denom (a 0-d tensor; no host read)."""
    for g in group(tensors):
        torch._foreach_div_(g, denom.to(device=g[0].device, dtype=g[0].dtype))


def mul_(tensors: Sequence[Tensor], factor: float) -> None:
    for g in group(tensors):
        torch._foreach_mul_(g, factor)


def clamp_(tensors: Sequence[Tensor], value: float) -> None:
    """In place: clip element-wise to ``[-value, value]`` (as ``torch.nn.utils.clip_grad_value_``)."""
    for g in group(tensors):
        torch._foreach_clamp_min_(g, -value)
        torch._foreach_clamp_max_(g, value)


def norms(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Per-tensor L2 norms (0-d tensors), in the input order."""
    out: dict[int, Tensor] = {}
    for g in group(tensors):
        for t, n in zip(g, torch._foreach_norm(g)):
            out[id(t)] = n
    return [out[id(t)] for t in tensors]


def total_norm(tensors: Sequence[Tensor], per_tensor: Sequence[Tensor] | None = None) -> Tensor:
    """Global L2 norm of all tensors, as a float32/float64 0-d tensor on their device."""
    if not tensors:
        return torch.zeros(())
    per = list(per_tensor) if per_tensor is not None else norms(tensors)
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in per) else torch.float32
    return torch.linalg.vector_norm(torch.stack([n.to(dtype) for n in per]))


def count_above(tensors: Sequence[Tensor], value: float) -> Tensor:
    """Number of elements with ``|x| > value`` (0-d int64 tensor)."""
    if not tensors:
        return torch.zeros((), dtype=torch.long)
    counts = [(t.abs() > value).sum() for t in tensors]
    return torch.stack(counts).sum()


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
