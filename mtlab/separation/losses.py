"""Source-separation loss computers, registered in ``mtlab.losses.LOSSES`` under the original's
``loss_type`` names: ``pit``, ``direct``, ``deepclustering``, ``deepclustering_flat``,
``deepclusteringnoise``, ``deepattractornet`` and ``crossentropy_multi``.

Each returns ``(loss_sum, normalizer)`` as the original's loss computers: the SUM over the minibatch and
what it should be divided by. Per-bin layouts: a tensor with one value per (frame, bin, k) is either
``[B, T, F, K]`` or flat ``[B, T, F * K]`` with index ``f * K + k`` (bin-major, as
``binary_targets`` and the embeddings). The original's PIT/direct read flat mask *logits* speaker-major
(index ``s * F + f``); ``layout="speaker_major"`` reads them that way. Source magnitudes are
``[B, T, F, nrS]``, the mixture magnitude ``[B, T, F]``, ``usedbins`` ``[B, T, F]`` bool.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base.errors import BatchError, ConfigError
from ..losses import LOSSES, ORIGINAL_LOSS_TYPES, LossResult, lengths_for, lookup, time_mask

ACTIVATIONS = ("softmax", "sigmoid", "none")
LAYOUTS = ("bin_major", "speaker_major")


def per_bin(x: Tensor, num_bins: int, what: str, owner: str, layout: str = "bin_major") -> Tensor:
    """``x`` as ``[B, T, F, K]``: 4-d kept; flat ``[B, T, F * K]`` reshaped (index ``f * K + k``, or
    ``k * F + f`` with ``layout="speaker_major"``)."""
    if x.dim() == 4 and x.shape[2] == num_bins:
        return x
    if x.dim() == 3 and x.shape[2] % num_bins == 0:
        b, t, n = x.shape
        if layout == "speaker_major":
            return x.reshape(b, t, n // num_bins, num_bins).transpose(2, 3)
        return x.reshape(b, t, num_bins, n // num_bins)
    raise BatchError(
        f"{owner}: {what} {tuple(x.shape)} is neither [B, T, F, K] nor flat [B, T, F*K] with F = {num_bins} bins; "
        "check the head's num_bins against the features"
    )


def valid_frames(seq_lengths: Mapping[str, Tensor], like: Tensor, *names: str) -> Tensor:
    """``[B, T]`` bool mask of valid frames (all True without sequence lengths)."""
    lengths = lengths_for(seq_lengths, *names)
    if lengths is None:
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    return time_mask(lengths.to(like.device), like.shape[1])


def activate(logits: Tensor, activation: str) -> Tensor:
    """The original's mask functions over the last (speaker) axis: softmax, sigmoid or none."""
    if activation == "softmax":
        return torch.softmax(logits, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    return logits


def _check_choice(owner: str, key: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ConfigError(f"{owner} {key}={value!r}; valid: {list(valid)}")
    return value


_PERMS: dict[tuple[int, str], Tensor] = {}


def permutations(n: int, device: torch.device) -> Tensor:
    """All permutations of ``range(n)`` as a ``[n!, n]`` long tensor (a cached constant, no host reads)."""
    key = (n, str(device))
    if key not in _PERMS:
        _PERMS[key] = torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long, device=device)
    return _PERMS[key]


def min_over_permutations(pairwise: Tensor, permute: bool = True) -> Tensor:
    """Per utterance, min over permutations p of Σ_s pairwise[b, s, p[s]]; [B, S, S] -> [B].
    ``permute=False``: the identity only (Σ_s pairwise[b, s, s])."""
    if not permute:
        return torch.diagonal(pairwise, dim1=1, dim2=2).sum(-1)
    s = pairwise.shape[-1]
    perms = permutations(s, pairwise.device)
    rows = torch.arange(s, device=pairwise.device)[None, :].expand_as(perms)
    return pairwise[:, rows, perms].sum(-1).amin(-1)


class PIT:
    """Utterance-level permutation invariant training (Yu 2017), the original's ``pit``.

    ``masks = activation(logits)`` over the speakers (``softmax`` by default as the original;
    ``sigmoid``; ``none`` when the head already gives masks), then per utterance the minimum over
    speaker permutations of Σ (mask_s × |mixture| − |source_p(s)|)² over valid frames.
    ``normalizer`` = Σ seq_len × nrS × F. ``no_perm=True`` keeps the given order (the original's option).
    """

    permute = True

    def __init__(self, output: str = "masks", target: str = "src_mag", mixture: str = "mix_mag",
                 activation: str = "softmax", layout: str = "bin_major", no_perm: bool = False) -> None:
        self.output = output
        self.target = target
        self.mixture = mixture
        self.activation = _check_choice(type(self).__name__, "activation", activation, ACTIVATIONS)
        self.layout = _check_choice(type(self).__name__, "layout", layout, LAYOUTS)
        self.permute = self.permute and not no_perm

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output={self.output!r}, target={self.target!r}, mixture={self.mixture!r}, "
                f"activation={self.activation!r})")

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        sources = lookup("target", targets, self.target, repr(self))
        mix = lookup("target", targets, self.mixture, repr(self))
        if sources.dim() != 4 or mix.shape != sources.shape[:3]:
            raise BatchError(
                f"{self!r}: needs source magnitudes [B, T, F, nrS] and a mixture [B, T, F]; "
                f"got {tuple(sources.shape)} and {tuple(mix.shape)}"
            )
        logits = per_bin(lookup("output", outputs, self.output, repr(self)), mix.shape[2], "masks", repr(self),
                         self.layout)
        if logits.shape != sources.shape:
            raise BatchError(
                f"{self!r}: masks {tuple(logits.shape)} do not match the sources {tuple(sources.shape)}; "
                "the mask head needs num_sources = nrS and num_bins = F"
            )
        masks = activate(logits, self.activation)
        valid = valid_frames(seq_lengths, masks, self.output, self.target, self.mixture)
        recon = masks * mix.to(masks.dtype)[..., None]
        # pairwise[b, i, j] = Σ over valid (t, f) of (mask_i × mixture − source_j)²
        diff = (recon[..., :, None] - sources.to(masks.dtype)[..., None, :]).pow(2)
        diff = torch.where(valid[:, :, None, None, None], diff, diff.new_zeros(()))
        per_utt = min_over_permutations(diff.sum(dim=(1, 2)), self.permute)
        _, _, f, s = sources.shape
        return per_utt.sum(), valid.sum().to(masks.dtype) * (s * f)


