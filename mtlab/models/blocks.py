"""Generic building blocks usable as graph nodes: a packed BLSTM, dense layers, pooling, concatenation."""

from __future__ import annotations


import torch
from torch import Tensor, nn

from .device import Packing, rnn_precision


class BLSTM(nn.Module):
    """Stacked bidirectional LSTM over padded ``[B, T, D]`` input, honouring ``seq_lengths``
    (packed sequences, so padding never leaks into valid frames). Output ``[B, T, 2*hidden]``,
    zero on padded frames. In training mode only: ``input_noise`` adds Gaussian noise to the input,
    ``dropout`` drops between layers (mtlab's), ``layer_dropout`` drops after every layer, the last
    one included (the original's ``dropout``, which is a keep probability: ``1 - keep``)."""

    def __init__(self, input_dim: int, hidden: int, num_layers: int = 1, dropout: float = 0.0,
                 input_noise: float = 0.0, layer_dropout: float = 0.0) -> None:
        super().__init__()
        if layer_dropout > 0:
            # one LSTM per layer, so the dropout can sit after each of them
            self.layers = nn.ModuleList(
                nn.LSTM(input_dim if i == 0 else 2 * hidden, hidden, batch_first=True, bidirectional=True)
                for i in range(num_layers))
        else:
            self.lstm = nn.LSTM(input_dim, hidden, num_layers=num_layers, batch_first=True, bidirectional=True,
                                dropout=dropout if num_layers > 1 else 0.0)
        self.input_noise = input_noise
        self.layer_dropout = layer_dropout
        self.output_dim = 2 * hidden

    def forward(self, x: Tensor, seq_lengths: Tensor, host_lengths: Tensor | None = None) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        lstms = list(self.layers) if self.layer_dropout > 0 else [self.lstm]
        packing = Packing(seq_lengths, host_lengths, x.device)
        region, out = rnn_precision(x)
        with region:
            for lstm in lstms:
                packed = packing.pack(out)
                out, _ = lstm(packed)
                out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
                if self.layer_dropout > 0:
                    out = nn.functional.dropout(out, self.layer_dropout, self.training)
        return out


