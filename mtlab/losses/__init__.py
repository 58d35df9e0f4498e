"""Loss computers: ``loss(targets, outputs, seq_lengths) -> (loss_sum, norm)``.

Any callable with that signature works. ``loss_sum`` is the SUM over the minibatch and
``norm`` what it should be divided by (frames, elements, utterances); both are scalar tensors.
Summing here and dividing once at the accumulation boundary makes accumulated gradients exact
whatever the minibatch lengths. Nothing here reads a value back to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base.errors import BatchError
from ..base.frames import frame_mask
from ..base.registry import Registry, build

LossResult = tuple[Tensor, Tensor]
IGNORE_INDEX = -100  # target value of padded frames in the frame cross-entropy (torch's default ignore_index)


def time_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``[B, max_len]`` bool mask, True on valid frames: made once per lengths tensor (``collate`` makes it with
    the batch) and kept with it (``mtlab.base.frames``); read it, do not change it in place."""
    return frame_mask(lengths, max_len).valid


def lookup(kind: str, where: Mapping[str, Tensor], name: str, owner: object) -> Tensor:
    """``where[name]``; a missing name is a BatchError listing the available ones. ``owner`` (a loss
    computer, or its description) names the caller, formatted only on error: this runs per minibatch."""
    value = where.get(name)
    if value is None:
        who = owner if isinstance(owner, str) else repr(owner)
        raise BatchError(f"{who}: no {kind} named {name!r}; available {kind}s: {sorted(where)}")
    return value


def lengths_for(seq_lengths: Mapping[str, Tensor], *names: str) -> Tensor | None:
    """The sequence lengths of the first of ``names`` that has them (None: no lengths known)."""
    for name in names:
        if name in seq_lengths:
            return seq_lengths[name]
    return None


class CrossEntropy:
    """Softmax cross-entropy.

    Frame level when the target has a time axis (``target [B, T]``, ``output [B, T, C]``):
    padded frames are masked and ``norm`` is the number of valid frames. Utterance level when
    the target has no time axis (``target [B]``, ``output [B, C]``): ``norm`` is the batch size. The
    original's speaker ids ``[B, 1]`` with ``output [B, C]`` are utterance level too (its
    ``crossentropy_loss.py:33`` squeezes that axis: ``tf.squeeze(targets['spkids'], 1)``).

    Examples:
        >>> loss = CrossEntropy(output="logits", target="y")
        >>> logits = torch.zeros(2, 4, 3)            # two sequences of up to 4 frames, 3 classes
        >>> y = torch.zeros(2, 4, dtype=torch.long)
        >>> total, norm = loss({"y": y}, {"logits": logits}, {"logits": torch.tensor([4, 2])})
        >>> round(float(total / norm), 4), int(norm)  # log(3) per frame, 6 valid frames
        (1.0986, 6)
    """

    def __init__(self, output: str, target: str) -> None:
        self.output = output
        self.target = target

    def __repr__(self) -> str:
        return f"CrossEntropy(output={self.output!r}, target={self.target!r})"

    def __call__(
        self, targets: Mapping[str, Tensor], outputs: Mapping[str, Tensor], seq_lengths: Mapping[str, Tensor]
    ) -> LossResult:
        logits = lookup("output", outputs, self.output, self)
        target = lookup("target", targets, self.target, self)
        if target.dim() == 2 and target.shape[1] == 1 and logits.dim() == 2:
            target = target[:, 0]  # the original's [B, 1] speaker ids
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
        lengths = lengths_for(seq_lengths, self.target, self.output)
        # Flattened logits (a view, no transposed copy) and padded frames as ``ignore_index``: the one
        # fused kernel PyTorch has for masked frame cross-entropy, forward and backward.
        target = target.long()
        if lengths is None:
            return (F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum"),
                    logits.new_full((), float(target.numel())))
        # the batch's frame mask and count, made once per batch (by collate), read here
        frames = frame_mask(lengths, target.shape[1])
        target = target.masked_fill(frames.padding, IGNORE_INDEX)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        return loss, frames.count(logits.dtype)


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
        out = lookup("output", outputs, self.output, self)
        target = lookup("target", targets, self.target, self)
        if out.shape != target.shape:
            raise BatchError(
                f"{self!r}: output {tuple(out.shape)} and target {tuple(target.shape)} differ in shape"
            )
        target = target.to(out.dtype)
        lengths = lengths_for(seq_lengths, self.target, self.output)
        if out.dim() < 2 or lengths is None:
            return F.mse_loss(out, target, reduction="sum"), out.new_full((), float(out.numel()))
        frames = frame_mask(lengths, out.shape[1])  # made once per batch (by collate), read here
        valid = frames.valid
        # Padded frames take the target's value, so they add exactly 0 to the loss and get no gradient.
        kept = torch.where(valid.view(*valid.shape, *([1] * (out.dim() - 2))), out, target)
        elems_per_frame = out[0, 0].numel()
        count = frames.count(out.dtype)
        return F.mse_loss(kept, target, reduction="sum"), count * elems_per_frame if elems_per_frame != 1 else count


# Loss computers by name. The core holds the generic ones; domain packages register theirs on
# import (``mtlab.separation.losses``: pit, direct, deepclustering, ...), and a lookup of a missing
# name imports them (see ``mtlab.base.registry``). ``ORIGINAL_LOSS_TYPES`` lists the names that are the
# original's ``loss_type`` strings with the same math; ``mse`` is mtlab's own (the original has none).
LOSSES: Registry = Registry("loss", {"crossentropy": CrossEntropy, "mse": MSE})
ORIGINAL_LOSS_TYPES: set[str] = {"crossentropy"}


def get_loss(name: str, **settings: object) -> Callable[..., tuple[Tensor, Tensor]]:
    """``get_loss("crossentropy", output="logits", target="y")``; unknown names list the valid ones."""
    return build("loss", LOSSES, name.lower(), settings)
