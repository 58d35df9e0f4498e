"""The original's capsule networks: ``capsnet`` (per-frame primary capsules, then capsule layers with dynamic
routing by agreement, batched over every frame of every utterance at once) and ``dbr_capsnet`` (the same
routing in bidirectional recurrent capsule layers, frame after frame)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

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


PROBABILITIES = ("sigmoid", "unit")  # the recurrent capsules' routing weights: the original's choices


class RecurrentCapsuleCell(nn.Module):
    """The original's ``RecCapsuleCell`` (``rec_only_vote = False``) and ``RecCapsuleCellRecOnlyVote`` (True): one
    time step ``[B, Nin, Din]`` with the previous output ``[B, N, D]`` to ``[B, N, D]``.

    Input predictions ``x @ input_kernel`` are routed with softmax weights, state predictions ``h @
    recurrent_kernel`` with ``probability`` weights (sigmoid, or ``unit``: all ones); the capsule is the squashed
    sum of both. Each of ``routing_iters`` updates adds the agreement to the logits (``accumulate_*_logits``) or
    sets them to the initial logits plus the agreement (only with ``rec_only_vote``). The output squashes both
    sums, or with ``rec_only_vote`` the input part alone (the state only votes)."""

    init_input_logits: Tensor  # a parameter with logits_prior, else a buffer
    init_recurrent_logits: Tensor

    def __init__(self, in_capsules: int, in_dim: int, num_capsules: int, capsule_dim: int, routing_iters: int = 3,
                 rec_only_vote: bool = False, probability: str = "sigmoid", logits_prior: bool = False,
                 accumulate_input_logits: bool = True, accumulate_state_logits: bool = True) -> None:
        super().__init__()
        self.routing_iters, self.rec_only_vote, self.probability = int(routing_iters), rec_only_vote, probability
        # the plain cell always accumulates; the flags belong to the rec-only-vote cell
        self.accumulate = (accumulate_input_logits or not rec_only_vote, accumulate_state_logits or not rec_only_vote)
        self.input_kernel = nn.Parameter(_capsule_kernel(in_capsules, in_dim, num_capsules, capsule_dim))
        self.recurrent_kernel = nn.Parameter(_capsule_kernel(num_capsules, capsule_dim, num_capsules, capsule_dim))
        for name, rows in (("init_input_logits", in_capsules), ("init_recurrent_logits", num_capsules)):
            logits = torch.zeros(rows, num_capsules)
            if logits_prior:
                self.register_parameter(name, nn.Parameter(logits))
            else:
                self.register_buffer(name, logits)

    def forward(self, inputs: Tensor, state: Tensor) -> Tensor:
        u = torch.einsum("bid,idjk->bijk", inputs, self.input_kernel)
        v = torch.einsum("bid,idjk->bijk", state, self.recurrent_kernel)
        init_in = self.init_input_logits.expand(u.shape[:-1])
        init_state = self.init_recurrent_logits.expand(v.shape[:-1])
        in_l, state_l = init_in, init_state

        def m_step(in_l: Tensor, state_l: Tensor) -> tuple[Tensor, Tensor]:
            w = torch.sigmoid(state_l) if self.probability == "sigmoid" else torch.ones_like(state_l)
            return (torch.softmax(in_l, -1).unsqueeze(-1) * u).sum(-3), (w.unsqueeze(-1) * v).sum(-3)

        for _ in range(self.routing_iters):
            caps = squash(sum(m_step(in_l, state_l)))  # type: ignore[arg-type]
            in_sim = (u * caps.unsqueeze(-3)).sum(-1)
            state_sim = (v * caps.unsqueeze(-3)).sum(-1)
            in_l = in_l + in_sim if self.accumulate[0] else init_in + in_sim
            state_l = state_l + state_sim if self.accumulate[1] else init_state + state_sim
        in_caps, state_caps = m_step(in_l, state_l)
        return squash(in_caps if self.rec_only_vote else in_caps + state_caps)


def _capsule_kernel(in_capsules: int, in_dim: int, num_capsules: int, capsule_dim: int) -> Tensor:
    """The original's ``capsule_initializer``: uniform in ``+-sqrt(3 / ((in_dim + capsule_dim) / 2))``."""
    limit = math.sqrt(3.0 / max(1.0, (in_dim + capsule_dim) / 2.0))
    return torch.empty(in_capsules, in_dim, num_capsules, capsule_dim).uniform_(-limit, limit)


def reverse_valid(x: Tensor, seq_lengths: Tensor) -> Tensor:
    """``tf.reverse_sequence``: each sequence's first ``length`` frames of ``x`` ``[B, T, ...]`` reversed, the
    padding left in place (its own inverse)."""
    T = x.shape[1]
    t = torch.arange(T, device=x.device)[None, :]
    lengths = seq_lengths.to(x.device)[:, None]
    index = torch.where(t < lengths, lengths - 1 - t, t)
    return x.gather(1, index.view(*index.shape, *[1] * (x.dim() - 2)).expand_as(x))


