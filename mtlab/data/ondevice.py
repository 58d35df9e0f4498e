"""Features and targets of a whole padded batch of audio, computed where the model trains.

:class:`Featurizer` turns a collated batch of int16 audio (``mix_wav`` [B, N], ``src_wav`` [B, N, S], with the
samples per utterance in ``seq_lengths``) into the keys :func:`mtlab.data.load_split` precomputes per utterance
(``features``, ``mix_mag``, ``usedbins``, ``src_mag``, ``binary_targets``, ``frame_target``), on ``device``, with
the same :class:`~mtlab.data.features.Spectral` settings. Per-utterance reductions (the loudest bin of
``usedbins``, the loudest frame of ``frame_target``, ``mvn = "local"``) are taken over each utterance's own
frames, and every frame past an utterance's end is zero, as collating the precomputed examples pads them, so the
result equals the precomputed batch (to float rounding of the batched FFT).

A batch may carry ``segment`` [B, 2] (first frame, frames): the utterance's features are computed whole (its
per-utterance reductions need all of it) and then cut, as :class:`mtlab.tasks.sources.SegmentedExamples` cuts
precomputed examples.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from . import features as F
from .errors import DataError

AUDIO_KEYS = ("mix_wav", "src_wav", "input_wav")
Batch = tuple[dict[str, Tensor], dict[str, Tensor]]


def batched_magnitude(wav: Tensor, samples: Tensor, spectral: F.Spectral) -> Tensor:
    """|STFT| of a zero-padded batch ``wav`` [B, N] (float), ``samples`` [B] valid samples each: [B, T, F] with
    ``T = spectral.num_frames(max(samples))``. Frames of a row past its own count read zeros past its end, as the
    per-utterance framing pads; they are not masked here."""
    frames = spectral.num_frames(int(samples.max()))
    x = wav * spectral.sample_scale if spectral.sample_scale != 1.0 else wav
    if spectral.preemph:
        x = torch.cat([x[:, :1], x[:, 1:] - spectral.preemph * x[:, :-1]], dim=1)
        # the per-utterance path pads after pre-emphasis: nothing of the filter may leak past a row's end
        x = x * (torch.arange(x.shape[1], device=x.device) < samples.to(x.device)[:, None])
    needed = (frames - 1) * spectral.hop_length + spectral.win_length
    x = x[:, :needed] if x.shape[1] >= needed else torch.nn.functional.pad(x, (0, needed - x.shape[1]))
    spec = torch.stft(x, n_fft=spectral.n_fft, hop_length=spectral.hop_length, win_length=spectral.win_length,
                      window=F.window(spectral.window, spectral.win_length, x.dtype).to(x.device), center=False,
                      return_complex=True)
    return spec.abs().transpose(1, 2)


@dataclass(frozen=True)
class Featurizer:
    """What a linked set computes from its audio: target keys, STFT, statistics and normalization."""

    keys: frozenset[str]
    spectral: F.Spectral
    stats: F.FeatureStats | None
    threshold_db: float = F.USEDBINS_THRESHOLD_DB
    mvn: str = "global"
    inputs: tuple[str, ...] = ()  # keys of ``input_wav``'s columns: other audio featurized as the mixture

    def input_features(self, wav: Tensor, frames: int, where: str = "") -> Tensor:
        """Features [T, F] of one utterance of another input's audio (float samples in [-1, 1]), normalized as
        the mixture's are (per utterance, or not at all: such inputs have no statistics of their own)."""
        if self.mvn == "global":
            raise DataError(f"{where}: other inputs' features need mvn 'local' or 'none' (no statistics of theirs)")
        feats = F.log_magnitude(F.magnitude(wav.float(), self.spectral))
        if feats.shape[0] != frames:
            raise DataError(f"{where}: {feats.shape[0]} frames, its mixture has {frames}; an input's audio must "
                            "match the mixture sample for sample")
        return F.local_mvn(feats) if self.mvn == "local" else feats

    def __call__(self, batch: Batch, device: torch.device | str | None = None) -> Batch:
        """The batch with its audio replaced by features and targets, on ``device`` (default: where it is)."""
        data, lens = dict(batch[0]), dict(batch[1])
        device = torch.device(device) if device is not None else data["mix_wav"].device
        samples = lens.pop("mix_wav")
        frames = torch.tensor([self.spectral.num_frames(int(n)) for n in samples], dtype=torch.long)
        mask = (torch.arange(int(frames.max())) < frames[:, None]).to(device, non_blocking=True)  # [B, T]
        mix = data.pop("mix_wav").to(device, non_blocking=True).float() / F.INT16_SCALE
        mix_mag = batched_magnitude(mix, samples, self.spectral)
        feats = F.log_magnitude(mix_mag)
        m3 = mask[:, :, None]
        if self.mvn == "local":
            feats = _local_mvn(feats, m3, frames)
        elif self.mvn == "global" and self.stats is not None:
            feats = (feats - self.stats.mean.to(device)) / self.stats.std.to(device)
        out: dict[str, Tensor] = {"features": feats * m3}
        if "input_wav" in data:  # other inputs' audio [B, N, E]: features as the mixture's, normalized the same way
            other = data.pop("input_wav").to(device, non_blocking=True).float() / F.INT16_SCALE
            b, n, e = other.shape
            mags = batched_magnitude(other.permute(0, 2, 1).reshape(b * e, n), samples.repeat_interleave(e),
                                     self.spectral)
            logs = F.log_magnitude(mags).reshape(b, e, *mags.shape[1:])
            for k, key in enumerate(self.inputs):
                out[key] = (_local_mvn(logs[:, k], m3, frames) if self.mvn == "local" else logs[:, k]) * m3
            lens.pop("input_wav", None)
        if "mix_mag" in self.keys:
            out["mix_mag"] = mix_mag * m3
        if "usedbins" in self.keys:
            level = 20 * mix_mag.clamp_min(F.LOG_FLOOR).log10()
            top = level.masked_fill(~m3, -torch.inf).amax(dim=(1, 2), keepdim=True)
            out["usedbins"] = (level > top - self.threshold_db) & m3
        if "src_wav" in data:
            src = data.pop("src_wav").to(device, non_blocking=True).float() / F.INT16_SCALE  # [B, N, S]
            b, n, s = src.shape
            mags = batched_magnitude(src.permute(0, 2, 1).reshape(b * s, n), samples.repeat_interleave(s),
                                     self.spectral)
            src_mag = mags.reshape(b, s, *mags.shape[1:]).permute(0, 2, 3, 1)  # [B, T, F, S]
            if "src_mag" in self.keys:
                out["src_mag"] = src_mag * mask[:, :, None, None]
            if "binary_targets" in self.keys:
                dom = torch.nn.functional.one_hot(src_mag.argmax(dim=-1), s).to(src_mag.dtype)
                out["binary_targets"] = dom.reshape(b, dom.shape[1], -1) * m3
            if "frame_target" in self.keys:
                energy = src_mag.square().sum(dim=2)  # [B, T, S]
                level = 10 * energy.clamp_min(F.LOG_FLOOR**2).log10()
                top = level.masked_fill(~m3, -torch.inf).amax(dim=(1, 2))
                active = (level.max(dim=2).values > top[:, None] - self.threshold_db) & mask
                out["frame_target"] = torch.where(active, energy.argmax(dim=2) + 1, 0)
            for key in [k for k in out if k != "features"]:
                lens.pop(key, None)
        for key in out:
            lens[key] = frames
        segment = data.pop("segment", None)
        lens.pop("segment", None)
        if segment is not None:
            out = _cut(out, segment.to(device), int(segment[:, 1].max()))
            for key in out:
                lens[key] = segment[:, 1].to(torch.long)
        rest = {k: v.to(device, non_blocking=True) for k, v in data.items()}
        return {**out, **rest}, {k: lens[k] for k in [*out, *rest]}


