"""The original's capsule network (``capsnet``): per-frame primary capsules, then capsule layers with dynamic
routing by agreement, batched over every frame of every utterance at once."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def squash(s: Tensor, epsilon: float = 1e-7) -> Tensor:
    """The original's ``ops.squash`` over the last axis: ``|s|^2 / (1 + |s|^2) / sqrt(|s|^2 + epsilon) * s``
    (epsilon inside the root, so a zero capsule has a finite gradient)."""
    squared = (s * s).sum(-1, keepdim=True)
    return squared / (1.0 + squared) / torch.sqrt(squared + epsilon) * s


class CapsuleLayer(nn.Module):
    """The original's ``layer.Capsule``: ``[..., Nin, Din]`` capsules to ``[..., Nout, Dout]``.

    Predictions ``u[..., i, j, :] = x[..., i, :] @ kernel[i, :, j, :]``; routing logits start at ``init_logits``
    (``[Nin, Nout]``, zeros; learned only with ``logits_prior``) and take ``routing_iters`` updates
    ``logits += sum_k u * squash(sum_i softmax_j(logits) * u)``; the output is that squashed weighted sum for the
    final logits. Gradients flow through every routing iteration, as through the original's ``while_loop``.
    The kernel starts as the original's ``capsule_initializer``: uniform in ``+-sqrt(3 / ((Din + Dout) / 2))``."""

    def __init__(self, in_capsules: int, in_dim: int, num_capsules: int, capsule_dim: int,
                 routing_iters: int = 3, logits_prior: bool = False) -> None:
        super().__init__()
        self.routing_iters = int(routing_iters)
        self.kernel = nn.Parameter(torch.empty(in_capsules, in_dim, num_capsules, capsule_dim))
        limit = math.sqrt(3.0 / max(1.0, (in_dim + capsule_dim) / 2.0))
        nn.init.uniform_(self.kernel, -limit, limit)
        logits = torch.zeros(in_capsules, num_capsules)
        if logits_prior:
            self.init_logits = nn.Parameter(logits)
        else:
            self.register_buffer("init_logits", logits)

    def forward(self, x: Tensor) -> Tensor:
        predictions = torch.einsum("...id,idjk->...ijk", x, self.kernel)  # [..., Nin, Nout, Dout]
        logits = self.init_logits.expand(predictions.shape[:-1])
        for _ in range(self.routing_iters):
            caps = squash((torch.softmax(logits, -1).unsqueeze(-1) * predictions).sum(-3))
            logits = logits + (predictions * caps.unsqueeze(-3)).sum(-1)
        return squash((torch.softmax(logits, -1).unsqueeze(-1) * predictions).sum(-3))


class CapsNet(nn.Module):
    """Padded ``[B, T, input_dim]`` features to ``[B, T, num_capsules * capsule_dim]``, frame by frame.

    Gaussian ``input_noise`` on the input (training only); primary capsules: a bias-free linear layer to
    ``num_capsules * capsule_dim`` (Glorot uniform, as ``tf.layers.dense``), viewed as ``[B, T, num_capsules,
    capsule_dim]`` and squashed; then ``num_layers - 1`` :class:`CapsuleLayer` of the same size, each followed by
    ``dropout`` (a drop probability; the original's keep probability is ``1 - dropout``) in training; the
    capsules are flattened back per frame. Frames do not interact, so padding does not reach valid frames."""

    def __init__(self, input_dim: int, num_capsules: int, capsule_dim: int, num_layers: int = 2,
                 routing_iters: int = 3, logits_prior: bool = False, input_noise: float = 0.0,
                 dropout: float = 0.0) -> None:
        super().__init__()
        from ..base.errors import ConfigError

        if min(input_dim, num_capsules, capsule_dim, num_layers) < 1 or routing_iters < 0:
            raise ConfigError(f"CapsNet: input_dim ({input_dim}), num_capsules ({num_capsules}), capsule_dim "
                              f"({capsule_dim}) and num_layers ({num_layers}) must be at least 1, routing_iters "
                              f"({routing_iters}) at least 0")
        if not 0 <= dropout < 1:
            raise ConfigError(f"CapsNet dropout = {dropout}: a drop probability in [0, 1)")
        self.num_capsules, self.capsule_dim = int(num_capsules), int(capsule_dim)
        self.input_noise, self.dropout = float(input_noise), float(dropout)
        self.output_dim = self.num_capsules * self.capsule_dim
        self.primary = nn.Linear(input_dim, self.output_dim, bias=False)
        nn.init.xavier_uniform_(self.primary.weight)
        self.layers = nn.ModuleList(
            CapsuleLayer(self.num_capsules, self.capsule_dim, self.num_capsules, self.capsule_dim, routing_iters,
                         logits_prior) for _ in range(num_layers - 1))

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        h = squash(self.primary(x).view(*x.shape[:-1], self.num_capsules, self.capsule_dim))
        for layer in self.layers:
            h = layer(h)
            if self.training and self.dropout > 0:
                h = nn.functional.dropout(h, self.dropout, True)
        return h.reshape(*x.shape[:-1], self.output_dim)
