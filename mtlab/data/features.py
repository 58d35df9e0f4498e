"""Spectral features and separation targets.

mtlab's defaults (``MTLAB``): at 8 kHz the original recipes' sizes -- 32 ms window (256 samples),
8 ms hop (64), n_fft 256 -> 129 bins -- with mtlab's own choices: a periodic Hann window, whole frames
only (an utterance of N >= 256 samples has ``1 + (N - 256) // 64`` frames) and samples in [-1, 1].

The original's settings are selectable with :class:`Spectral` (``ORIGINAL``, or
``Spectral.from_processor_config`` for an original processor config): its ``winfunc = cosine`` is a
sine window (``sin(pi (n + 0.5) / L)``), its ``framesig`` pads the last frame with zeros (``1 + ceil``
frames, at least one), and it reads int16-scale samples (x 32768, so magnitudes are 32768 x and squared
losses 2^30 x larger). Its feature computers first snip the signal to whole frames (``sigproc.snip``),
so the frames they give number ``1 + floor`` after all: framing ``"snip"`` does exactly that.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
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


WINDOWS = ("hann", "sine", "hanning", "hamming", "none")
FRAMINGS = ("whole", "pad", "snip")
INT16_SCALE = 32768.0
# The original's winfunc names -> ours ("cosine" is scipy.signal.cosine, a sine window).
NABU_WINFUNCS = {"cosine": "sine", "hanning": "hanning", "hamming": "hamming", "none": "none", "None": "none"}


def window(name: str, length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Analysis window: ``hann`` periodic (mtlab), ``sine`` (the original's "cosine"),
    ``hanning``/``hamming`` symmetric (the original's numpy/scipy ones), ``none`` (ones)."""
    n = torch.arange(length, dtype=torch.float64)
    if name == "hann":
        w = torch.hann_window(length, dtype=torch.float64)
    elif name == "sine":
        w = torch.sin(torch.pi * (n + 0.5) / length)
    elif name == "hanning":
        w = 0.5 - 0.5 * torch.cos(2 * torch.pi * n / max(length - 1, 1))
    elif name == "hamming":
        w = 0.54 - 0.46 * torch.cos(2 * torch.pi * n / max(length - 1, 1))
    elif name == "none":
        w = torch.ones(length, dtype=torch.float64)
    else:
        raise DataError(f"unknown window {name!r}; valid: {list(WINDOWS)}")
    return w.to(dtype)