def run_masked(step: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], x: Tensor, state: Tensor,
               seq_lengths: Tensor) -> Tensor:
    """TensorFlow's ``dynamic_rnn`` with ``sequence_length``: frames past a sequence's length give zeros and keep
    its state. ``step(x_t, state) -> (output, new state)``."""
    lengths = seq_lengths.to(x.device)
    outputs = []
    for t in range(x.shape[1]):
        out, new = step(x[:, t], state)
        valid = (t < lengths).view(-1, *[1] * (out.dim() - 1))
        outputs.append(torch.where(valid, out, torch.zeros_like(out)))
        state = torch.where(valid, new, state)
    return torch.stack(outputs, 1)


class DBRCapsNet(nn.Module):
    """The original's ``dbr_capsnet``: padded ``[B, T, input_dim]`` to ``[B, T, 2 * num_capsules * capsule_dim]``.

    Gaussian ``input_noise`` (training only); primary capsules from a bidirectional simple RNN of
    ``num_capsules * capsule_dim`` units per direction whose output is its pre-activation ``[x, h] W + b`` (the
    state is its tanh; Glorot uniform kernel, zero bias), viewed as ``2 * num_capsules`` capsules (forward
    first) and squashed; then ``num_layers - 1`` bidirectional layers of :class:`RecurrentCapsuleCell` (each
    direction its own weights, zero initial state), each giving ``2 * num_capsules`` capsules and followed by
    ``dropout`` in training. Both directions run as TensorFlow's ``bidirectional_dynamic_rnn`` with the sequence
    lengths: the backward one on each sequence reversed within its length, padded frames give zeros."""

    def __init__(self, input_dim: int, num_capsules: int, capsule_dim: int, num_layers: int = 2,
                 routing_iters: int = 3, rec_only_vote: bool = False, recurrent_probability: str = "sigmoid",
                 logits_prior: bool = False, accumulate_input_logits: bool = True,
                 accumulate_state_logits: bool = True, input_noise: float = 0.0, dropout: float = 0.0) -> None:
        super().__init__()
        from ..base.errors import ConfigError

        if min(input_dim, num_capsules, capsule_dim, num_layers) < 1 or routing_iters < 0:
            raise ConfigError(f"DBRCapsNet: input_dim ({input_dim}), num_capsules ({num_capsules}), capsule_dim "
                              f"({capsule_dim}) and num_layers ({num_layers}) must be at least 1, routing_iters "
                              f"({routing_iters}) at least 0")
        if recurrent_probability not in PROBABILITIES:
            raise ConfigError(f"DBRCapsNet recurrent_probability {recurrent_probability!r}; valid: "
                              f"{list(PROBABILITIES)}")
        if not 0 <= dropout < 1:
            raise ConfigError(f"DBRCapsNet dropout = {dropout}: a drop probability in [0, 1)")
        self.num_capsules, self.capsule_dim = int(num_capsules), int(capsule_dim)
        self.input_noise, self.dropout = float(input_noise), float(dropout)
        units = self.num_capsules * self.capsule_dim
        self.output_dim = 2 * units
        primary = [nn.Linear(input_dim + units, units) for _ in range(2)]  # forward, backward
        for linear in primary:
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
        self.primary = nn.ModuleList(primary)
        self.layers = nn.ModuleList(
            nn.ModuleList(RecurrentCapsuleCell(2 * self.num_capsules, self.capsule_dim, self.num_capsules,
                                               self.capsule_dim, routing_iters, rec_only_vote, recurrent_probability,
                                               logits_prior, accumulate_input_logits, accumulate_state_logits)
                          for _ in range(2)) for _ in range(num_layers - 1))

    def _both(self, x: Tensor, seq_lengths: Tensor, state: Tensor,
              steps: tuple[Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], ...]) -> Tensor:
        forward = run_masked(steps[0], x, state, seq_lengths)
        backward = reverse_valid(run_masked(steps[1], reverse_valid(x, seq_lengths), state, seq_lengths), seq_lengths)
        return torch.cat((forward, backward), dim=2)

    def forward(self, x: Tensor, seq_lengths: Tensor) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        B, T = x.shape[:2]
        units = self.num_capsules * self.capsule_dim

        def rnn(linear: nn.Linear) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
            def step(x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
                pre = linear(torch.cat((x_t, h), dim=-1))
                return pre, torch.tanh(pre)
            return step

        h = self._both(x, seq_lengths, x.new_zeros(B, units), tuple(rnn(cast(nn.Linear, m)) for m in self.primary))
        h = squash(h.view(B, T, 2 * self.num_capsules, self.capsule_dim))
        zero = x.new_zeros(B, self.num_capsules, self.capsule_dim)
        for cells in self.layers:
            h = self._both(h, seq_lengths, zero, tuple(_cell_step(cast(RecurrentCapsuleCell, c))
                                                       for c in cast(nn.ModuleList, cells)))
            if self.training and self.dropout > 0:
                h = nn.functional.dropout(h, self.dropout, True)
        return h.reshape(B, T, self.output_dim)


def _cell_step(cell: RecurrentCapsuleCell) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    def step(x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        out = cell(x_t, state)
        return out, out
    return step