class Direct(PIT):
    """As :class:`PIT` with the speakers in the order given (the original's ``direct``)."""

    permute = False


class DeepClustering:
    """Deep clustering (Hershey 2016), the original's ``deepclustering``:
    ‖VᵀV‖² − 2‖VᵀY‖² + ‖YᵀY‖² per utterance over used bins.

    Equals ‖VVᵀ − YYᵀ‖²_F without forming the (T·F)² affinity matrix. ``V`` are the embeddings
    (``[B, T, F*D]`` or ``[B, T, F, D]``), unit-normalized over D here as in the original (a no-op
    on a unit-norm head); ``Y`` the one-hot ``binary_targets`` (index ``f*nrS + s``). Only valid
    frames' used bins count. ``normalizer`` = Σ_utt (number of used bins)².
    """

    flat_only = False

    def __init__(self, output: str = "emb", target: str = "binary_targets", usedbins: str = "usedbins",
                 normalize: bool = True) -> None:
        self.output = output
        self.target = target
        self.usedbins = usedbins
        self.normalize = normalize

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output={self.output!r}, target={self.target!r}, "
                f"usedbins={self.usedbins!r})")

    def _embeddings(self, outputs: Mapping[str, Tensor], f: int) -> Tensor:
        emb = lookup("output", outputs, self.output, repr(self))
        if self.flat_only and emb.dim() != 4:
            raise BatchError(f"{self!r}: deepclustering_flat needs embeddings [B, T, F, D], got {tuple(emb.shape)}; "
                             "use deepclustering for flat [B, T, F*D] embeddings")
        return per_bin(emb, f, "embeddings", repr(self))

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        used = lookup("target", targets, self.usedbins, repr(self))
        if used.dim() != 3:
            raise BatchError(f"{self!r}: usedbins must be [B, T, F] bool, got {tuple(used.shape)}")
        f = used.shape[2]
        emb = self._embeddings(outputs, f)
        y = per_bin(lookup("target", targets, self.target, repr(self)), f, "binary_targets", repr(self))
        if emb.shape[:3] != used.shape or y.shape[:3] != used.shape:
            raise BatchError(
                f"{self!r}: embeddings {tuple(emb.shape)}, targets {tuple(y.shape)} and usedbins "
                f"{tuple(used.shape)} must share [B, T, F]"
            )
        valid = valid_frames(seq_lengths, emb, self.output, self.usedbins, self.target)
        weight = (used.bool() & valid[:, :, None]).to(emb.dtype)
        loss = affinity_loss(emb, y.to(emb.dtype), weight, self.normalize)
        normalizer = weight.reshape(emb.shape[0], -1).sum(-1).pow(2).sum()
        return loss.sum(), normalizer