def _local_mvn(feats: Tensor, m3: Tensor, frames: Tensor) -> Tensor:
    """Per-utterance mean and variance normalization over each row's own frames (``m3`` [B, T, 1] marks them)."""
    n = frames.to(feats.device)[:, None, None].to(feats.dtype)
    mean = (feats * m3).sum(dim=1, keepdim=True) / n
    std = (((feats - mean) * m3).square().sum(dim=1, keepdim=True) / n).sqrt()
    return (feats - mean) / (std + 1e-12)


def _cut(out: dict[str, Tensor], segment: Tensor, width: int) -> dict[str, Tensor]:
    """Frames ``segment[b, 0] ... + segment[b, 1]`` of every row, zero past each row's count."""
    idx = segment[:, :1] + torch.arange(width, device=segment.device)  # [B, W]
    keep = torch.arange(width, device=segment.device) < segment[:, 1:2]
    idx = torch.where(keep, idx, 0)
    cut = {}
    for key, value in out.items():
        shape = (*idx.shape, *value.shape[2:])
        gathered = value.gather(1, idx.reshape(*idx.shape, *([1] * (value.dim() - 2))).expand(shape))
        row = keep.reshape(*keep.shape, *([1] * (value.dim() - 2)))
        cut[key] = gathered & row if value.dtype == torch.bool else gathered * row
    return cut