@dataclass(frozen=True)
class Spectral:
    """STFT settings: sizes in samples, window, framing and sample scale.

    ``framing``: ``whole`` -- whole frames only, ``1 + (N - L) // H`` (0 below one window);
    ``pad`` -- the original's ``framesig``: ``1 + ceil((N - L) / H)`` frames (1 when N <= L), the
    last one zero-padded; ``snip`` -- the original's feature computers: the signal cut to whole frames
    first, then ``framesig`` (``1 + (N - L) // H`` frames, 1 when N < L).
    ``sample_scale`` multiplies the samples first (``INT16_SCALE``: the original's int16 reading).
    """

    win_length: int = WIN_LENGTH
    hop_length: int = HOP_LENGTH
    n_fft: int = N_FFT
    window: str = "hann"
    framing: str = "whole"
    sample_scale: float = 1.0
    preemph: float = 0.0

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            raise DataError(f"Spectral window={self.window!r}; valid: {list(WINDOWS)}")
        if self.framing not in FRAMINGS:
            raise DataError(f"Spectral framing={self.framing!r}; valid: {list(FRAMINGS)}")
        if not (0 < self.hop_length and 0 < self.win_length <= self.n_fft):
            raise DataError(f"Spectral sizes: need 0 < hop_length and 0 < win_length <= n_fft, got {self}")

    @property
    def num_bins(self) -> int:
        """Frequency bins per frame (``nfft // 2 + 1``)."""
        return self.n_fft // 2 + 1

    def num_frames(self, num_samples: int) -> int:
        """Frames for ``num_samples`` samples under this framing."""
        win, hop = self.win_length, self.hop_length
        if self.framing == "whole":
            return 0 if num_samples < win else 1 + (num_samples - win) // hop
        if num_samples <= win:
            return 1 if num_samples > 0 else 0
        if self.framing == "pad":
            return 1 + -(-(num_samples - win) // hop)  # ceil
        return 1 + (num_samples - win) // hop

    def magnitude(self, wav: torch.Tensor) -> torch.Tensor:
        """|STFT| of a 1-d signal, shape [T, n_fft // 2 + 1]."""
        frames = self.num_frames(wav.shape[0]) if wav.ndim == 1 else 0
        if frames == 0:
            raise DataError(f"magnitude needs a 1-d signal of at least {self.win_length} samples "
                            f"(framing {self.framing!r}), got shape {tuple(wav.shape)}")
        x = wav * self.sample_scale if self.sample_scale != 1.0 else wav
        if self.preemph:
            x = torch.cat([x[:1], x[1:] - self.preemph * x[:-1]])
        needed = (frames - 1) * self.hop_length + self.win_length
        x = x[:needed] if x.shape[0] >= needed else torch.cat([x, x.new_zeros(needed - x.shape[0])])
        spec = torch.stft(
            x,
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.win_length,
            window=window(self.window, self.win_length, wav.dtype),
            center=False,
            return_complex=True,
        )
        return spec.abs().T.contiguous()

    @classmethod
    def from_processor_config(cls, conf: Mapping[str, str], sample_rate: int = 8000,
                              origin: str = "processor config") -> Spectral:
        """The original's settings from one of its processor configs (``winlen``/``winstep`` in
        seconds, ``winfunc``, ``nfft``, ``preemph``): sine window for ``cosine``, its framing and
        int16 scale. A value mtlab cannot reproduce is a ConfigError naming the key."""
        from ..base.errors import ConfigError

        def number(key: str, default: str | None = None) -> float:
            text = conf.get(key, default)
            if text is None:
                raise ConfigError(f"{origin}: [processor] needs {key!r} (the original requires it)")
            try:
                return float(text)
            except ValueError:
                raise ConfigError(f"{origin}: [processor] {key} = {text!r} must be a number") from None

        win, hop = number("winlen") * sample_rate, number("winstep") * sample_rate
        winfunc = conf.get("winfunc", "cosine")
        if winfunc not in NABU_WINFUNCS:
            raise ConfigError(f"{origin}: [processor] winfunc = {winfunc!r}: the original knows "
                              f"{sorted(NABU_WINFUNCS)}")
        if str(conf.get("include_energy", "False")) == "True":
            raise ConfigError(f"{origin}: [processor] include_energy = True: mtlab's features have no energy "
                              "column; set it to False")
        return cls(win_length=int(round(win)), hop_length=int(round(hop)), n_fft=int(number("nfft")),
                   window=NABU_WINFUNCS[winfunc], framing="snip", sample_scale=INT16_SCALE,
                   preemph=number("preemph", "0"))


MTLAB = Spectral()
ORIGINAL = Spectral(window="sine", framing="snip", sample_scale=INT16_SCALE)


def num_frames(num_samples: int, spectral: Spectral = MTLAB) -> int:
    """Frames the STFT gives for ``num_samples`` samples (mtlab's framing: 0 if shorter than one window)."""
    return spectral.num_frames(num_samples)


def magnitude(wav: torch.Tensor, spectral: Spectral = MTLAB) -> torch.Tensor:
    """|STFT| of a 1-d signal, shape [T, 129] with mtlab's settings (see :class:`Spectral`)."""
    return spectral.magnitude(wav)


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


MVN_TYPES = ("global", "local", "none")


def local_mvn(features: torch.Tensor) -> torch.Tensor:
    """Per-utterance mean and variance normalization over the frames (the original's ``mvn_type = local``):
    ``(f - mean) / (std + 1e-12)``, the standard deviation without Bessel's correction (numpy's)."""
    return (features - features.mean(dim=0)) / (features.std(dim=0, unbiased=False) + 1e-12)


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
        """Plain lists and numbers (JSON)."""
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "frames": self.frames, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, object], origin: str = "feature stats") -> FeatureStats:
        """The statistics ``to_dict`` wrote."""
        try:
            mean = torch.tensor(data["mean"], dtype=torch.float32)
            std = torch.tensor(data["std"], dtype=torch.float32)
            frames = data["frames"]
            if not isinstance(frames, (int, float, str)):
                raise TypeError(f"frames = {frames!r} is not a number")
            stats = cls(mean, std, int(frames), str(data.get("source", "")))
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
        """Read statistics from a JSON file."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: feature statistics file not found; compute them with mtlab.data.compute_stats")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from err
        return cls.from_dict(data, origin=str(path))
