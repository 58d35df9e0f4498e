"""Dynamic mixing: a new training mixture for every example of every epoch, made from the split's sources.

:class:`DynamicMix` wraps a :class:`~mtlab.data.streamed.StreamedSplit`. Example ``i`` of epoch ``e`` is drawn
from a generator seeded by ``(seed, e, i)``: utterance ``i``'s source ``k`` (``k`` drawn) and ``S - 1`` sources
of other speakers drawn from all of the split's source lists (``s1.scp`` ... with their speakers from
``spk.txt``), each cut (or zero-padded) to utterance ``i``'s length at a drawn offset and scaled by a gain drawn
uniformly in ``gain_db``; optionally a noise file from the ``noise`` list (tiled or cut to the length) at an SNR
drawn in ``noise_snr_db`` relative to the sum of the sources. The mixture is exactly the sum of the int16
sources and noise a batch carries, so :meth:`featurize` (the split's) computes every target on the device.

The lengths are utterance ``i``'s (bucketing is unchanged) and nothing but the epoch is state: the stream's
``(epoch, position)`` reproduces and resumes the mixtures exactly. :class:`~mtlab.tasks.sampling.BatchStream`
tells the source its epoch (``set_epoch``) before it collates, in the main process or in its workers.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base.batching import collate
from ..tasks.sources import Skipped
from .audio import SAMPLE_RATE, read_wav_int16
from .errors import DataError
from .source import AudioSplit
from .streamed import StreamedSplit
from .lists import ListEntry, read_list

PEAK = 32000.0  # the largest sample a mixture may reach: gains are lowered together above it (no clipping)
KEYS = ("gain_db", "noise", "noise_snr_db", "seed")


def _range(value: Any, key: str) -> tuple[float, float]:
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and value[0] <= value[1])
    if not ok:
        raise DataError(f"dynamic_mix {key} = {value!r} must be [low, high] in dB with low <= high, e.g. [-5, 5]")
    return float(value[0]), float(value[1])


@dataclass(frozen=True)
class MixSettings:
    """How :class:`DynamicMix` makes its mixtures. ``noise`` is a list file (``name path`` lines) of noise WAVs;
    None mixes without noise."""

    gain_db: tuple[float, float] = (-5.0, 5.0)
    noise: str | None = None
    noise_snr_db: tuple[float, float] = (10.0, 20.0)
    seed: int = 0
    noise_files: tuple[ListEntry, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any] | MixSettings, base: Path | None = None) -> MixSettings:
        """Settings from a recipe table (relative ``noise`` paths from ``base``); bad values raise a
        :class:`DataError` naming the key."""
        if isinstance(spec, MixSettings):
            return spec
        if not isinstance(spec, Mapping):
            raise DataError(f"dynamic_mix = {spec!r} must be a table of {', '.join(KEYS)}")
        unknown = sorted(set(spec) - set(KEYS))
        if unknown:
            raise DataError(f"unknown key(s) {unknown} in dynamic_mix; valid: {', '.join(KEYS)}")
        gain = _range(spec.get("gain_db", cls.gain_db), "gain_db")
        snr = _range(spec.get("noise_snr_db", cls.noise_snr_db), "noise_snr_db")
        seed = spec.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise DataError(f"dynamic_mix seed = {seed!r} must be an integer >= 0")
        noise = spec.get("noise")
        files: tuple[ListEntry, ...] = ()
        if noise is not None:
            if not isinstance(noise, (str, Path)) or not str(noise):
                raise DataError(f"dynamic_mix noise = {noise!r} must be the path of a list of noise WAVs")
            path = Path(noise) if Path(noise).is_absolute() or base is None else base / noise
            if not path.is_file():
                raise DataError(f"dynamic_mix noise = {str(noise)!r}: no such list ({path}); give a file of "
                                "'name path/to/noise.wav' lines")
            files = tuple(read_list(path).values())
            if not files:
                raise DataError(f"dynamic_mix noise = {str(noise)!r}: the list {path} has no entries")
            noise = str(path)
        return cls(gain, noise, snr, int(seed), files)


@dataclass(frozen=True)
class Mixture:
    """One drawn mixture: int16 sources [N, S] and noise [N] (zeros without noise), their sum, and what was drawn."""

    mix: np.ndarray
    sources: np.ndarray
    noise: np.ndarray
    speakers: tuple[int, ...]
    picks: tuple[tuple[int, int], ...]  # (utterance, source list) of each source
    gains_db: tuple[float, ...]


def _fit(wav: np.ndarray, length: int, gen: np.random.Generator) -> np.ndarray:
    """``wav`` cut to ``length`` at a drawn start, or zero-padded around it at a drawn offset."""
    if len(wav) >= length:
        start = int(gen.integers(len(wav) - length + 1))
        return wav[start:start + length]
    out = np.zeros(length, dtype=wav.dtype)
    off = int(gen.integers(length - len(wav) + 1))
    out[off:off + len(wav)] = wav
    return out


class DynamicMix(AudioSplit):
    """A streamed split whose example ``i`` is a new mixture each epoch; see the module docstring.

    Examples:
        >>> split = load_split(split="train", stream=True, targets=[...])  # doctest: +SKIP
        >>> train = DynamicMix(split, MixSettings(gain_db=(-5, 5)))  # doctest: +SKIP
    """

    def __init__(self, split: StreamedSplit, settings: MixSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = MixSettings.from_dict(settings or {})
        m = split.manifest
        if not m.sources or m.speakers is None:
            raise DataError(f"dynamic_mix needs the split's source lists and spk.txt ({split.split}/"
                            f"{split.linkedset}); load it with load_split(..., dynamic_mix=...)")
        if "ivec" in split.featurizer.keys:
            raise DataError("dynamic_mix cannot give 'ivec': the vectors belong to the corpus's mixtures")
        self.base = split
        self.num_sources = len(m.sources)
        self.speaker_ids = np.array([m.speakers.entry(i, m.name(i)).ints(self.num_sources) for i in range(len(m))],
                                    dtype=np.int64).reshape(len(m), self.num_sources)
        if len(np.unique(self.speaker_ids)) < self.num_sources:
            raise DataError(f"dynamic_mix needs at least {self.num_sources} speakers in {m.speakers.path}; it has "
                            f"{len(np.unique(self.speaker_ids))}")
        self.featurizer, self.samples, self.lengths = split.featurizer, split.samples, split.lengths
        self.sequence_keys, self.manifest, self.stats, self.report = split.sequence_keys, m, split.stats, split.report
        self.split, self.linkedset, self.num_speakers = split.split, split.linkedset, split.num_speakers
        self.on_bad_data, self.skipped = split.on_bad_data, split.skipped
        self.epoch = 0

    @property
    def names(self) -> list[str]:
        """The corpus split's utterance names (one new mixture per name and epoch)."""
        return self.base.names

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose mixtures :meth:`audio` draws (set by the stream before it collates)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.base)

    def mixture(self, index: int, epoch: int | None = None) -> Mixture:
        """Mixture ``index`` of ``epoch`` (default: the current one), drawn from ``(seed, epoch, index)``."""
        epoch = self.epoch if epoch is None else int(epoch)
        s, m = self.settings, self.base.manifest
        gen = np.random.Generator(np.random.PCG64([s.seed, epoch, int(index)]))
        length, n_src = int(self.samples[index]), self.num_sources
        flat = self.speaker_ids.reshape(-1)
        first = index * n_src + int(gen.integers(n_src))
        picks = [first]
        for _ in range(n_src - 1):  # other speakers than those drawn so far, from every source list
            free = np.flatnonzero(~np.isin(flat, flat[picks]))
            picks.append(int(free[gen.integers(len(free))]))
        waves = []
        for p in picks:
            row, k = divmod(p, n_src)
            col = m.sources[k]
            wav = read_wav_int16(col.resolved(row), SAMPLE_RATE, origin=col.where(row)).numpy()
            waves.append(_fit(wav.astype(np.float64), length, gen))
        gains = gen.uniform(*s.gain_db, size=n_src)
        scaled = np.stack(waves, axis=-1) * 10 ** (gains / 20)  # [N, S]
        clean = scaled.sum(axis=-1)
        noise = np.zeros(length)
        if s.noise_files:
            entry = s.noise_files[int(gen.integers(len(s.noise_files)))]
            wav = read_wav_int16(entry.resolve(), SAMPLE_RATE, origin=entry.where).numpy().astype(np.float64)
            wav = np.resize(wav, max(length, len(wav)))  # tiled when shorter than the mixture
            wav = _fit(wav, length, gen)
            snr = gen.uniform(*s.noise_snr_db)
            power = float(np.mean(wav**2))
            if power > 0:
                noise = wav * np.sqrt(float(np.mean(clean**2)) / power / 10 ** (snr / 10))
        peak = float(np.abs(clean + noise).max())
        if peak > PEAK:  # scale everything down together: the sum of the rounded parts stays within int16
            scaled, noise = scaled * (PEAK / peak), noise * (PEAK / peak)
        src16 = np.rint(scaled).astype(np.int16)
        noise16 = np.rint(noise).astype(np.int16)
        mix = (src16.astype(np.int32).sum(axis=-1) + noise16).astype(np.int16)
        speakers = tuple(int(flat[p]) for p in picks)
        return Mixture(mix, src16, noise16, speakers, tuple(divmod(p, n_src) for p in picks),
                       tuple(float(g) for g in gains))

    def audio(self, index: int) -> dict[str, torch.Tensor] | Skipped:
        """What a batch carries for example ``index`` (as :meth:`StreamedSplit.audio`): ``mix_wav``, ``src_wav``
        and the speaker ids of the drawn sources."""
        try:
            mixture = self.mixture(index)
        except DataError as err:
            if self.on_bad_data == "skip":
                return Skipped(self.base.manifest.name(index), f"dynamic mixture {index}, epoch {self.epoch}",
                               str(err))
            raise
        out = {"mix_wav": torch.from_numpy(mixture.mix), "src_wav": torch.from_numpy(mixture.sources)}
        keys = self.featurizer.keys
        if "spk" in keys:
            out["spk"] = torch.tensor(mixture.speakers[0], dtype=torch.long)
        if "spk_pair" in keys:
            out["spk_pair"] = torch.tensor(mixture.speakers, dtype=torch.long)
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Example ``index`` of the current epoch with every key computed now (on the CPU)."""
        item = self.audio(index)
        if isinstance(item, Skipped):
            raise DataError(item.reason)
        data, lens = self.featurize(collate([item]), "cpu")
        return {k: v[0, : int(lens[k][0])] if k in lens and v.dim() > 1 else v[0] for k, v in data.items()}

    def __repr__(self) -> str:
        s = self.settings
        noise = f", noise {len(s.noise_files)} files at {list(s.noise_snr_db)} dB SNR" if s.noise_files else ""
        return (f"DynamicMix({self.split}/{self.linkedset}: {len(self)} mixtures per epoch of "
                f"{self.num_sources} sources, gains {list(s.gain_db)} dB{noise}, seed {s.seed})")
