"""Features and targets against plain torch.stft / direct computations."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtlab.data import (
    NUM_BINS,
    DataError,
    FeatureStats,
    binary_targets,
    dominance,
    frame_target,
    log_magnitude,
    magnitude,
    num_frames,
    used_bins,
)


@pytest.mark.slow
def test_magnitude_matches_direct_stft() -> None:
    wav = torch.randn(8000 * 3 // 2, generator=torch.Generator().manual_seed(0))
    window = torch.hann_window(256)
    frames = wav.unfold(0, 256, 64)  # [T, 256], no padding
    expected = torch.fft.rfft(frames * window, n=256).abs()
    spec = torch.stft(wav, n_fft=256, hop_length=64, win_length=256, window=window, center=False, return_complex=True)
    mag = magnitude(wav)
    assert mag.shape == (num_frames(len(wav)), NUM_BINS) == (1 + (len(wav) - 256) // 64, 129)
    torch.testing.assert_close(mag, spec.abs().T)
    torch.testing.assert_close(mag, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(log_magnitude(mag), expected.clamp_min(1e-6).log(), rtol=1e-4, atol=1e-4)


def test_too_short_signal_has_no_frames() -> None:
    assert num_frames(255) == 0 and num_frames(256) == 1 and num_frames(256 + 63) == 1 and num_frames(320) == 2
    with pytest.raises(DataError, match="256 samples"):
        magnitude(torch.zeros(255))


def test_dominance_agrees_with_louder_source_bin_by_bin() -> None:
    src = torch.rand(20, NUM_BINS, 2, generator=torch.Generator().manual_seed(1))
    dom = dominance(src)
    louder = src[..., 0] >= src[..., 1]
    assert torch.equal(dom[..., 0].bool(), louder) and torch.equal(dom[..., 1].bool(), ~louder)
    flat = binary_targets(src)
    assert flat.shape == (20, NUM_BINS * 2)
    assert torch.equal(flat[:, 0::2], dom[..., 0]) and torch.equal(flat[:, 1::2], dom[..., 1])
    assert torch.equal(flat.reshape(20, NUM_BINS, 2).sum(-1), torch.ones(20, NUM_BINS))


@pytest.mark.parametrize("threshold_db", [20.0, 40.0])
def test_used_bins_threshold(threshold_db: float) -> None:
    mag = torch.tensor([[1.0, 0.5, 0.1], [0.011, 0.0099, 0.0]])
    level = 20 * torch.log10(mag.clamp_min(1e-6))
    expected = level > level.max() - threshold_db
    assert torch.equal(used_bins(mag, threshold_db), expected)
    if threshold_db == 40.0:
        assert used_bins(mag).tolist() == [[True, True, True], [True, False, False]]


def test_frame_target_classes() -> None:
    src = torch.zeros(4, NUM_BINS, 2)
    src[0, :, 0] = 1.0  # s1 only
    src[1, :, 1] = 1.0  # s2 only
    src[2, :, 0], src[2, :, 1] = 0.2, 0.3  # both, s2 louder
    src[3] = 1e-4  # 80 dB below: silence
    assert frame_target(src).tolist() == [1, 2, 2, 0]


@pytest.mark.slow
def test_stats_normalize_and_round_trip(tmp_path: Path) -> None:
    feats = [torch.randn(30, NUM_BINS) * 3 + 1, torch.randn(50, NUM_BINS) * 3 + 1]
    stats = FeatureStats.from_features(feats, source="x")
    normed = stats.normalize(torch.cat(feats))
    torch.testing.assert_close(normed.mean(0), torch.zeros(NUM_BINS), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.std(0, unbiased=False), torch.ones(NUM_BINS), atol=1e-4, rtol=0)
    stats.save(tmp_path / "stats.json")
    loaded = FeatureStats.load(tmp_path / "stats.json")
    assert torch.equal(loaded.mean, stats.mean) and torch.equal(loaded.std, stats.std)
    assert (loaded.frames, loaded.source) == (80, "x")


def test_stats_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="missing.json"):
        FeatureStats.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"mean": [1, 2],\n "std": ')
    with pytest.raises(DataError, match=r"bad\.json:2"):
        FeatureStats.load(bad)
    (tmp_path / "partial.json").write_text('{"mean": [1, 2]}')
    with pytest.raises(DataError, match=r"partial\.json.*std"):
        FeatureStats.load(tmp_path / "partial.json")


# ---------------------------------------------------------------- the original's framing, window and scale
def original_framesig(sig, frame_len: int, frame_step: int, win):
    """sigproc.framesig as the original writes it: 1 + ceil frames, the last one zero-padded."""
    import math

    import numpy as np

    slen = len(sig)
    numframes = 1 if slen <= frame_len else 1 + int(math.ceil((1.0 * slen - frame_len) / frame_step))
    padsignal = np.concatenate((sig, np.zeros((numframes - 1) * frame_step + frame_len - slen)))
    indices = np.tile(np.arange(frame_len), (numframes, 1)) + np.tile(
        np.arange(0, numframes * frame_step, frame_step), (frame_len, 1)).T
    return padsignal[indices] * np.tile(win, (numframes, 1))


def original_snip(sig, rate: int, winlen: float, winstep: float):
    """sigproc.snip: cut the signal to whole frames before framing."""
    num = int((len(sig) - winlen * rate) / (winstep * rate))
    return sig[: int(round(num * winstep * rate + winlen * rate))]


@pytest.mark.slow
def test_sine_window_is_scipys_cosine_and_others_match_numpy() -> None:
    import numpy as np
    import scipy.signal

    from mtlab.data.features import window

    torch.testing.assert_close(window("sine", 256, torch.float64), torch.from_numpy(scipy.signal.windows.cosine(256)))
    torch.testing.assert_close(window("hanning", 256, torch.float64), torch.from_numpy(np.hanning(256)))
    torch.testing.assert_close(window("hamming", 256, torch.float64), torch.from_numpy(np.hamming(256)))
    torch.testing.assert_close(window("hann", 256), torch.hann_window(256))


@pytest.mark.parametrize("n", [200, 256, 300, 320, 321, 1000, 1234])
def test_pad_framing_matches_framesig_and_snip_matches_the_feature_computers(n: int) -> None:
    import numpy as np
    import scipy.signal

    from mtlab.data.features import INT16_SCALE, ORIGINAL, Spectral

    g = torch.Generator().manual_seed(n)
    wav = (torch.randint(-2000, 2000, (n,), generator=g).double() / INT16_SCALE)  # int16 values read as floats
    ints = (wav * INT16_SCALE).numpy()  # what scipy's wav.read gives the original
    win = scipy.signal.windows.cosine(256)
    pad = Spectral(window="sine", framing="pad", sample_scale=INT16_SCALE)
    expected_pad = np.abs(np.fft.rfft(original_framesig(ints, 256, 64, win), 256))
    assert pad.num_frames(n) == expected_pad.shape[0]
    torch.testing.assert_close(pad.magnitude(wav), torch.from_numpy(expected_pad))
    expected = np.abs(np.fft.rfft(original_framesig(original_snip(ints, 8000, 0.032, 0.008), 256, 64, win), 256))
    assert ORIGINAL.num_frames(n) == expected.shape[0]
    torch.testing.assert_close(ORIGINAL.magnitude(wav), torch.from_numpy(expected))
    if n >= 256:  # mtlab's default frames whole windows only, and its magnitude is 1/32768 of the original's
        assert num_frames(n) == 1 + (n - 256) // 64
        assert (n - 256) % 64 == 0 or pad.num_frames(n) == num_frames(n) + 1


def test_processor_config_selects_the_original_settings() -> None:
    import mtlab
    from mtlab.data.features import INT16_SCALE, Spectral

    conf = {"processor": "audio_feat_processor", "feature": "logspec", "winlen": "0.032", "winstep": "0.016",
            "winfunc": "cosine", "nfft": "256", "preemph": "0.0", "include_energy": "False"}
    s = Spectral.from_processor_config(conf)
    assert (s.win_length, s.hop_length, s.n_fft, s.window, s.framing, s.sample_scale) == \
        (256, 128, 256, "sine", "snip", INT16_SCALE)
    with pytest.raises(mtlab.ConfigError, match="include_energy = True"):
        Spectral.from_processor_config({**conf, "include_energy": "True"}, origin="x.cfg")
    with pytest.raises(mtlab.ConfigError, match="x.cfg: \\[processor\\] winfunc = 'kaiser'"):
        Spectral.from_processor_config({**conf, "winfunc": "kaiser"}, origin="x.cfg")
    with pytest.raises(mtlab.ConfigError, match="needs 'nfft'"):
        Spectral.from_processor_config({k: v for k, v in conf.items() if k != "nfft"})
    pre = Spectral(window="none", preemph=0.97)
    wav = torch.randn(512, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    emph = torch.cat([wav[:1], wav[1:] - 0.97 * wav[:-1]])
    torch.testing.assert_close(pre.magnitude(wav), Spectral(window="none").magnitude(emph))
