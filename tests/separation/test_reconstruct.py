"""The original's reconstructors, each against a transcription of its code (numpy, scikit-learn, scipy)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal
import scipy.special

from mtlab.data.features import Spectral
from mtlab.separation import reconstruct as R

sklearn_cluster = pytest.importorskip("sklearn.cluster", reason="scikit-learn is the k-means oracle (dev extra)")

pytestmark = pytest.mark.usefixtures("one_thread")
ORIGINAL = Spectral(window="sine", framing="snip", sample_scale=32768.0)  # rec_processor.cfg: cosine, 32/8 ms, 256


def blobs(seed: int = 0) -> np.ndarray:
    rs = np.random.RandomState(seed)
    return np.concatenate([rs.randn(120, 4) + 1.5, rs.randn(90, 4) - 1.0, rs.randn(60, 4) * 0.4])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_is_the_originals_sklearn_kmeans(seed: int) -> None:
    x = blobs(seed)
    ref = sklearn_cluster.KMeans(3, init="k-means++", n_init=10, max_iter=100,
                                 random_state=np.random.RandomState(seed)).fit(x)
    np.testing.assert_allclose(R.kmeans(x, 3, np.random.RandomState(seed)), ref.cluster_centers_, atol=1e-12)
    np.testing.assert_array_equal(R.predict(x, ref.cluster_centers_), ref.predict(x))


def test_kmeans_plusplus_and_lloyd_are_sklearns() -> None:
    x = blobs(3)
    seeds, _ = sklearn_cluster.kmeans_plusplus(x, 4, random_state=np.random.RandomState(7))
    np.testing.assert_array_equal(R.kmeans_plusplus(x, 4, np.random.RandomState(7)), seeds)
    init = x[:3].copy()  # a poor start: several Lloyd iterations before the labels settle
    ref = sklearn_cluster.KMeans(3, init=init, n_init=1, max_iter=100).fit(x)
    centers, labels, inertia = R.lloyd(x - x.mean(0), init - x.mean(0))
    np.testing.assert_allclose(centers + x.mean(0), ref.cluster_centers_, atol=1e-12)
    np.testing.assert_array_equal(labels, ref.labels_)
    assert inertia == pytest.approx(ref.inertia_, rel=1e-10)
    few = sklearn_cluster.KMeans(3, init=init, n_init=1, max_iter=2).fit(x)  # stopped by max_iter
    np.testing.assert_allclose(R.lloyd(x - x.mean(0), init - x.mean(0), max_iter=2)[0] + x.mean(0),
                               few.cluster_centers_, atol=1e-12)


def original_weighted_kmeans(data: np.ndarray, weights: np.ndarray, k: int, rs: np.random.RandomState,
                             steps: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """nabu/postprocessing/reconstructors/weighted_kmeans.py, with its global np.random as ``rs``."""
    centroids = data[rs.choice(np.arange(len(data)), k, False)]
    for _ in range(max(steps, 1)):
        sqdists = scipy.spatial.distance.cdist(centroids, data, "euclidean")
        clusters = np.argmin(sqdists, axis=0)
        new_centroids = np.array([np.average(data[clusters == i], weights=weights[clusters == i], axis=0)
                                  for i in range(k)])
        if np.array_equal(new_centroids, centroids):
            break
        centroids = new_centroids
    return clusters, centroids


def test_weighted_kmeans_is_the_originals() -> None:
    import scipy.spatial  # noqa: F401  (the original's distance)

    x = blobs(4)
    w = np.random.RandomState(5).rand(len(x)) + 0.1
    labels, centroids = R.weighted_kmeans(x, w, 3, np.random.RandomState(9))
    ref_labels, ref_centroids = original_weighted_kmeans(x, w, 3, np.random.RandomState(9))
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_allclose(centroids, ref_centroids, atol=1e-12)
    unweighted = R.weighted_kmeans(x, np.ones(len(x)), 3, np.random.RandomState(9))[1]
    assert not np.allclose(unweighted, centroids)  # the weights move the centroids


def embeddings(t: int = 30, f: int = 9, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, F*D] embeddings of two speakers (by a random partition), used bins and the partition."""
    rs = np.random.RandomState(seed)
    owner = rs.rand(t, f) > 0.5
    a, b = rs.randn(d), rs.randn(d)
    emb = np.where(owner[..., None], a, b) * rs.uniform(0.5, 2.0, (t, f, 1)) + 0.3 * rs.randn(t, f, d)
    used = rs.rand(t, f) > 0.3
    return emb.reshape(t, f * d), used, owner


def test_deepclustering_masks_are_the_originals() -> None:
    emb, used, owner = embeddings()
    t, f = used.shape
    masks, centers = R.deepclustering_masks(emb, used, 2, np.random.RandomState(0))
    # DeepclusteringReconstructor._get_masks
    e = emb.reshape(t * f, -1)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    km = sklearn_cluster.KMeans(2, init="k-means++", n_init=10, max_iter=100,
                                random_state=np.random.RandomState(0)).fit(e[used.reshape(-1)])
    labels = km.predict(e).reshape(t, f)
    ref = np.stack([labels == s for s in range(2)]).astype(float)
    np.testing.assert_array_equal(masks, ref)
    np.testing.assert_allclose(centers, km.cluster_centers_, atol=1e-12)
    assert (masks.sum(0) == 1).all() and max((masks[0] == owner).mean(), (masks[1] == owner).mean()) > 0.9


