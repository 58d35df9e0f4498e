"""The original's encoder-decoder CNN (``encoder_decoder_cnn``): a U-shaped stack of 2-d convolutions over the
time-frequency plane that gives one vector per time-frequency bin."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

ACTIVATIONS = ("relu", "tanh", "sigmoid")
BYPASSES = ("none", "concat", "unpool")


class FixedStatsNorm(nn.Module):
    """The original's ``layer_norm``: ``tf.layers.batch_normalization`` called without ``training``, so it
    always normalizes with its initial statistics (mean 0, variance 1, epsilon 1e-3) and only its per-channel
    scale and shift learn: ``x / sqrt(1.001) * scale + shift`` on ``[B, C, T, F]``."""

    EPSILON = 1e-3

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(channels))
        self.shift = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        factor = self.scale / (1.0 + self.EPSILON) ** 0.5
        return x * factor[:, None, None] + self.shift[:, None, None]


class EncoderDecoderCNN(nn.Module):
    """Padded ``[B, T, F]`` features to ``[B, T, F, output_filters]``, one vector per time-frequency bin.

    Encoder layer ``l``: a convolution of ``filters[l]`` channels with kernel ``kernels[l]`` (time, frequency),
    stride 1 and TensorFlow's ``same`` zero padding (the extra row of an even kernel goes after), then
    ``activation``, the ``layer_norm`` affine (:class:`FixedStatsNorm`), then max pooling of window = stride
    ``pools[l]`` (``[1, 1]``: none) that drops an incomplete last window. ``num_centre_layers`` more
    convolutions (``filters[-1]`` channels, kernel ``centre_kernel``) follow without pooling. Decoder layer
    ``l`` mirrors encoder layer ``e = n - 1 - l`` (its kernel) and gives ``filters[e - 1]`` channels
    (``output_filters`` for the last): its input is the previous output, joined on the channels with encoder
    layer ``e``'s pooled output (``bypass = "concat"``, from the second decoder layer on when there is no centre
    layer) or unpooled (``"unpool"``: each value goes where its window's first maximum was, zero elsewhere);
    then a transposed convolution with ``same`` padding and stride ``pools[e]`` (1 with ``"unpool"``),
    ``activation``, the affine, and the output is grown to encoder layer ``e``'s input size by repeating its
    last frame and bin (what pooling dropped). The original ignores sequence lengths: padded frames (zeros)
    are convolved like any other, so a sequence's last frames depend on the padding after them, as there.
    ``input_noise``: Gaussian noise on the input, in training mode only. Weights start as the original's
    (Glorot uniform kernels, zero biases)."""

    def __init__(self, filters: list[int], kernels: list[list[int]], pools: list[list[int]], output_filters: int,
                 num_centre_layers: int = 0, centre_kernel: list[int] | None = None, bypass: str = "none",
                 activation: str = "relu", layer_norm: bool = False, input_noise: float = 0.0) -> None:
        super().__init__()
        from ..base.errors import ConfigError

        n = len(filters)
        if n < 1 or len(kernels) != n or len(pools) != n:
            raise ConfigError(f"EncoderDecoderCNN: give one entry per encoder layer (at least one) in filters "
                              f"({len(filters)}), kernels ({len(kernels)}) and pools ({len(pools)})")
        for name, pairs in (("kernels", kernels), ("pools", pools)):
            if any(len(p) != 2 or min(p) < 1 for p in pairs):
                raise ConfigError(f"EncoderDecoderCNN {name} = {pairs}: each is [time, frequency] of positive sizes")
        if bypass not in BYPASSES:
            raise ConfigError(f"EncoderDecoderCNN bypass {bypass!r}; valid: {list(BYPASSES)}")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"EncoderDecoderCNN activation {activation!r}; valid: {list(ACTIVATIONS)}")
        if num_centre_layers and (centre_kernel is None or len(centre_kernel) != 2 or min(centre_kernel) < 1):
            raise ConfigError("EncoderDecoderCNN: centre layers need centre_kernel = [time, frequency]")
        self.kernels = [(int(p[0]), int(p[1])) for p in kernels]  # (time, frequency)
        self.pools = [(int(q[0]), int(q[1])) for q in pools]
        self.bypass, self.activation, self.input_noise = bypass, activation, float(input_noise)
        self.num_centre_layers = int(num_centre_layers)
        self.output_dim = int(output_filters)
        decoder_filters = [*filters[::-1][1:], output_filters]
        channels = [1, *filters]
        self.encoder = nn.ModuleList(nn.Conv2d(channels[i], filters[i], self.kernels[i])
                                     for i in range(n))
        centre = (int(centre_kernel[0]), int(centre_kernel[1])) if centre_kernel else (1, 1)
        self.centre = nn.ModuleList(nn.Conv2d(filters[-1], filters[-1], centre) for _ in range(self.num_centre_layers))
        self.decoder = nn.ModuleList()
        previous = filters[-1]
        for l, out in enumerate(decoder_filters):
            e = n - 1 - l
            joined = bypass == "concat" and (self.num_centre_layers > 0 or l > 0)
            self.decoder.append(nn.ConvTranspose2d(previous + (filters[e] if joined else 0), out, self.kernels[e],
                                                   stride=self.pools[e] if bypass != "unpool" else 1))
            previous = out
        convs = [*self.encoder, *self.centre, *self.decoder]
        self.norms = nn.ModuleList(FixedStatsNorm(c.out_channels) for c in convs) if layer_norm else None
        for conv in convs:  # the original's tf.layers defaults
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)

    def _finish(self, x: Tensor, index: int) -> Tensor:
        """Activation, then the layer's affine (the original's order)."""
        x = torch.relu(x) if self.activation == "relu" else getattr(torch, self.activation)(x)
        return self.norms[index](x) if self.norms is not None else x

    def forward(self, x: Tensor) -> Tensor:
        from ..base.errors import BatchError

        if x.dim() != 3:
            raise BatchError(f"EncoderDecoderCNN: input must be [B, T, F], got {tuple(x.shape)}")
        need = [1, 1]
        for pool in self.pools:
            need = [a * b for a, b in zip(need, pool)]
        if x.shape[1] < need[0] or x.shape[2] < need[1]:
            raise BatchError(f"EncoderDecoderCNN: {x.shape[1]} frames x {x.shape[2]} bins is smaller than the "
                             f"{need[0]} x {need[1]} its pooling needs (the original fails too); give longer segments")
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        h = x.unsqueeze(1)  # [B, 1, T, F]
        sizes: list[torch.Size] = []  # each encoder layer's input (T, F): what its decoder layer gives back
        before: list[torch.Size] = []  # each encoder layer's output size before pooling
        pooled: list[Tensor] = []
        indices: list[Tensor | None] = []  # where each window's maximum was (unpool only)
        index = 0
        for conv, pool in zip(self.encoder, self.pools):
            sizes.append(h.shape[-2:])
            h = self._finish(conv(same_padded(h, cast(nn.Conv2d, conv).kernel_size)), index)
            index += 1
            before.append(h.shape[-2:])
            found = None
            if pool != (1, 1):
                if self.bypass == "unpool":
                    h, found = F.max_pool2d(h, pool, pool, return_indices=True)
                else:
                    h = F.max_pool2d(h, pool, pool)
            pooled.append(h)
            indices.append(found)
        for conv in self.centre:
            h = self._finish(conv(same_padded(h, cast(nn.Conv2d, conv).kernel_size)), index)
            index += 1
        n = len(self.encoder)
        for l, conv in enumerate(self.decoder):
            e = n - 1 - l
            if self.bypass == "concat" and (self.num_centre_layers > 0 or l > 0):
                h = torch.cat((h, pooled[e]), dim=1)
            found = indices[e]
            if self.bypass == "unpool" and found is not None:
                h = unpool(h, found, before[e])
            h = self._finish(transposed_same(h, cast(nn.ConvTranspose2d, conv)), index)
            index += 1
            h = repeat_last(h, sizes[e])
        return h.permute(0, 2, 3, 1)  # [B, T, F, C]


def same_padded(x: Tensor, kernel: tuple[int, ...]) -> Tensor:
    """``x`` ``[B, C, T, F]`` zero-padded for TensorFlow's stride-1 ``same`` convolution: ``kernel - 1`` per axis,
    the smaller half before."""
    (kt, kf) = kernel
    return F.pad(x, [(kf - 1) // 2, kf // 2, (kt - 1) // 2, kt // 2])


def transposed_same(x: Tensor, conv: nn.ConvTranspose2d) -> Tensor:
    """TensorFlow's ``conv2d_transpose`` with ``same`` padding: output ``size * stride`` per axis, the full
    transposed convolution cropped by ``(kernel - stride) // 2`` at the start (zeros added where it is short)."""
    out = F.conv_transpose2d(x, conv.weight, None, conv.stride)
    for axis, k, s in ((2, conv.kernel_size[0], conv.stride[0]), (3, conv.kernel_size[1], conv.stride[1])):
        want, start = x.shape[axis] * s, max(k - s, 0) // 2
        out = out.narrow(axis, start, min(want, out.shape[axis] - start))
        if out.shape[axis] < want:
            pad = [0, 0, 0, 0]
            pad[2 * (3 - axis) + 1] = want - out.shape[axis]
            out = F.pad(out, pad)
    return out if conv.bias is None else out + conv.bias[:, None, None]


def unpool(x: Tensor, indices: Tensor, size: torch.Size | tuple[int, int]) -> Tensor:
    """The original's ``unpool`` (TensorFlow's ``max_pool_grad``): each value of ``x`` ``[B, C, t, f]`` put where
    ``max_pool2d`` found its window's maximum (``indices``, flat over ``size``), zero elsewhere."""
    B, C = x.shape[:2]
    out = x.new_zeros(B, C, size[0] * size[1]).scatter(2, indices.flatten(2), x.flatten(2))
    return out.view(B, C, size[0], size[1])


def repeat_last(x: Tensor, size: torch.Size | tuple[int, int]) -> Tensor:
    """``x`` ``[B, C, T, F]`` grown to ``size`` (T, F) by repeating its last frame, then its last bin."""
    for axis, want in ((2, size[0]), (3, size[1])):
        missing = want - x.shape[axis]
        if missing > 0:
            last = x.narrow(axis, x.shape[axis] - 1, 1)
            x = torch.cat((x, last.expand(*[missing if a == axis else -1 for a in range(4)])), dim=axis)
    return x
