"""More training mixtures from the same sources: pair the sources of different training utterances.

The sample corpus has 120 training mixtures; a BLSTM memorizes them within a few hundred steps (train
SI-SDRi keeps rising while dev stays flat). Remixing pairs every source with new interferers, as the
corpus itself was made (README of data_samples): two different speakers, the main one 0-5 dB louder
(RMS over the active part), the shorter one at a random offset, and for the ``noisy`` linked set white
Gaussian noise at 10 dB SNR relative to the clean mixture. Only the TRAINING split's sources are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data import features as feat
from ..data import SAMPLE_RATE, read_list, read_wav
from ..data.corpus import data_samples_dir
from ..data.source import Split
from ..base.errors import ConfigError

SIR_DB = (0.0, 5.0)
NOISY_SNR_DB = 10.0


def _active(wav: Tensor) -> Tensor:
    nz = torch.nonzero(wav.abs() > 1e-4)
    return wav[int(nz[0]): int(nz[-1]) + 1] if len(nz) else wav


def _rms(wav: Tensor) -> Tensor:
    return wav.square().mean().sqrt().clamp_min(1e-8)


def source_pool(root: str | Path | None = None, split: str = "train") -> list[tuple[Tensor, int]]:
    """Every source waveform of ``split`` (trimmed to its active part) with its speaker id."""
    folder = (Path(root) if root is not None else data_samples_dir()) / split
    speakers = read_list(folder / "spk.txt")
    pool = []
    for k in (1, 2):
        for name, entry in read_list(folder / f"s{k}.scp").items():
            if name in speakers:
                pool.append((_active(read_wav(entry.resolve(), origin=entry.where)), speakers[name].ints(2)[k - 1]))
    return pool


class RemixedSet(Split):
    """The training examples of ``base`` (a ``load_split`` dataset: its ``stats`` normalize the new
    features) followed by ``count`` remixed ones, built on access (no memory held; deterministic per
    index and seed), with the keys ``keys`` (default: ``base``'s).

    ``lengths`` is known up front, so length bucketing works without building any example.
    """

    def __init__(self, base: Any, count: int, linkedset: str = "clean", seed: int = 0,
                 keys: Sequence[str] | None = None, root: str | Path | None = None, max_seconds: float = 3.0,
                 usedbins_db: float = feat.USEDBINS_THRESHOLD_DB) -> None:
        if linkedset not in ("clean", "noisy"):
            raise ConfigError(f"remixing knows the linked sets 'clean' and 'noisy', not {linkedset!r}")
        self.base, self.count, self.linkedset, self.seed = base, int(count), linkedset, int(seed)
        self.usedbins_db = float(usedbins_db)
        self.stats: feat.FeatureStats = base.stats
        self.keys = tuple(keys) if keys is not None else tuple(base[0])
        self.pool = source_pool(root)
        if len({spk for _, spk in self.pool}) < 2:
            raise ConfigError("remixing needs sources of at least two speakers in the training split")
        self.plan = self._plan(int(max_seconds * SAMPLE_RATE))
        self.lengths = [int(x) for x in base.lengths] + [feat.num_frames(p[-1]) for p in self.plan]

    def _plan(self, max_len: int) -> list[tuple[int, int, float, int, int, int]]:
        """Per remixed example: (source a, source b, SIR dB, offset a, offset b, samples)."""
        gen = torch.Generator().manual_seed(self.seed)
        plan: list[tuple[int, int, float, int, int, int]] = []
        while len(plan) < self.count:
            i, j = torch.randint(len(self.pool), (2,), generator=gen).tolist()
            (a, spk_a), (b, spk_b) = self.pool[i], self.pool[j]
            n = min(max(len(a), len(b)), max_len)
            if spk_a == spk_b or n < feat.WIN_LENGTH:
                continue
            sir = SIR_DB[0] + (SIR_DB[1] - SIR_DB[0]) * float(torch.rand((), generator=gen))
            offs = [int(torch.randint(max(n - len(w), 0) + 1, (), generator=gen)) for w in (a, b)]
            plan.append((i, j, sir, offs[0], offs[1], n))
        return plan

    def __len__(self) -> int:
        return len(self.base) + self.count

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        if index < len(self.base):
            example = self.base[index]
            return {k: example[k] for k in self.keys}
        i, j, sir, off_a, off_b, n = self.plan[index - len(self.base)]
        (a, spk_a), (b, spk_b) = self.pool[i], self.pool[j]
        b = b * (_rms(a) / _rms(b) / 10 ** (sir / 20))
        srcs = torch.zeros(2, n)
        for row, (wav, off) in enumerate(((a, off_a), (b, off_b))):
            wav = wav[: n - off]
            srcs[row, off:off + len(wav)] = wav
        mix = srcs.sum(0)
        peak = float(mix.abs().max())
        if peak > 0.95:
            srcs, mix = srcs * (0.95 / peak), mix * (0.95 / peak)
        if self.linkedset == "noisy":
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            noise_std = mix.square().mean().sqrt() / 10 ** (NOISY_SNR_DB / 20)
            mix = mix + torch.randn(n, generator=gen) * noise_std
        return _example(mix, srcs, spk_a, spk_b, self.stats, self.keys, self.usedbins_db)


def _example(mix: Tensor, srcs: Tensor, spk_a: int, spk_b: int, stats: feat.FeatureStats,
             keys: Sequence[str], usedbins_db: float = feat.USEDBINS_THRESHOLD_DB) -> dict[str, Tensor]:
    """The example keys ``keys`` of a mixture and its two sources (only what is asked is computed)."""
    mix_mag = feat.magnitude(mix)
    out = {"features": stats.normalize(feat.log_magnitude(mix_mag)), "mix_mag": mix_mag,
           "spk": torch.tensor(spk_a, dtype=torch.long), "spk_pair": torch.tensor([spk_a, spk_b], dtype=torch.long)}
    if "usedbins" in keys:
        out["usedbins"] = feat.used_bins(mix_mag, usedbins_db)
    if {"src_mag", "binary_targets", "frame_target"} & set(keys):
        src_mag = torch.stack([feat.magnitude(s) for s in srcs], dim=-1)
        out["src_mag"] = src_mag
        out["binary_targets"] = feat.binary_targets(src_mag)
        out["frame_target"] = feat.frame_target(src_mag, feat.USEDBINS_THRESHOLD_DB)
    missing = sorted(set(keys) - set(out))
    if missing:
        raise ConfigError(f"remixed examples cannot provide {missing}; they have {sorted(out)}")
    return {k: out[k] for k in keys}

