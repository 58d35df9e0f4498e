"""Masks from network outputs: k-means over deep-clustering embeddings, attractor masks (DANet at
test time), and mask-head outputs (PIT / direct). Masks are ``[B, T, F, S]``, zero on padded frames."""

from __future__ import annotations

import torch
from torch import Tensor

from ..base.errors import BatchError, ConfigError
from ..losses import time_mask
from .losses import per_bin


def _frames(x: Tensor, seq_lengths: Tensor | None) -> Tensor:
    if seq_lengths is None:
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    return time_mask(seq_lengths.to(x.device), x.shape[1])


def kmeans(points: Tensor, weights: Tensor, k: int, iters: int = 20, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Weighted k-means, batched: ``points [B, N, D]``, ``weights [B, N]`` (0 = ignore the point).

    k-means++ initialisation from a generator seeded with ``seed`` (same seed, same result), then
    ``iters`` Lloyd iterations; an empty cluster keeps its centroid. Returns ``centroids [B, k, D]``
    and the nearest-centroid index of EVERY point ``[B, N]`` (weighted or not).
    """
    if points.dim() != 3 or weights.shape != points.shape[:2]:
        raise BatchError(
            f"kmeans needs points [B, N, D] and weights [B, N], got {tuple(points.shape)}, {tuple(weights.shape)}"
        )
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    w = weights.to(points.dtype)
    w = torch.where(w.sum(-1, keepdim=True) > 0, w, torch.ones_like(w))  # nothing used: cluster everything
    b = points.shape[0]
    rows = torch.arange(b, device=points.device)

    def draw(p: Tensor) -> Tensor:
        return torch.multinomial(p.cpu().double(), 1, generator=gen)[:, 0].to(points.device)

    centroids = [points[rows, draw(w)]]
    for _ in range(1, k):
        d = torch.stack([(points - c[:, None]).square().sum(-1) for c in centroids]).amin(0)
        p = w * d
        p = torch.where(p.sum(-1, keepdim=True) > 0, p, w)  # all points identical: draw by weight
        centroids.append(points[rows, draw(p)])
    c = torch.stack(centroids, dim=1)
    for _ in range(iters):
        assign = torch.cdist(points, c).argmin(-1)
        onehot = torch.nn.functional.one_hot(assign, k).to(points.dtype) * w[..., None]
        counts = onehot.sum(1)
        sums = torch.einsum("bnk,bnd->bkd", onehot, points)
        c = torch.where(counts[..., None] > 0, sums / counts.clamp_min(1e-12)[..., None], c)
    return c, torch.cdist(points, c).argmin(-1)


def kmeans_masks(embeddings: Tensor, usedbins: Tensor, seq_lengths: Tensor | None = None, num_sources: int = 2,
                 iters: int = 20, seed: int = 0, bin_weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Binary masks ``[B, T, F, S]`` from deep-clustering embeddings (``[B, T, F*D]`` or
    ``[B, T, F, D]``): k-means on the used bins of the valid frames (each weighted by ``bin_weights``
    ``[B, T, F]`` if given, e.g. the mixture magnitude), every bin of a valid frame assigned to its
    nearest centroid. Also returns the centroids ``[B, S, D]``."""
    if usedbins.dim() != 3:
        raise BatchError(f"usedbins must be [B, T, F], got {tuple(usedbins.shape)}")
    b, t, f = usedbins.shape
    emb = per_bin(embeddings, f, "embeddings", "kmeans_masks")
    valid = _frames(emb, seq_lengths)
    weights = (usedbins.bool() & valid[..., None]).to(emb.dtype)
    if bin_weights is not None:
        weights = weights * bin_weights.to(emb.dtype)
    weights = weights.reshape(b, t * f)
    centroids, assign = kmeans(emb.reshape(b, t * f, -1), weights, num_sources, iters, seed)
    masks = torch.nn.functional.one_hot(assign, num_sources).to(emb.dtype).reshape(b, t, f, num_sources)
    return masks * valid[:, :, None, None].to(emb.dtype), centroids


def attractor_masks(embeddings: Tensor, attractors: Tensor, seq_lengths: Tensor | None = None) -> Tensor:
    """Soft masks ``[B, T, F, S]`` = softmax over speakers of embedding · attractor (DANet)."""
    f = embeddings.shape[2] // attractors.shape[-1] if embeddings.dim() == 3 else embeddings.shape[2]
    emb = per_bin(embeddings, f, "embeddings", "attractor_masks")
    masks = torch.softmax(torch.einsum("btfd,bsd->btfs", emb, attractors.to(emb.dtype)), dim=-1)
    return masks * _frames(emb, seq_lengths)[:, :, None, None].to(emb.dtype)


def head_masks(masks: Tensor, num_bins: int, seq_lengths: Tensor | None = None) -> Tensor:
    """Mask-head output (``[B, T, F*S]`` or ``[B, T, F, S]``) as ``[B, T, F, S]``, zero on padding."""
    m = per_bin(masks, num_bins, "masks", "head_masks")
    return m * _frames(m, seq_lengths)[:, :, None, None].to(m.dtype)


def power_ratio_masks(masks: Tensor, power: float | None) -> Tensor:
    """Each speaker's mask to ``power``, divided by their sum over the speakers (the last axis): with ``power``
    2, magnitude masks become the power ratio a Wiener filter uses (a bin goes more to the speaker it clearly
    belongs to); the masks then sum to 1 wherever any is above 0. ``None``: ``masks`` as they are."""
    if power is None:
        return masks
    if not power > 0:
        raise ConfigError(f"mask_power must be > 0 (2: power-ratio masks) or None (the masks as they are), got {power!r}")
    q = masks.clamp_min(0) ** power
    total = q.sum(-1, keepdim=True)
    return torch.where(total > 0, q / total.clamp_min(torch.finfo(q.dtype).tiny), torch.zeros_like(q))