class DeepClusteringFlat(DeepClustering):
    """The original's ``deepclustering_flat``: :class:`DeepClustering` on embeddings ``[B, T, F, D]``."""

    flat_only = True


def affinity_loss(emb: Tensor, y: Tensor, weight: Tensor, normalize: bool = True) -> Tensor:
    """Per utterance ‖VᵀV‖² − 2‖VᵀY‖² + ‖YᵀY‖² with V = emb (unit-normalized over D if ``normalize``)
    and Y = y, both scaled per bin by ``weight`` ``[B, T, F]`` (0 drops a bin); returns ``[B]``."""
    if normalize:
        emb = F.normalize(emb, dim=-1, eps=1e-12)
    b = emb.shape[0]
    w = weight[..., None]
    # where(), not a product alone: non-finite values in dropped bins (padding) must not leak in
    v = torch.where(w != 0, emb * w, emb.new_zeros(())).reshape(b, -1, emb.shape[-1])
    yy = torch.where(w != 0, y * w, y.new_zeros(())).reshape(b, -1, y.shape[-1])
    vtv = torch.einsum("bnd,bne->bde", v, v).pow(2).sum(dim=(1, 2))
    vty = torch.einsum("bnd,bns->bds", v, yy).pow(2).sum(dim=(1, 2))
    yty = torch.einsum("bns,bnr->bsr", yy, yy).pow(2).sum(dim=(1, 2))
    return vtv - 2 * vty + yty