def test_deepclusteringnoise_masks_are_the_originals() -> None:
    emb, used, _ = embeddings(seed=1)
    t, f = used.shape
    alpha = np.random.RandomState(2).rand(t, f)
    for threshold, min_perc in ((0.5, 0.05), (0.99, 0.3)):  # the second falls back to the top bins
        masks = R.deepclusteringnoise_masks(emb, alpha, used, 2, np.random.RandomState(0), threshold, min_perc)
        e = emb.reshape(t * f, -1)
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        a, u = alpha.reshape(-1), used.reshape(-1)
        filt = np.logical_and(u, a > threshold)
        if float(np.sum(filt)) / float(np.sum(u)) < min_perc:
            filt = np.argsort(a * u)[::-1][:int(np.ceil(np.sum(u) * min_perc))]
        km = sklearn_cluster.KMeans(2, init="k-means++", n_init=10, max_iter=100,
                                    random_state=np.random.RandomState(0)).fit(e[filt])
        labels = km.predict(e).reshape(t, f)
        np.testing.assert_allclose(masks, np.stack([(labels == s) * alpha for s in range(2)]), atol=0)


def test_attractor_masks_are_the_originals() -> None:
    emb, used, _ = embeddings(seed=3)
    t, f = used.shape
    masks, centers = R.attractor_masks(emb, used, 2, np.random.RandomState(0))
    out = emb.reshape(t * f, -1)  # DeepattractorReconstructor: no normalization
    km = sklearn_cluster.KMeans(2, init="k-means++", n_init=10, max_iter=100,
                                random_state=np.random.RandomState(0)).fit(out[used.reshape(-1)])
    ref = scipy.special.softmax(km.cluster_centers_ @ out.T, axis=0).reshape(2, t, f)
    np.testing.assert_allclose(masks, ref, atol=1e-12)


@pytest.mark.parametrize("activation", ["softmax", "sigmoid", "None"])
def test_stacked_masks_are_the_originals(activation: str) -> None:
    t, f, s = 7, 5, 3
    bin_est = np.random.RandomState(0).randn(t, f * s)
    masks = R.stacked_masks(bin_est, s, activation)
    ref = np.transpose(np.reshape(bin_est, [t, f, s], "F"), [2, 0, 1])  # StackedmasksReconstructor._get_masks
    if activation == "softmax":
        ref = np.exp(ref) / np.sum(np.exp(ref), axis=0)
    elif activation == "sigmoid":
        ref = 1 / (1 + np.exp(-ref))
    np.testing.assert_allclose(masks, ref, atol=1e-12)
    assert np.allclose(masks[1], ref[1]) and not np.allclose(masks[0], masks[1])
    # speaker-major: speaker 1's first bin is column f (the layout PIT's speaker_major reads)
    assert R.stacked_masks(bin_est, s, "None")[1, 0, 0] == bin_est[0, f]


def original_spec2time(mixture: np.ndarray, mask: np.ndarray, rate: int = 8000, winlen: float = 0.032,
                       winstep: float = 0.008, nfft: int = 256) -> np.ndarray:
    """snip + framesig + spec (spec.py, base.py, sigproc.py), mask, then spec2time / deframesig."""
    n = int((len(mixture) - winlen * rate) / (winstep * rate))
    sig = mixture[0:int(round(n * winstep * rate + winlen * rate))]
    frame_len, frame_step = int(round(winlen * rate)), int(round(winstep * rate))
    slen = len(sig)
    numframes = 1 if slen <= frame_len else 1 + int(np.ceil((1.0 * slen - frame_len) / frame_step))
    padsignal = np.concatenate((sig, np.zeros((int((numframes - 1) * frame_step + frame_len) - slen,))))
    indices = (np.tile(np.arange(0, frame_len), (numframes, 1))
               + np.tile(np.arange(0, numframes * frame_step, frame_step), (frame_len, 1)).T)
    win = scipy.signal.windows.cosine(frame_len)
    frames = padsignal[indices] * np.tile(win, (numframes, 1))
    spec = np.fft.rfft(frames, nfft) * mask
    frames = np.fft.irfft(spec)
    padlen = (numframes - 1) * frame_step + frame_len
    rec_signal = np.zeros((padlen,))
    window_correction = np.zeros((padlen,))
    for i in range(numframes):
        window_correction[indices[i, :]] = window_correction[indices[i, :]] + win + 1e-15
        rec_signal[indices[i, :]] = rec_signal[indices[i, :]] + frames[i, :]
    rec_signal = rec_signal / window_correction
    rec_signal = rec_signal[0:len(mixture)]
    return rec_signal / np.max(np.abs(rec_signal))


def test_resynthesis_is_the_originals() -> None:
    rs = np.random.RandomState(0)
    mixture = np.round(rs.randn(3001) * 3000)  # int16 values, not a whole number of frames
    spec = R.mixture_spectrum(mixture, ORIGINAL)
    masks = rs.rand(2, *spec.shape)
    got = R.apply_and_resynthesize(mixture, masks, ORIGINAL)
    for s in range(2):
        np.testing.assert_allclose(got[s], original_spec2time(mixture, masks[s]), atol=1e-10)
    assert got.shape[1] == (spec.shape[0] - 1) * 64 + 256 < len(mixture)  # the snipped length
    whole = R.apply_and_resynthesize(mixture, np.ones((1, *spec.shape)), ORIGINAL)[0]
    ref = mixture[:whole.shape[0]]  # a mask of ones gives the snipped mixture back, scaled to a peak of 1
    np.testing.assert_allclose(whole, ref / np.max(np.abs(ref)), atol=1e-12)
