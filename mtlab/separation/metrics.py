"""SDR and SI-SDR with the best speaker permutation, and their improvement over the mixture.

``sdr`` is the plain signal-to-distortion ratio ``10 log10(‖s‖² / ‖s − ŝ‖²)`` (no BSS-eval
projection filter); ``si_sdr`` is scale-invariant SDR (Le Roux et al. 2019), zero-mean by default.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import BatchError

EPS = 1e-8
Metric = Callable[[Tensor, Tensor], Tensor]


def si_sdr(estimate: Tensor, reference: Tensor, zero_mean: bool = True, eps: float = EPS) -> Tensor:
    """SI-SDR in dB over the last axis, batched over leading axes."""
    if zero_mean:
        estimate = estimate - estimate.mean(-1, keepdim=True)
        reference = reference - reference.mean(-1, keepdim=True)
    alpha = (estimate * reference).sum(-1, keepdim=True) / (reference.square().sum(-1, keepdim=True) + eps)
    target = alpha * reference
    noise = estimate - target
    return 10 * torch.log10((target.square().sum(-1) + eps) / (noise.square().sum(-1) + eps))


def sdr(estimate: Tensor, reference: Tensor, eps: float = EPS) -> Tensor:
    """Plain SDR in dB over the last axis: ``10 log10(‖ref‖² / ‖ref − est‖²)``."""
    return 10 * torch.log10((reference.square().sum(-1) + eps) / ((reference - estimate).square().sum(-1) + eps))


def best_permutation(estimates: Tensor, references: Tensor, metric: Metric = si_sdr) -> tuple[Tensor, tuple[int, ...]]:
    """Scores ``[S]`` of ``estimates [S, N]`` against ``references [S, N]`` under the permutation
    that maximises their sum; ``perm[s]`` is the estimate matched to reference ``s``."""
    if estimates.dim() != 2 or estimates.shape != references.shape:
        raise BatchError(
            f"estimates {tuple(estimates.shape)} and references {tuple(references.shape)} must both be [S, N]"
        )
    s = references.shape[0]
    pair = metric(estimates[:, None, :], references[None, :, :])  # [est, ref]
    perms = list(itertools.permutations(range(s)))
    totals = torch.stack([pair[list(p), list(range(s))].sum() for p in perms])
    best = perms[int(totals.argmax())]
    return pair[list(best), list(range(s))], best


@dataclass(frozen=True)
class SeparationScores:
    """Per-source scores (dB) of one utterance; ``*_mix`` use the mixture as the estimate."""

    si_sdr: Tensor
    si_sdr_mix: Tensor
    sdr: Tensor
    sdr_mix: Tensor
    perm: tuple[int, ...]

    @property
    def si_sdri(self) -> Tensor:
        return self.si_sdr - self.si_sdr_mix

    @property
    def sdri(self) -> Tensor:
        return self.sdr - self.sdr_mix

    def row(self) -> dict[str, float]:
        """Means over the sources as plain floats (for a table)."""
        return {"si_sdr": float(self.si_sdr.mean()), "si_sdr_mix": float(self.si_sdr_mix.mean()),
                "si_sdri": float(self.si_sdri.mean()), "sdr": float(self.sdr.mean()),
                "sdr_mix": float(self.sdr_mix.mean()), "sdri": float(self.sdri.mean())}


def score(estimates: Tensor, references: Tensor, mixture: Tensor) -> SeparationScores:
    """SI-SDR and SDR of the estimates (best permutation by SI-SDR) and of the mixture as baseline."""
    n = min(estimates.shape[-1], references.shape[-1], mixture.shape[-1])
    est, ref, mix = estimates[..., :n].double(), references[..., :n].double(), mixture[..., :n].double()
    si, perm = best_permutation(est, ref, si_sdr)
    matched = est[list(perm)]
    mix_rep = mix.expand_as(ref)
    return SeparationScores(si_sdr=si, si_sdr_mix=si_sdr(mix_rep, ref), sdr=sdr(matched, ref),
                            sdr_mix=sdr(mix_rep, ref), perm=perm)
