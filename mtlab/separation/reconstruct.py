"""Test-time reconstruction as the original's reconstructors do it, one utterance at a time.

The original (``nabu/postprocessing/reconstructors``) turns a network's outputs into masks, multiplies the
mixture's complex spectrum (its ``rec_processor.cfg`` framing) by them and resynthesizes each source:

- ``deepclustering`` / ``deepclustering_flat``: embeddings normalized to unit length, k-means
  (scikit-learn's ``KMeans(init="k-means++", n_init=10, max_iter=100)``) fitted on the used bins, every bin
  assigned to its nearest centre: binary masks. :func:`kmeans` re-implements that k-means (greedy k-means++
  with ``2 + log k`` local trials, Lloyd iterations with the relative tolerance 1e-4 of the data's mean
  variance, the best of ``n_init`` by inertia) on a ``numpy.random.RandomState``;
- ``deepclusteringnoise``: as deepclustering on the used bins whose noise-filter output is above
  ``noise_threshold_for_kmeans`` (at least ``min_kmeans_perc`` of the used bins), masks times the filter;
- ``deepattractornet``: k-means centres of the raw embeddings on the used bins as attractors, masks the
  softmax over speakers of attractor · embedding;
- ``stackedmasks``: the mask head's outputs (flat ``[T, F*S]`` read speaker-major, as the original's
  Fortran-order reshape) through its ``activation`` (softmax over speakers by default);
- :func:`weighted_kmeans`: the original's observation-weighted k-means (Forgy initialization, 20 steps).

:func:`resynthesize` is the original's ``spec2time``: the mixture snipped to whole frames, framed with the
analysis window, masked, inverse FFT per frame, overlap-added without a synthesis window and divided by the
summed analysis windows (``+1e-15`` per frame), then scaled to a peak of 1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..data.features import Spectral, window
from ..base.errors import BatchError, ConfigError

KMEANS_N_INIT = 10  # the original's KMeans(n_init=10, max_iter=100) with scikit-learn's default tol
KMEANS_MAX_ITER = 100
KMEANS_TOL = 1e-4
NOISE_THRESHOLD = 0.75  # deepclusteringnoise defaults (noise_threshold_for_kmeans, min_kmeans_perc)
MIN_KMEANS_PERC = 0.05
WEIGHTED_KMEANS_STEPS = 20
ACTIVATIONS = ("softmax", "sigmoid", "none", "None")


# ---------------------------------------------------------------------------------- k-means
def _sq_dist(x: np.ndarray, c: np.ndarray, x_sq: np.ndarray | None = None) -> np.ndarray:
    """Squared distances ``[N, K]`` by the expansion ``|x|^2 - 2 x.c + |c|^2`` (scikit-learn's), floored at 0."""
    x_sq = (x * x).sum(1) if x_sq is None else x_sq
    d = x_sq[:, None] - 2.0 * (x @ c.T) + (c * c).sum(1)[None, :]
    return np.maximum(d, 0.0)


def kmeans_plusplus(x: np.ndarray, k: int, rng: np.random.RandomState) -> np.ndarray:
    """Greedy k-means++ seeds ``[k, D]``: the first uniformly, each next the best of ``2 + int(log k)``
    candidates drawn in proportion to the squared distance to the nearest seed."""
    n = x.shape[0]
    trials = 2 + int(np.log(k))
    x_sq = (x * x).sum(1)
    centers = np.empty((k, x.shape[1]), dtype=x.dtype)
    centers[0] = x[rng.choice(n, p=np.full(n, 1.0) / n)]
    closest = _sq_dist(x, centers[:1], x_sq)[:, 0]
    pot = closest.sum()
    for c in range(1, k):
        draws = rng.uniform(size=trials) * pot
        ids = np.clip(np.searchsorted(np.cumsum(closest), draws), None, n - 1)
        cand = np.minimum(closest[None, :], _sq_dist(x, x[ids], x_sq).T)
        pots = cand.sum(1)
        best = int(np.argmin(pots))
        pot, closest = pots[best], cand[best]
        centers[c] = x[ids[best]]
    return centers


def lloyd(x: np.ndarray, centers: np.ndarray, max_iter: int = KMEANS_MAX_ITER,
          tol: float = KMEANS_TOL) -> tuple[np.ndarray, np.ndarray, float]:
    """Lloyd iterations from ``centers``: stop when the labels repeat or the summed squared centre shift is
    at most ``tol`` x the data's mean variance. Returns (centres, labels, inertia). An empty cluster takes
    the point farthest from its centre."""
    tol_abs = float(np.mean(np.var(x, axis=0))) * tol
    x_sq = (x * x).sum(1)
    k = centers.shape[0]
    labels_old = np.full(x.shape[0], -1)
    strict = False
    for _ in range(max_iter):
        d = _sq_dist(x, centers, x_sq)
        labels = d.argmin(1)
        new = np.zeros_like(centers)
        counts = np.bincount(labels, minlength=k).astype(x.dtype)
        np.add.at(new, labels, x)
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            far = np.argsort(d[np.arange(x.shape[0]), labels])[::-1][:empty.size]
            for j, i in zip(empty, far):
                new[labels[i]] -= x[i]
                counts[labels[i]] -= 1
                new[j], counts[j] = x[i], 1
        new /= counts[:, None]
        shift = float(((new - centers) ** 2).sum())
        centers = new
        if np.array_equal(labels, labels_old):
            strict = True
            break
        if shift <= tol_abs:
            break
        labels_old = labels
    if not strict:
        labels = _sq_dist(x, centers, x_sq).argmin(1)
    inertia = float(_sq_dist(x, centers, x_sq)[np.arange(x.shape[0]), labels].sum())
    return centers, labels, inertia


def kmeans(x: np.ndarray, k: int, rng: np.random.RandomState | int = 0, n_init: int = KMEANS_N_INIT,
           max_iter: int = KMEANS_MAX_ITER, tol: float = KMEANS_TOL) -> np.ndarray:
    """The centres ``[k, D]`` of the original's ``KMeans(n_clusters=k, init="k-means++", n_init=10,
    max_iter=100)`` fitted on ``x [N, D]``: the run of lowest inertia (the data centred first, as
    scikit-learn does)."""
    rng = np.random.RandomState(rng) if isinstance(rng, int) else rng
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < k:
        raise BatchError(f"kmeans needs at least {k} points [N, D] to make {k} clusters, got {x.shape}")
    mean = x.mean(0)
    xc = x - mean
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for _ in range(n_init):
        centers, labels, inertia = lloyd(xc, kmeans_plusplus(xc, k, rng), max_iter, tol)
        if best is None or (inertia < best[2] and not _same_clustering(labels, best[1], k)):
            best = (centers, labels, inertia)
    assert best is not None
    return best[0] + mean


def _same_clustering(a: np.ndarray, b: np.ndarray, k: int) -> bool:
    """Whether two labelings are one partition up to renaming (scikit-learn's tie rule between runs)."""
    mapping = np.full(k, -1)
    for i, j in zip(a, b):
        if mapping[i] == -1:
            mapping[i] = j
        elif mapping[i] != j:
            return False
    return True


def predict(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """The nearest centre of every point."""
    return _sq_dist(np.asarray(x, dtype=np.float64), centers).argmin(1)


def weighted_kmeans(data: np.ndarray, weights: np.ndarray, k: int, rng: np.random.RandomState | int = 0,
                    steps: int = WEIGHTED_KMEANS_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """The original's ``weighted_kmeans.kmeans``: ``k`` distinct points drawn as centroids (Forgy), then
    ``steps`` rounds of nearest-centroid labels (Euclidean) and weighted means, stopping when the centroids
    repeat. Returns (labels, centroids). A cluster left empty or of zero weight keeps its centroid (the
    original fails there)."""
    rng = np.random.RandomState(rng) if isinstance(rng, int) else rng
    data = np.asarray(data, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if data.shape[0] != weights.shape[0]:
        raise BatchError(f"weighted_kmeans: {data.shape[0]} points but {weights.shape[0]} weights")
    centroids = data[rng.choice(np.arange(len(data)), k, False)]
    clusters = np.zeros(len(data), dtype=int)
    for _ in range(max(steps, 1)):
        dist = np.sqrt(np.maximum(_sq_dist(data, centroids), 0.0))
        clusters = dist.argmin(1)
        new = centroids.copy()
        for i in range(k):
            w = weights[clusters == i]
            if w.sum() > 0:
                new[i] = (data[clusters == i] * w[:, None]).sum(0) / w.sum()
        if np.array_equal(new, centroids):
            break
        centroids = new
    return clusters, centroids


# ---------------------------------------------------------------------------------- masks
def _per_bin(x: np.ndarray, num_bins: int, what: str) -> np.ndarray:
    """``[T, F*D]`` (index ``f*D + d``) or ``[T, F, D]`` as ``[T*F, D]``."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 3 and x.shape[1] == num_bins:
        return x.reshape(-1, x.shape[2])
    if x.ndim == 2 and x.shape[1] % num_bins == 0:
        return x.reshape(x.shape[0] * num_bins, x.shape[1] // num_bins)
    raise BatchError(f"{what}: {x.shape} does not divide into {num_bins} bins per frame")


def deepclustering_masks(embeddings: np.ndarray, usedbins: np.ndarray, nrs: int,
                         rng: np.random.RandomState | int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Binary masks ``[S, T, F]`` and centres: unit-length embeddings, k-means on the used bins, every bin
    to its nearest centre (the original's ``DeepclusteringReconstructor``)."""
    t, f = usedbins.shape
    emb = _per_bin(embeddings, f, "embeddings")
    if emb.shape[0] != t * f:
        raise BatchError(f"embeddings of {emb.shape[0] // f} frames for usedbins of {t}")
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    used = usedbins.reshape(-1).astype(bool)
    centers = kmeans(emb[used], nrs, rng)
    labels = predict(emb, centers).reshape(t, f)
    return np.stack([labels == s for s in range(nrs)]).astype(np.float64), centers


def deepclusteringnoise_masks(embeddings: np.ndarray, noise_filter: np.ndarray, usedbins: np.ndarray, nrs: int,
                              rng: np.random.RandomState | int = 0, threshold: float = NOISE_THRESHOLD,
                              min_perc: float = MIN_KMEANS_PERC) -> np.ndarray:
    """Masks ``[S, T, F]`` of the original's ``DeepclusteringnoiseReconstructor``: k-means on the used bins
    whose filter value exceeds ``threshold`` (or, when those are under ``min_perc`` of the used bins, on the
    ``ceil(min_perc x used)`` bins of largest filter value among the used ones), labels times the filter."""
    t, f = usedbins.shape
    emb = _per_bin(embeddings, f, "embeddings")
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    alpha = np.asarray(noise_filter, dtype=np.float64)[:t].reshape(-1)
    used = usedbins.reshape(-1).astype(bool)
    pick: np.ndarray = np.logical_and(used, alpha > threshold)
    if pick.sum() / max(used.sum(), 1) < min_perc:
        wanted = int(np.ceil(used.sum() * min_perc))
        pick = np.argsort(alpha * used)[::-1][:wanted]
    chosen = emb[pick]
    if chosen.shape[0] < 2:
        return np.zeros((nrs, t, f))
    labels = predict(emb, kmeans(chosen, nrs, rng)).reshape(t, f)
    filt = alpha.reshape(t, f)
    return np.stack([(labels == s) * filt for s in range(nrs)]).astype(np.float64)


def attractor_masks(embeddings: np.ndarray, usedbins: np.ndarray, nrs: int, rng: np.random.RandomState | int = 0,
                    activation: str = "softmax") -> tuple[np.ndarray, np.ndarray]:
    """Soft masks ``[S, T, F]`` of the original's ``DeepattractorReconstructor``: the k-means centres of the
    (unnormalized) embeddings of the used bins are the attractors; softmax over speakers of A·e."""
    if activation != "softmax":
        raise ConfigError(f"deepattractornet reconstructor activation = {activation!r}: the original knows "
                          "'softmax' only")
    t, f = usedbins.shape
    emb = _per_bin(embeddings, f, "embeddings")
    centers = kmeans(emb[usedbins.reshape(-1).astype(bool)], nrs, rng)
    logits = centers @ emb.T  # [S, T*F]
    logits = logits - logits.max(0, keepdims=True)
    e = np.exp(logits)
    return (e / e.sum(0, keepdims=True)).reshape(nrs, t, f), centers


def stacked_masks(bin_est: np.ndarray, nrs: int, activation: str = "softmax") -> np.ndarray:
    """Masks ``[S, T, F]`` of the original's ``StackedmasksReconstructor``: flat ``[T, F*S]`` outputs read as
    numpy's Fortran-order reshape to ``[T, F, S]`` (column ``s*F + f``), then the activation."""
    x = np.asarray(bin_est, dtype=np.float64)
    if x.ndim == 2:
        if x.shape[1] % nrs:
            raise BatchError(f"stacked masks {x.shape}: {x.shape[1]} outputs per frame are not nrs = {nrs} masks")
        masks = np.reshape(x, [x.shape[0], x.shape[1] // nrs, nrs], "F")
    elif x.ndim == 3:
        masks = x
    else:
        raise BatchError(f"stacked masks {x.shape}: expected [T, F*S] or [T, F, S]")
    masks = np.transpose(masks, [2, 0, 1])
    if activation == "softmax":
        e = np.exp(masks)  # as the original: no max subtracted
        return e / e.sum(0)
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-masks))
    if activation in ("none", "None"):
        return masks
    raise ConfigError(f"stackedmasks activation = {activation!r}; the original knows {', '.join(ACTIVATIONS)}")


# ---------------------------------------------------------------------------------- resynthesis
def snip(signal: np.ndarray, spectral: Spectral) -> np.ndarray:
    """The original's ``sigproc.snip``: the signal cut to ``int((N - L) / H)`` whole frames' length."""
    n = int((len(signal) - spectral.win_length) / spectral.hop_length)
    return signal[:int(round(n * spectral.hop_length + spectral.win_length))]


def mixture_spectrum(mixture: np.ndarray, spectral: Spectral) -> np.ndarray:
    """The complex spectrum ``[T, n_fft/2+1]`` the original's ``spec`` feature gives (``rec_processor``): the
    snipped signal framed (``framesig``: ``1 + ceil`` frames, the last zero-padded), windowed, ``rfft``."""
    x = snip(np.asarray(mixture, dtype=np.float64), spectral)
    win, hop = spectral.win_length, spectral.hop_length
    frames_n = 1 if len(x) <= win else 1 + math.ceil((len(x) - win) / hop)
    pad = np.concatenate([x, np.zeros((frames_n - 1) * hop + win - len(x))])
    idx = np.arange(win)[None, :] + hop * np.arange(frames_n)[:, None]
    w = window(spectral.window, win, torch.float64).numpy()
    return np.fft.rfft(pad[idx] * w, spectral.n_fft)


def resynthesize(spectrum: np.ndarray, spectral: Spectral, siglen: int = 0) -> np.ndarray:
    """The original's ``spec2time``: ``irfft`` per frame, overlap-add, division by the summed analysis windows
    (each frame adding ``w + 1e-15``), cut to ``siglen`` samples (0: all), scaled to a peak of 1."""
    win, hop = spectral.win_length, spectral.hop_length
    frames = np.fft.irfft(spectrum)
    if frames.shape[1] != win:
        raise ConfigError(f"resynthesis needs nfft = winlen (the original's deframesig asserts it); got nfft "
                          f"{frames.shape[1]} for a window of {win} samples")
    t = frames.shape[0]
    total = (t - 1) * hop + win
    out = np.zeros(total)
    norm = np.zeros(total)
    w = window(spectral.window, win, torch.float64).numpy()
    for i in range(t):
        out[i * hop:i * hop + win] += frames[i]
        norm[i * hop:i * hop + win] += w + 1e-15
    out = out / norm
    out = out[:siglen] if siglen > 0 else out
    peak = np.max(np.abs(out))
    return out / peak if peak > 0 else out


def apply_and_resynthesize(mixture: np.ndarray, masks: np.ndarray, spectral: Spectral) -> np.ndarray:
    """Estimated sources ``[S, N']`` from a mixture (in the scale the original reads, int16 values) and masks
    ``[S, T, F]``, with the mixture's phase; ``N'`` is the snipped length."""
    spec = mixture_spectrum(mixture, spectral)
    if masks.shape[1:] != spec.shape:
        raise BatchError(f"masks {masks.shape[1:]} (frames, bins) do not fit the mixture's spectrum {spec.shape}; "
                         "the reconstructor's processor must frame the audio as the features do")
    return np.stack([resynthesize(spec * m, spectral, len(mixture)) for m in masks])


def reconstruct(kind: str, outputs: dict[str, Any], nrs: int, usedbins: np.ndarray | None,
                rng: np.random.RandomState, options: dict[str, Any]) -> np.ndarray:
    """Masks ``[S, T, F]`` for one utterance by reconstructor ``kind`` (see :data:`RECONSTRUCTORS`)."""
    if kind in ("deepclustering", "deepclustering_flat"):
        return deepclustering_masks(outputs["bin_emb"], _need(usedbins, kind), nrs, rng)[0]
    if kind == "deepclusteringnoise":
        return deepclusteringnoise_masks(outputs["bin_emb"], outputs["noise_filter"], _need(usedbins, kind), nrs, rng,
                                         options.get("noise_threshold_for_kmeans", NOISE_THRESHOLD),
                                         options.get("min_kmeans_perc", MIN_KMEANS_PERC))
    if kind == "deepattractornet":
        return attractor_masks(outputs["bin_emb"], _need(usedbins, kind), nrs, rng,
                               options.get("activation", "softmax"))[0]
    if kind == "stackedmasks":
        return stacked_masks(outputs["bin_est"], nrs, options.get("activation", "softmax"))
    raise ConfigError(f"reconstruct_type = {kind!r}: mtlab reconstructs {', '.join(RECONSTRUCTORS)}")


def _need(usedbins: np.ndarray | None, kind: str) -> np.ndarray:
    if usedbins is None:
        raise ConfigError(f"reconstruct_type = {kind!r} clusters the used bins: give the reconstructor's usedbins")
    return usedbins


# the reconstructor types mtlab runs, with the network outputs each reads (the original's requested_output_names)
RECONSTRUCTORS: dict[str, tuple[str, ...]] = {
    "deepclustering": ("bin_emb",), "deepclustering_flat": ("bin_emb",), "deepclusteringnoise": ("bin_emb", "noise_filter"),
    "deepattractornet": ("bin_emb",), "stackedmasks": ("bin_est",),
}
