"""Source-separation heads: deep-clustering embeddings and masks."""

from __future__ import annotations


import torch
from torch import Tensor, nn


class DeepClusteringHead(nn.Module):
    """Per-frame embedding head: Linear to ``F*D``, viewed as ``[B, T, F, D]``, unit-normalized over
    D (``unit_norm``), returned flat as ``[B, T, F*D]`` (index ``f*D + d``, the original's layout).
    ``dropout`` on the input in training mode only."""

    def __init__(self, input_dim: int, num_bins: int = 129, emb_dim: int = 20, unit_norm: bool = True,
                 dropout: float = 0.0, activation: str = "none") -> None:
        super().__init__()
        acts = {"none": nn.Identity, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
        if activation not in acts:
            from ..base.errors import ConfigError

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
            from ..base.errors import ConfigError

            raise ConfigError(f"MaskHead activation {activation!r}; valid: ['sigmoid', 'softmax']")
        self.linear = nn.Linear(input_dim, num_bins * num_sources)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.num_bins, self.num_sources, self.activation = num_bins, num_sources, activation

    def forward(self, x: Tensor) -> Tensor:
        z = self.linear(self.drop(x)).reshape(*x.shape[:-1], self.num_bins, self.num_sources)
        m = torch.sigmoid(z) if self.activation == "sigmoid" else torch.softmax(z, dim=-1)
        return m.reshape(*x.shape[:-1], self.num_bins * self.num_sources)


class Attractor(nn.Module):
    """The original's DANet attractor layer (``architecture = attractor``): per utterance and speaker, the mean
    embedding over the used bins the speaker dominates.

    ``forward(embeddings [B, T, F*D], labels [B, T, F*S], usedbins [B, T, F])`` (labels: the one-hot
    ``binary_targets``, index ``f*S + s``) gives ``[B, S, D]``: ``Σ y·u·v / max(Σ y·u, 1)`` over the frames and bins,
    so a speaker without a used bin gets a zero attractor; padded frames carry no used bins and do not count.
    ``normalize`` (the original's ``normalization = True``) scales each attractor to unit length."""

    def __init__(self, bins: int = 129, normalize: bool = False) -> None:
        super().__init__()
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            from ..base.errors import ConfigError

            raise ConfigError(f"Attractor bins = {bins!r}: the number of frequency bins (usedbins' last size), >= 1")
        self.bins, self.normalize = bins, bool(normalize)

    def forward(self, embeddings: Tensor, labels: Tensor, usedbins: Tensor) -> Tensor:
        f = self.bins
        if embeddings.shape[-1] % f or labels.shape[-1] % f or usedbins.shape[-1] != f:
            from ..base.errors import BatchError

            raise BatchError(f"Attractor(bins={f}): embeddings {tuple(embeddings.shape)} and labels "
                             f"{tuple(labels.shape)} need a multiple of {f} values per frame, usedbins "
                             f"{tuple(usedbins.shape)} {f}")
        b = embeddings.shape[0]
        used = usedbins.to(embeddings.dtype).reshape(b, -1, 1)
        v = embeddings.reshape(b, -1, embeddings.shape[-1] // f) * used  # [B, T*F, D]
        y = labels.to(embeddings.dtype).reshape(b, -1, labels.shape[-1] // f) * used  # [B, T*F, S]
        counts = y.sum(dim=1).clamp_min(1.0)  # the original sets counts under 1 to 1
        a = torch.einsum("bns,bnd->bsd", y, v) / counts[..., None]
        # tf.nn.l2_normalize: x / sqrt(max(Σx², 1e-12))
        return a * torch.rsqrt(a.square().sum(dim=-1, keepdim=True).clamp_min(1e-12)) if self.normalize else a