class FeedForward(nn.Module):
    """Per-frame MLP: ``num_layers`` hidden layers of ``hidden`` units, then a linear output."""

    def __init__(self, input_dim: int, output_dim: int, hidden: int = 128, num_layers: int = 1,
                 dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        act = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[activation]
        layers: list[nn.Module] = []
        d = input_dim
        for _ in range(num_layers):
            layers += [nn.Linear(d, hidden), act()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            d = hidden
        layers.append(nn.Linear(d, output_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Linear(nn.Linear):
    """``nn.Linear`` applied on the last axis (per frame for sequences)."""


class Dense(nn.Module):
    """The original's ``linear`` and ``feedforward`` models: Gaussian ``input_noise`` (training only),
    then one linear layer per entry of ``units``, each followed by ``activation``, the output viewed
    as ``output_shape`` on the last axis (e.g. ``[129, 20]`` for ``[B, T, 129, 20]``), then
    ``dropout`` (a drop probability; the original's keep probability is ``1 - dropout``)."""

    ACTIVATIONS = ("none", "tanh", "sigmoid", "relu", "softmax")

    def __init__(self, input_dim: int, units: list[int], activation: str = "none", input_noise: float = 0.0,
                 dropout: float = 0.0, bias: bool = True, output_shape: list[int] | None = None) -> None:
        super().__init__()
        if activation not in self.ACTIVATIONS:
            from ..base.errors import ConfigError

            raise ConfigError(f"Dense activation {activation!r}; valid: {list(self.ACTIVATIONS)}")
        dims = [input_dim, *units]
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(dims, dims[1:]))
        self.activation, self.input_noise, self.dropout = activation, input_noise, dropout
        self.output_shape = list(output_shape) if output_shape else None
        self.output_dim = units[-1] if not output_shape else output_shape[-1]

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.output_shape and i == len(self.layers) - 1:  # reshaped before the activation, as the original
                x = x.reshape(*x.shape[:-1], *self.output_shape)
            if self.activation == "softmax":
                x = torch.softmax(x, dim=-1)
            elif self.activation != "none":
                x = getattr(torch, self.activation)(x)
        return nn.functional.dropout(x, self.dropout, self.training) if self.dropout > 0 else x


class MeanPool(nn.Module):
    """Mean over valid frames: ``[B, T, D] -> [B, D]`` (for utterance-level targets)."""

    def forward(self, x: Tensor, seq_lengths: Tensor) -> Tensor:
        mask = (torch.arange(x.shape[1], device=x.device)[None, :] < seq_lengths[:, None]).to(x.dtype)
        return (x * mask[..., None]).sum(1) / seq_lengths.clamp(min=1)[:, None].to(x.dtype)


class Concat(nn.Module):
    """Concatenate inputs on the last axis.

    ``expand`` (the original's ``expand_dim_to_first_input``): one flag per input; a flagged input has one
    axis fewer than the first and is repeated over the first input's axis -2 before the concatenation: a
    per-utterance ``[B, D]`` over the time frames of ``[B, T, F]`` (``[B, T, F + D]``), zero on the first
    input's padded frames when ``seq_lengths`` (the first input's) is given; a per-frame ``[B, T, D]`` over
    the bins of a per-bin ``[B, T, F, C]`` (``[B, T, F, C + D]``). ``input_noise``: one standard deviation per input, Gaussian noise added
    in training mode only, before the repeat (one draw per utterance for a repeated input)."""

    def __init__(self, expand: list[bool] | None = None, input_noise: list[float] | None = None) -> None:
        super().__init__()
        self.expand = [bool(e) for e in expand] if expand else []
        if self.expand and self.expand[0]:
            from ..base.errors import ConfigError

            raise ConfigError("Concat expand: the first input cannot be expanded (the others are repeated over "
                              "its frames); give False first")
        self.input_noise = [float(n) for n in input_noise] if input_noise else []

    def forward(self, *xs: Tensor, seq_lengths: Tensor | None = None) -> Tensor:
        for flags, what in ((self.expand, "expand"), (self.input_noise, "input_noise")):
            if flags and len(flags) != len(xs):
                from ..base.errors import ConfigError

                raise ConfigError(f"Concat {what} has {len(flags)} entries for {len(xs)} inputs; give one per input")
        if self.training and any(self.input_noise):
            xs = tuple(x + std * torch.randn_like(x) if std > 0 else x for x, std in zip(xs, self.input_noise))
        if not any(self.expand):
            return torch.cat(xs, dim=-1)
        first = xs[0]
        if first.dim() not in (3, 4):
            from ..base.errors import BatchError

            raise BatchError(f"Concat expand: the first input must be a sequence [B, T, F] or per bin [B, T, F, C], "
                             f"got {tuple(first.shape)}")
        over = first.shape[-2]  # the frames of [B, T, F], the bins of [B, T, F, C]
        mask = None
        if seq_lengths is not None and first.dim() == 3:
            mask = torch.arange(over, device=first.device)[None, :] < seq_lengths.to(first.device)[:, None]
        parts = []
        for x, flag in zip(xs, self.expand):
            if flag:
                if x.dim() != first.dim() - 1 or x.shape[:-1] != first.shape[:-2]:
                    from ..base.errors import BatchError

                    want = "[B, D] per utterance" if first.dim() == 3 else "[B, T, D] per frame"
                    raise BatchError(f"Concat expand: an expanded input must be {want} to repeat over axis -2 of "
                                     f"{tuple(first.shape)}, got {tuple(x.shape)}")
                x = x.unsqueeze(-2).expand(*x.shape[:-1], over, x.shape[-1])
                if mask is not None:
                    x = x * mask.unsqueeze(-1).to(x.dtype)
            parts.append(x)
        return torch.cat(parts, dim=-1)


class Constant(nn.Module):
    """The original's ``constant_generator``: ``value`` everywhere, shaped ``[B, *shape]`` after the batch of
    its first input (e.g. a zero i-vector ``[B, 20]`` for utterances that have none), plus Gaussian
    ``output_noise`` in training mode only. It has no parameters; its inputs only give the batch size."""

    def __init__(self, shape: list[int], value: float = 0.0, output_noise: float = 0.0) -> None:
        super().__init__()
        self.shape, self.value, self.output_noise = [int(n) for n in shape], float(value), float(output_noise)

    def forward(self, x: Tensor, *others: Tensor) -> Tensor:
        out = x.new_full((x.shape[0], *self.shape), self.value)
        if self.training and self.output_noise > 0:
            out = out + self.output_noise * torch.randn_like(out)
        return out