class DeepClusteringNoise:
    """The original's ``deepclusteringnoise``: deep clustering on the bins where speech dominates
    (``usedbins`` and not ``noisybins``) plus the squared error of the noise filter ``alpha``
    against the ideal speech ratio on the used bins:

    ``loss = L_dc / max(Σ_utt n_speech², 1) + Σ_used (ratio − alpha)² / Σ usedbins``, ``normalizer = 1``.

    As the original, the result is already a per-minibatch mean (normalizer 1), so accumulated batches
    average the minibatch values instead of dividing one sum; a minibatch without used bins gives
    0 for the noise term here instead of the original's 0/0.
    """

    def __init__(self, output: str = "bin_emb", noise_filter: str = "noise_filter", target: str = "binary_targets",
                 usedbins: str = "usedbins", noisybins: str = "noisybins",
                 ratio: str = "rel_speech_targets") -> None:
        self.output = output
        self.noise_filter = noise_filter
        self.target = target
        self.usedbins = usedbins
        self.noisybins = noisybins
        self.ratio = ratio

    def __repr__(self) -> str:
        return f"DeepClusteringNoise(output={self.output!r}, noise_filter={self.noise_filter!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        used = lookup("target", targets, self.usedbins, repr(self))
        if used.dim() != 3:
            raise BatchError(f"{self!r}: usedbins must be [B, T, F] bool, got {tuple(used.shape)}")
        f = used.shape[2]
        emb = per_bin(lookup("output", outputs, self.output, repr(self)), f, "embeddings", repr(self))
        y = per_bin(lookup("target", targets, self.target, repr(self)), f, "binary_targets", repr(self))
        noisy = lookup("target", targets, self.noisybins, repr(self))
        ratio = lookup("target", targets, self.ratio, repr(self))
        alpha = lookup("output", outputs, self.noise_filter, repr(self))
        for what, x in (("noisybins", noisy), ("ideal ratio", ratio), ("noise filter", alpha)):
            if x.shape != used.shape:
                raise BatchError(f"{self!r}: {what} {tuple(x.shape)} must be [B, T, F] like usedbins {tuple(used.shape)}")
        valid = valid_frames(seq_lengths, emb, self.output, self.usedbins)
        energy = (used.bool() & valid[:, :, None]).to(emb.dtype)
        speech = energy * (1 - noisy.to(emb.dtype))
        dc = affinity_loss(emb, y.to(emb.dtype), speech).sum()
        dc_norm = speech.reshape(emb.shape[0], -1).sum(-1).pow(2).sum().clamp_min(1.0)
        noise = ((ratio.to(emb.dtype) - alpha) * energy).pow(2).sum()
        loss = dc / dc_norm + noise / energy.sum().clamp_min(1.0)
        return loss, emb.new_ones(())


class DeepAttractorNet:
    """Deep attractor network (Chen 2017), the original's ``deepattractornet``.

    V = the embeddings zeroed on unused bins (so those bins get no gradient and a mask of
    ``activation(0)``, 1/nrS with softmax); attractors = mean of V over each speaker's used bins
    (from ``binary_targets``); masks = ``activation`` (softmax over speakers by default) of
    V · attractor; squared error of masks × |mixture| against |sources| over every bin of the valid
    frames. ``normalizer`` = Σ seq_len × nrS × F. Embeddings are not normalized (as the original).
    """

    def __init__(self, output: str = "emb", target: str = "src_mag", partition: str = "binary_targets",
                 mixture: str = "mix_mag", usedbins: str = "usedbins", activation: str = "softmax") -> None:
        self.output = output
        self.target = target
        self.partition = partition
        self.mixture = mixture
        self.usedbins = usedbins
        self.activation = _check_choice("DeepAttractorNet", "activation", activation, ACTIVATIONS)

    def __repr__(self) -> str:
        return (f"DeepAttractorNet(output={self.output!r}, target={self.target!r}, partition={self.partition!r}, "
                f"mixture={self.mixture!r}, usedbins={self.usedbins!r}, activation={self.activation!r})")

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        sources = lookup("target", targets, self.target, repr(self))
        mix = lookup("target", targets, self.mixture, repr(self))
        used = lookup("target", targets, self.usedbins, repr(self))
        if sources.dim() != 4 or mix.shape != sources.shape[:3] or used.shape != mix.shape:
            raise BatchError(
                f"{self!r}: needs sources [B, T, F, nrS], mixture and usedbins [B, T, F]; got "
                f"{tuple(sources.shape)}, {tuple(mix.shape)}, {tuple(used.shape)}"
            )
        f = mix.shape[2]
        emb = per_bin(lookup("output", outputs, self.output, repr(self)), f, "embeddings", repr(self))
        y = per_bin(lookup("target", targets, self.partition, repr(self)), f, "binary_targets", repr(self))
        if y.shape != sources.shape or emb.shape[:3] != mix.shape:
            raise BatchError(f"{self!r}: embeddings {tuple(emb.shape)} / partition {tuple(y.shape)} do not match "
                             f"the sources {tuple(sources.shape)}")
        valid = valid_frames(seq_lengths, emb, self.output, self.target, self.mixture)
        keep = (used.bool() & valid[:, :, None])[..., None]
        v = torch.where(keep, emb, emb.new_zeros(()))  # unused bins: zero embedding, no gradient
        y_used = torch.where(keep, y.to(emb.dtype), emb.new_zeros(()))
        counts = y_used.sum(dim=(1, 2)).clamp_min(1.0)  # [B, S]; an absent speaker gets a zero attractor
        attractors = torch.einsum("btfs,btfd->bsd", y_used, v) / counts[..., None]
        masks = activate(torch.einsum("btfd,bsd->btfs", v, attractors), self.activation)
        err = (masks * mix.to(emb.dtype)[..., None] - sources.to(emb.dtype)).pow(2)
        err = torch.where(valid[:, :, None, None], err, err.new_zeros(()))
        _, _, _, s = sources.shape
        return err.sum(), valid.sum().to(emb.dtype) * (s * f)


