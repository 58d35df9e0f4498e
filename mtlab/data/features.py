"""Spectral features and separation targets with the original recipes' settings.

At 8 kHz: 32 ms Hann window (256 samples, periodic), 8 ms hop (64), n_fft 256 -> 129 bins; no centering or
padding, so an utterance of N >= 256 samples has ``1 + (N - 256) // 64`` frames.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import DataError

WIN_LENGTH = 256
HOP_LENGTH = 64
N_FFT = 256
NUM_BINS = N_FFT // 2 + 1
LOG_FLOOR = 1e-6
USEDBINS_THRESHOLD_DB = 40.0
FRAME_CLASSES = ("silence", "s1", "s2")


def num_frames(num_samples: int) -> int:
    """Frames the STFT gives for ``num_samples`` samples (0 if shorter than one window)."""
    return 0 if num_samples < WIN_LENGTH else 1 + (num_samples - WIN_LENGTH) // HOP_LENGTH


def magnitude(wav: torch.Tensor) -> torch.Tensor:
    """|STFT| of a 1-d signal, shape [T, 129]."""
    if wav.ndim != 1 or wav.shape[0] < WIN_LENGTH:
        raise DataError(f"magnitude needs a 1-d signal of at least {WIN_LENGTH} samples, got shape {tuple(wav.shape)}")
    spec = torch.stft(
        wav,
        n_fft=N_FFT,
        hop_length=HOP_LENGTH,
        win_length=WIN_LENGTH,
        window=torch.hann_window(WIN_LENGTH, dtype=wav.dtype),
        center=False,
        return_complex=True,
    )
    return spec.abs().T.contiguous()


def log_magnitude(mag: torch.Tensor) -> torch.Tensor:
    """Natural log of a magnitude spectrogram, floored at ``LOG_FLOOR``."""
    return mag.clamp_min(LOG_FLOOR).log()


def dominance(src_mag: torch.Tensor) -> torch.Tensor:
    """One-hot index of the loudest source per bin: [T, F, S] magnitudes -> [T, F, S] float (ties: first)."""
    return torch.nn.functional.one_hot(src_mag.argmax(dim=-1), src_mag.shape[-1]).to(src_mag.dtype)


def binary_targets(src_mag: torch.Tensor) -> torch.Tensor:
    """The original's ``binary_targets``: dominance flattened to [T, F * S], index ``f * S + s``."""
    t, f, s = src_mag.shape
    return dominance(src_mag).reshape(t, f * s)


def used_bins(mix_mag: torch.Tensor, threshold_db: float = USEDBINS_THRESHOLD_DB) -> torch.Tensor:
    """Bins whose mixture level (20 log10 |X|) is above the utterance's loudest bin minus ``threshold_db``."""
    level = 20 * mix_mag.clamp_min(LOG_FLOOR).log10()
    return level > level.max() - threshold_db


def frame_target(src_mag: torch.Tensor, threshold_db: float = USEDBINS_THRESHOLD_DB) -> torch.Tensor:
    """Per-frame class [T] long: 0 when no source is within ``threshold_db`` of the loudest frame of any
    source, else 1 + index of the source with the most energy in the frame (see ``FRAME_CLASSES``)."""
    energy = src_mag.square().sum(dim=1)
    level = 10 * energy.clamp_min(LOG_FLOOR**2).log10()
    active = level.max(dim=1).values > level.max() - threshold_db
    return torch.where(active, energy.argmax(dim=1) + 1, torch.zeros_like(active, dtype=torch.long))


@dataclass(frozen=True)
class FeatureStats:
    """Per-bin mean and standard deviation of log-magnitude features, for global mean/variance normalization."""

    mean: torch.Tensor
    std: torch.Tensor
    frames: int
    source: str = ""

    @classmethod
    def from_features(cls, features: Iterable[torch.Tensor], source: str = "") -> FeatureStats:
        """Statistics over all frames of ``features`` (each [T, F]), computed in float64."""
        stacked = torch.cat([f.to(torch.float64) for f in features])
        if stacked.shape[0] == 0:
            raise DataError(f"cannot compute feature statistics from zero frames ({source or 'no source'})")
        std = stacked.std(dim=0, unbiased=False).clamp_min(1e-5)
        return cls(stacked.mean(dim=0).float(), std.float(), int(stacked.shape[0]), source)

    def normalize(self, features: torch.Tensor) -> torch.Tensor:
        """(features - mean) / std."""
        return (features - self.mean) / self.std

    def to_dict(self) -> dict[str, object]:
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "frames": self.frames, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, object], origin: str = "feature stats") -> FeatureStats:
        try:
            mean = torch.tensor(data["mean"], dtype=torch.float32)
            std = torch.tensor(data["std"], dtype=torch.float32)
            stats = cls(mean, std, int(data["frames"]), str(data.get("source", "")))
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"{origin}: not a feature-statistics file (needs mean, std, frames): {err}") from err
        if mean.shape != std.shape or mean.ndim != 1:
            raise DataError(f"{origin}: mean {tuple(mean.shape)} and std {tuple(std.shape)} must be equal 1-d shapes")
        return stats

    def save(self, path: str | Path) -> None:
        """Write as JSON (float32 values round-trip exactly)."""
        Path(path).write_text(json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> FeatureStats:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: feature statistics file not found; compute them with mtlab.data.compute_stats")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from err
        return cls.from_dict(data, origin=str(path))
