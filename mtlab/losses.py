"""Loss computers: ``loss(targets, outputs, seq_lengths) -> (loss_sum, norm)``.

Any callable with that signature works. ``loss_sum`` is the SUM over the minibatch and
``norm`` what it should be divided by (frames, elements, utterances); both are scalar tensors.
Summing here and dividing once at the accumulation boundary makes accumulated gradients exact
whatever the minibatch lengths. Nothing here reads a value back to the host.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import BatchError

LossResult = tuple[Tensor, Tensor]


def time_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``[B, max_len]`` bool mask, True on valid frames."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def _lookup(kind: str, where: Mapping[str, Tensor], name: str, owner: str) -> Tensor:
    if name not in where:
        raise BatchError(f"{owner}: no {kind} named {name!r}; available {kind}s: {sorted(where)}")
    return where[name]


def _lengths_for(seq_lengths: Mapping[str, Tensor], *names: str) -> Tensor | None:
    for name in names:
        if name in seq_lengths:
            return seq_lengths[name]
    return None


class CrossEntropy:
    """Softmax cross-entropy.

    Frame level when the target has a time axis (``target [B, T]``, ``output [B, T, C]``):
    padded frames are masked and ``norm`` is the number of valid frames. Utterance level when
    the target has no time axis (``target [B]``, ``output [B, C]``): ``norm`` is the batch size.
    """

    def __init__(self, output: str, target: str) -> None:
        self.output = output
        self.target = target

    def __repr__(self) -> str:
        return f"CrossEntropy(output={self.output!r}, target={self.target!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        logits = _lookup("output", outputs, self.output, repr(self))
        target = _lookup("target", targets, self.target, repr(self))
        if target.dim() == 1:
            if logits.dim() != 2 or logits.shape[0] != target.shape[0]:
                raise BatchError(
                    f"{self!r}: utterance-level target {tuple(target.shape)} needs output [B, C], "
                    f"got {tuple(logits.shape)}"
                )
            loss = F.cross_entropy(logits, target.long(), reduction="sum")
            return loss, logits.new_full((), float(target.shape[0]))
        if target.dim() != 2 or logits.dim() != 3 or logits.shape[:2] != target.shape:
            raise BatchError(
                f"{self!r}: frame-level target [B, T] needs output [B, T, C] with the same B and T; "
                f"got target {tuple(target.shape)} and output {tuple(logits.shape)}"
            )
        lengths = _lengths_for(seq_lengths, self.target, self.output)
        per_frame = F.cross_entropy(logits.transpose(1, 2), target.long(), reduction="none")
        if lengths is None:
            return per_frame.sum(), logits.new_full((), float(per_frame.numel()))
        mask = time_mask(lengths, target.shape[1])
        loss = torch.where(mask, per_frame, per_frame.new_zeros(())).sum()
        return loss, mask.sum().to(logits.dtype)


class MSE:
    """Summed squared error over valid frames; ``norm`` is the number of valid elements."""

    def __init__(self, output: str, target: str) -> None:
        self.output = output
        self.target = target

    def __repr__(self) -> str:
        return f"MSE(output={self.output!r}, target={self.target!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        out = _lookup("output", outputs, self.output, repr(self))
        target = _lookup("target", targets, self.target, repr(self))
        if out.shape != target.shape:
            raise BatchError(
                f"{self!r}: output {tuple(out.shape)} and target {tuple(target.shape)} differ in shape"
            )
        sq = (out - target.to(out.dtype)).pow(2)
        lengths = _lengths_for(seq_lengths, self.target, self.output)
        if out.dim() < 2 or lengths is None:
            return sq.sum(), out.new_full((), float(sq.numel()))
        mask = time_mask(lengths, out.shape[1])
        per_frame = sq.reshape(out.shape[0], out.shape[1], -1).sum(-1)
        loss = torch.where(mask, per_frame, per_frame.new_zeros(())).sum()
        elems_per_frame = sq[0, 0].numel()
        return loss, mask.sum().to(out.dtype) * elems_per_frame


# Loss computers by the original's ``loss_type`` strings (recipes choose them by name).
LOSSES: dict[str, type] = {"crossentropy": CrossEntropy, "mse": MSE}


def get_loss(name: str, **settings: object) -> object:
    """``get_loss("crossentropy", output="logits", target="y")``; unknown names list the valid ones."""
    from .registry import build

    return build("loss", LOSSES, name.lower(), settings)


# ---------------------------------------------------------------------------------------------
# Source separation (the original's ops.py loss computers).
#
# Per-bin layouts: a tensor with one value per (frame, bin, k) is either ``[B, T, F, K]`` or the
# original's flat ``[B, T, F * K]`` with index ``f * K + k`` (as ``binary_targets``). Masks have
# K = nrS (speakers), embeddings K = D (embedding size). Source magnitudes are ``[B, T, F, nrS]``,
# the mixture magnitude ``[B, T, F]``, ``usedbins`` ``[B, T, F]`` bool.
# ---------------------------------------------------------------------------------------------


def per_bin(x: Tensor, num_bins: int, what: str, owner: str) -> Tensor:
    """``x`` as ``[B, T, F, K]``: 4-d kept, flat ``[B, T, F * K]`` (index ``f * K + k``) reshaped."""
    if x.dim() == 4 and x.shape[2] == num_bins:
        return x
    if x.dim() == 3 and x.shape[2] % num_bins == 0:
        return x.reshape(x.shape[0], x.shape[1], num_bins, x.shape[2] // num_bins)
    raise BatchError(
        f"{owner}: {what} {tuple(x.shape)} is neither [B, T, F, K] nor flat [B, T, F*K] with F = {num_bins} bins; "
        "check the head's num_bins against the features"
    )


def _valid_frames(seq_lengths: Mapping[str, Tensor], like: Tensor, *names: str) -> Tensor:
    """``[B, T]`` bool mask of valid frames (all True without sequence lengths)."""
    lengths = _lengths_for(seq_lengths, *names)
    if lengths is None:
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    return time_mask(lengths.to(like.device), like.shape[1])


def _pairwise_errors(masks: Tensor, mix: Tensor, sources: Tensor, valid: Tensor) -> Tensor:
    """``E[b, i, j]`` = Σ over valid (t, f) of (mask_i × mixture − source_j)²; shape [B, S, S]."""
    recon = masks * mix[..., None]
    diff = (recon[..., :, None] - sources[..., None, :]).pow(2)
    diff = torch.where(valid[:, :, None, None, None], diff, diff.new_zeros(()))
    return diff.sum(dim=(1, 2))


_PERMS: dict[tuple[int, str], Tensor] = {}


def _permutations(n: int, device: torch.device) -> Tensor:
    """All permutations of ``range(n)`` as a ``[n!, n]`` long tensor (a cached constant, no host reads)."""
    import itertools

    key = (n, str(device))
    if key not in _PERMS:
        _PERMS[key] = torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long, device=device)
    return _PERMS[key]


def _min_over_permutations(pairwise: Tensor) -> Tensor:
    """Per utterance, min over permutations p of Σ_s pairwise[b, s, p[s]]; [B, S, S] -> [B]."""
    s = pairwise.shape[-1]
    perms = _permutations(s, pairwise.device)
    rows = torch.arange(s, device=pairwise.device)[None, :].expand_as(perms)
    return pairwise[:, rows, perms].sum(-1).amin(-1)


class _MaskLoss:
    """Shared part of PIT and Direct: masks × mixture against the source magnitudes."""

    permute = True

    def __init__(self, output: str = "masks", target: str = "src_mag", mixture: str = "mix_mag") -> None:
        self.output = output
        self.target = target
        self.mixture = mixture

    def __repr__(self) -> str:
        return f"{type(self).__name__}(output={self.output!r}, target={self.target!r}, mixture={self.mixture!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        sources = _lookup("target", targets, self.target, repr(self))
        mix = _lookup("target", targets, self.mixture, repr(self))
        if sources.dim() != 4 or mix.shape != sources.shape[:3]:
            raise BatchError(
                f"{self!r}: needs source magnitudes [B, T, F, nrS] and a mixture [B, T, F]; "
                f"got {tuple(sources.shape)} and {tuple(mix.shape)}"
            )
        masks = per_bin(_lookup("output", outputs, self.output, repr(self)), mix.shape[2], "masks", repr(self))
        if masks.shape != sources.shape:
            raise BatchError(
                f"{self!r}: masks {tuple(masks.shape)} do not match the sources {tuple(sources.shape)}; "
                "the mask head needs num_sources = nrS and num_bins = F"
            )
        valid = _valid_frames(seq_lengths, masks, self.target, self.mixture, self.output)
        pairwise = _pairwise_errors(masks, mix.to(masks.dtype), sources.to(masks.dtype), valid)
        if self.permute:
            per_utt = _min_over_permutations(pairwise)
        else:
            per_utt = torch.diagonal(pairwise, dim1=1, dim2=2).sum(-1)
        _, _, f, s = sources.shape
        norm = valid.sum().to(masks.dtype) * (s * f)
        return per_utt.sum(), norm


class PIT(_MaskLoss):
    """Utterance-level permutation invariant training (Yu 2017).

    Per utterance: min over speaker permutations of Σ (mask_s × |mixture| − |source_p(s)|)² over
    valid frames. ``norm`` = Σ seq_len × nrS × F. Masks ``[B, T, F, nrS]`` or flat ``[B, T, F*nrS]``.
    """

    permute = True


class Direct(_MaskLoss):
    """As :class:`PIT` with the speakers in the order given (no permutation)."""

    permute = False


class DeepClustering:
    """Deep clustering (Hershey 2016): ‖VᵀV‖² − 2‖VᵀY‖² + ‖YᵀY‖² per utterance over used bins.

    Equals ‖VVᵀ − YYᵀ‖²_F without forming the (T·F)² affinity matrix. ``V`` are the embeddings
    (``[B, T, F*D]`` or ``[B, T, F, D]``), unit-normalized over D here as in the original (a no-op
    on a unit-norm head); ``Y`` the one-hot ``binary_targets`` (index ``f*nrS + s``). Only valid
    frames' used bins count. ``norm`` = Σ_utt (number of used bins)².
    """

    def __init__(self, output: str = "emb", target: str = "binary_targets", usedbins: str = "usedbins",
                 normalize: bool = True) -> None:
        self.output = output
        self.target = target
        self.usedbins = usedbins
        self.normalize = normalize

    def __repr__(self) -> str:
        return f"DeepClustering(output={self.output!r}, target={self.target!r}, usedbins={self.usedbins!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        used = _lookup("target", targets, self.usedbins, repr(self))
        if used.dim() != 3:
            raise BatchError(f"{self!r}: usedbins must be [B, T, F] bool, got {tuple(used.shape)}")
        f = used.shape[2]
        emb = per_bin(_lookup("output", outputs, self.output, repr(self)), f, "embeddings", repr(self))
        y = per_bin(_lookup("target", targets, self.target, repr(self)), f, "binary_targets", repr(self))
        if emb.shape[:3] != used.shape or y.shape[:3] != used.shape:
            raise BatchError(
                f"{self!r}: embeddings {tuple(emb.shape)}, targets {tuple(y.shape)} and usedbins "
                f"{tuple(used.shape)} must share [B, T, F]"
            )
        if self.normalize:
            emb = F.normalize(emb, dim=-1, eps=1e-12)
        valid = _valid_frames(seq_lengths, emb, self.usedbins, self.target, self.output)
        keep = (used.bool() & valid[:, :, None])[..., None]
        b = emb.shape[0]
        v = torch.where(keep, emb, emb.new_zeros(())).reshape(b, -1, emb.shape[-1])
        yy = torch.where(keep, y.to(emb.dtype), emb.new_zeros(())).reshape(b, -1, y.shape[-1])
        vtv = torch.einsum("bnd,bne->bde", v, v).pow(2).sum(dim=(1, 2))
        vty = torch.einsum("bnd,bns->bds", v, yy).pow(2).sum(dim=(1, 2))
        yty = torch.einsum("bns,bnr->bsr", yy, yy).pow(2).sum(dim=(1, 2))
        loss = (vtv - 2 * vty + yty).sum()
        norm = keep.reshape(b, -1).sum(-1).to(emb.dtype).pow(2).sum()
        return loss, norm


class DeepAttractorNet:
    """Deep attractor network (Chen 2017): attractors = mean embedding of each speaker's used bins
    (from ``binary_targets``), masks = softmax over speakers of embedding · attractor, squared
    error of masks × |mixture| against |sources| over valid frames. ``norm`` = Σ seq_len × nrS × F.
    """

    def __init__(self, output: str = "emb", target: str = "src_mag", partition: str = "binary_targets",
                 mixture: str = "mix_mag", usedbins: str = "usedbins") -> None:
        self.output = output
        self.target = target
        self.partition = partition
        self.mixture = mixture
        self.usedbins = usedbins

    def __repr__(self) -> str:
        return (f"DeepAttractorNet(output={self.output!r}, target={self.target!r}, partition={self.partition!r}, "
                f"mixture={self.mixture!r}, usedbins={self.usedbins!r})")

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        sources = _lookup("target", targets, self.target, repr(self))
        mix = _lookup("target", targets, self.mixture, repr(self))
        used = _lookup("target", targets, self.usedbins, repr(self))
        if sources.dim() != 4 or mix.shape != sources.shape[:3] or used.shape != mix.shape:
            raise BatchError(
                f"{self!r}: needs sources [B, T, F, nrS], mixture and usedbins [B, T, F]; got "
                f"{tuple(sources.shape)}, {tuple(mix.shape)}, {tuple(used.shape)}"
            )
        f = mix.shape[2]
        emb = per_bin(_lookup("output", outputs, self.output, repr(self)), f, "embeddings", repr(self))
        y = per_bin(_lookup("target", targets, self.partition, repr(self)), f, "binary_targets", repr(self))
        if y.shape != sources.shape or emb.shape[:3] != mix.shape:
            raise BatchError(f"{self!r}: embeddings {tuple(emb.shape)} / partition {tuple(y.shape)} do not match "
                             f"the sources {tuple(sources.shape)}")
        valid = _valid_frames(seq_lengths, emb, self.target, self.mixture, self.output)
        keep = (used.bool() & valid[:, :, None])[..., None]
        y_used = torch.where(keep, y.to(emb.dtype), emb.new_zeros(()))
        counts = y_used.sum(dim=(1, 2)).clamp_min(1.0)  # [B, S]; an absent speaker gets a zero attractor
        attractors = torch.einsum("btfs,btfd->bsd", y_used, emb) / counts[..., None]
        masks = torch.softmax(torch.einsum("btfd,bsd->btfs", emb, attractors), dim=-1)
        err = (masks * mix.to(emb.dtype)[..., None] - sources.to(emb.dtype)).pow(2)
        err = torch.where(valid[:, :, None, None], err, err.new_zeros(()))
        _, _, _, s = sources.shape
        return err.sum(), valid.sum().to(emb.dtype) * (s * f)


class CrossEntropyMulti:
    """Speaker-id cross-entropy with the minimum over speaker permutations, per utterance.

    ``output`` logits ``[B, nrS, C]`` (or flat ``[B, nrS*C]``, index ``s*C + c``), ``target`` ids
    ``[B, nrS]``. ``norm`` = batch size.
    """

    def __init__(self, output: str = "spk_logits", target: str = "spk_pair") -> None:
        self.output = output
        self.target = target

    def __repr__(self) -> str:
        return f"CrossEntropyMulti(output={self.output!r}, target={self.target!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        logits = _lookup("output", outputs, self.output, repr(self))
        target = _lookup("target", targets, self.target, repr(self))
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
        return _min_over_permutations(pairwise).sum(), logits.new_full((), float(b))


LOSSES.update({
    "pit": PIT, "direct": Direct, "deepclustering": DeepClustering,
    "deepattractornet": DeepAttractorNet, "crossentropy_multi": CrossEntropyMulti,
})
