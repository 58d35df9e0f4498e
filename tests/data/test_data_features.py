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
