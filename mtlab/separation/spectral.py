"""STFT in the feature framing and its inverse by weighted overlap-add.

The features use ``center=False`` (no padding), which ``torch.istft`` refuses to invert because the
periodic Hann window is zero at its first sample. :func:`istft` does the overlap-add itself:
``x[n] = Σ_t w[n - t·hop] · irfft(X_t)[n - t·hop] / max(Σ_t w²[n - t·hop], floor)``. Near the two
ends only the windows' tails cover a sample; dividing a MODIFIED spectrum's frames by that tiny
envelope would amplify them without bound, so the envelope is floored at ``ENVELOPE_FLOOR`` × its
maximum: exact inversion everywhere the envelope reaches the floor (all but ~7 ms at each end), a
taper at the ends, and 0 after the last full frame.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.features import HOP_LENGTH, N_FFT, WIN_LENGTH
from ..base.errors import BatchError

ENVELOPE_FLOOR = 0.1


def window(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Tensor:
    """The analysis/synthesis window: periodic Hann of ``WIN_LENGTH`` samples."""
    return torch.hann_window(WIN_LENGTH, dtype=dtype, device=device)


def covered_length(num_frames: int) -> int:
    """Samples covered by ``num_frames`` frames: ``(T - 1) * hop + win``."""
    return (num_frames - 1) * HOP_LENGTH + WIN_LENGTH


def stft(wav: Tensor) -> Tensor:
    """Complex STFT ``[..., T, F]`` of ``wav [..., N]`` with the features' framing (``|stft|`` equals
    ``mtlab.data.magnitude``)."""
    if wav.shape[-1] < WIN_LENGTH:
        raise BatchError(f"stft needs at least {WIN_LENGTH} samples, got shape {tuple(wav.shape)}")
    flat = wav.reshape(-1, wav.shape[-1])
    spec = torch.stft(flat, n_fft=N_FFT, hop_length=HOP_LENGTH, win_length=WIN_LENGTH,
                      window=window(wav.dtype, wav.device), center=False, return_complex=True)
    spec = spec.transpose(-1, -2)
    return spec.reshape(*wav.shape[:-1], *spec.shape[-2:])


def istft(spec: Tensor, length: int | None = None) -> Tensor:
    """Waveforms ``[..., N]`` from complex spectra ``[..., T, F]`` (weighted overlap-add).

    ``length`` pads with zeros (or trims) to N samples; default: the covered length.
    """
    if not spec.is_complex() or spec.dim() < 2 or spec.shape[-1] != N_FFT // 2 + 1:
        raise BatchError(
            f"istft needs complex spectra [..., T, {N_FFT // 2 + 1}], got {spec.dtype} {tuple(spec.shape)}"
        )
    lead, t = spec.shape[:-2], spec.shape[-2]
    w = window(spec.real.dtype, spec.device)
    frames = torch.fft.irfft(spec.reshape(-1, t, spec.shape[-1]), n=N_FFT, dim=-1)[..., :WIN_LENGTH] * w
    total = covered_length(t)
    fold = dict(output_size=(1, total), kernel_size=(1, WIN_LENGTH), stride=(1, HOP_LENGTH))
    x = F.fold(frames.transpose(1, 2), **fold).reshape(-1, total)
    env = F.fold(w.square()[None, :, None].expand(1, WIN_LENGTH, t).contiguous(), **fold).reshape(total)
    x = x / env.clamp_min(ENVELOPE_FLOOR * env.max())
    n = total if length is None else length
    x = F.pad(x, (0, n - total)) if n >= total else x[:, :n]
    return x.reshape(*lead, n)


def apply_masks(mixture: Tensor, masks: Tensor) -> Tensor:
    """Estimated sources ``[S, N]`` from a mixture waveform ``[N]`` and masks ``[T, F, S]``, with the
    mixture's phase. Samples no frame covers are 0."""
    spec = stft(mixture)
    if masks.shape[:2] != spec.shape:
        raise BatchError(
            f"masks {tuple(masks.shape)} do not fit the mixture's STFT {tuple(spec.shape)} (frames, bins); "
            "pass the masks of this utterance without padding"
        )
    est = spec[None] * masks.permute(2, 0, 1).to(spec.real.dtype)
    return istft(est, length=mixture.shape[-1])
