"""Plain ``nn.Module`` building blocks usable as graph nodes."""

from __future__ import annotations

import torch
from torch import Tensor, nn


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

    def forward(self, x: Tensor, seq_lengths: Tensor) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        lstms = list(self.layers) if self.layer_dropout > 0 else [self.lstm]
        lengths = seq_lengths.cpu()  # pack_padded_sequence needs lengths on the CPU: a small host copy of B ints
        out = x
        for lstm in lstms:
            packed = nn.utils.rnn.pack_padded_sequence(out, lengths, batch_first=True, enforce_sorted=False)
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
            from .errors import ConfigError

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
    """Concatenate inputs on the last axis."""

    def forward(self, *xs: Tensor) -> Tensor:
        return torch.cat(xs, dim=-1)


# Model types by name, for recipes: ``type = "BLSTM"`` plus its settings.
MODELS: dict[str, type[nn.Module]] = {
    "BLSTM": BLSTM, "FeedForward": FeedForward, "Linear": Linear, "Dense": Dense, "MeanPool": MeanPool,
    "Concat": Concat,
}


def build_model(type_name: str, **settings: object) -> nn.Module:
    """``build_model("BLSTM", input_dim=129, hidden=64)``; unknown types list the valid ones."""
    from .registry import build

    return build("model", MODELS, type_name, settings)


# ------------------------------------------------------------------ source-separation heads
class DeepClusteringHead(nn.Module):
    """Per-frame embedding head: Linear to ``F*D``, viewed as ``[B, T, F, D]``, unit-normalized over
    D (``unit_norm``), returned flat as ``[B, T, F*D]`` (index ``f*D + d``, the original's layout).
    ``dropout`` on the input in training mode only."""

    def __init__(self, input_dim: int, num_bins: int = 129, emb_dim: int = 20, unit_norm: bool = True,
                 dropout: float = 0.0, activation: str = "none") -> None:
        super().__init__()
        acts = {"none": nn.Identity, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
        if activation not in acts:
            from .errors import ConfigError

            raise ConfigError(f"DeepClusteringHead activation {activation!r}; valid: {sorted(acts)}")
        self.linear = nn.Linear(input_dim, num_bins * emb_dim)
        self.act = acts[activation]()
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.num_bins, self.emb_dim, self.unit_norm = num_bins, emb_dim, unit_norm

    def forward(self, x: Tensor) -> Tensor:
        v = self.act(self.linear(self.drop(x))).reshape(*x.shape[:-1], self.num_bins, self.emb_dim)
        if self.unit_norm:
            v = nn.functional.normalize(v, dim=-1, eps=1e-12)
        return v.reshape(*x.shape[:-1], self.num_bins * self.emb_dim)


class MaskHead(nn.Module):
    """Per-frame mask head: Linear to ``F*nrS``, then softmax over the speakers (default, the
    original's mask function) or a sigmoid per mask; output flat ``[B, T, F*nrS]`` (index
    ``f*nrS + s``, as ``binary_targets``). ``dropout`` on the input in training mode only.

    The head gives masks, so pair it with ``pit``/``direct`` losses set to ``activation = "none"``;
    the original instead feeds a linear layer's logits to the loss, which applies the softmax
    (``Linear`` + the loss's default ``activation = "softmax"`` does that)."""

    def __init__(self, input_dim: int, num_bins: int = 129, num_sources: int = 2, activation: str = "softmax",
                 dropout: float = 0.0) -> None:
        super().__init__()
        if activation not in ("sigmoid", "softmax"):
            from .errors import ConfigError

            raise ConfigError(f"MaskHead activation {activation!r}; valid: ['sigmoid', 'softmax']")
        self.linear = nn.Linear(input_dim, num_bins * num_sources)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.num_bins, self.num_sources, self.activation = num_bins, num_sources, activation

    def forward(self, x: Tensor) -> Tensor:
        z = self.linear(self.drop(x)).reshape(*x.shape[:-1], self.num_bins, self.num_sources)
        m = torch.sigmoid(z) if self.activation == "sigmoid" else torch.softmax(z, dim=-1)
        return m.reshape(*x.shape[:-1], self.num_bins * self.num_sources)


MODELS.update({"DeepClusteringHead": DeepClusteringHead, "MaskHead": MaskHead})