class CrossEntropyMulti:
    """The original's ``crossentropy_multi``: speaker-id cross-entropy averaged over the nrS
    speakers, with the minimum over speaker permutations per utterance (``allow_permutation``,
    default True as the original; False keeps the given order).

    ``output`` logits ``[B, nrS, C]`` (or flat ``[B, nrS*C]``, index ``s*C + c``), ``target`` ids
    ``[B, nrS]``. ``loss`` = Σ_utt min_p mean_s CE(logits_s, target_p(s)); ``normalizer`` = batch size.
    """

    def __init__(self, output: str = "spk_logits", target: str = "spk_pair", allow_permutation: bool = True) -> None:
        self.output = output
        self.target = target
        self.allow_permutation = allow_permutation

    def __repr__(self) -> str:
        return (f"CrossEntropyMulti(output={self.output!r}, target={self.target!r}, "
                f"allow_permutation={self.allow_permutation!r})")

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        logits = lookup("output", outputs, self.output, repr(self))
        target = lookup("target", targets, self.target, repr(self))
        if target.dim() != 2:
            raise BatchError(f"{self!r}: target must be speaker ids [B, nrS], got {tuple(target.shape)}")
        b, s = target.shape
        if logits.dim() == 2 and logits.shape[1] % s == 0:
            logits = logits.reshape(b, s, -1)
        if logits.dim() != 3 or logits.shape[:2] != (b, s):
            raise BatchError(f"{self!r}: logits must be [B, nrS, C] or [B, nrS*C] for target {tuple(target.shape)}, "
                             f"got {tuple(logits.shape)}")
        logp = torch.log_softmax(logits, dim=-1)  # [B, S, C]
        # pairwise[b, i, j] = -log p_i(target_j)
        pairwise = -torch.gather(logp, 2, target.long()[:, None, :].expand(b, s, s))
        per_utt = min_over_permutations(pairwise, self.allow_permutation) / s
        return per_utt.sum(), logits.new_full((), float(b))


class Dummy:
    """The original's ``dummy`` loss (``dummy_loss.py``): zero loss, normalizer 1 per minibatch. Its test tasks
    (speaker verification on the outputs) read outputs only; it gives no gradient."""

    def __repr__(self) -> str:
        return "Dummy()"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        like = next(iter(outputs.values()), None)
        if like is None:
            return torch.zeros(()), torch.ones(())
        return like.new_zeros(()), like.new_ones(())


SEPARATION_LOSSES: dict[str, type] = {
    "pit": PIT, "direct": Direct, "deepclustering": DeepClustering, "deepclustering_flat": DeepClusteringFlat,
    "deepclusteringnoise": DeepClusteringNoise, "deepattractornet": DeepAttractorNet,
    "crossentropy_multi": CrossEntropyMulti, "dummy": Dummy, "dummy_loss": Dummy,
}
LOSSES.update(SEPARATION_LOSSES)
ORIGINAL_LOSS_TYPES.update(SEPARATION_LOSSES)
