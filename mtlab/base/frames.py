"""Which frames of a padded batch are real: made once per batch, read by every loss.

A loss over a zero-padded batch masks the padded frames and counts the valid ones. Both depend only on the
batch's lengths, so they are made once per lengths tensor, where the batch is made (``collate``: in the data
workers or the prefetching thread when there are any), and kept with that tensor; each loss of each minibatch
only reads them. A batch built by hand gets its masks on first use and keeps them too. A lengths tensor
changed in place, or a mask changed by whoever read it, is noticed (torch's version counters) and the mask
made again, so a kept mask never disagrees with its lengths.

Examples:
    >>> lengths = torch.tensor([3, 1])
    >>> frames = frame_mask(lengths, 4)
    >>> frames.valid.tolist(), int(frames.count(torch.float32))
    ([[True, True, True, False], [True, False, False, False]], 4)
    >>> frame_mask(lengths, 4) is frames  # kept with the lengths tensor
    True
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

ATTRIBUTE = "_mtlab_frames"  # on a lengths tensor: {time length: FrameMask}
version = operator.attrgetter("_version")  # torch's count of a tensor's in-place changes


class FrameMask:
    """``valid`` (``[B, T]`` bool, True on real frames), ``padding`` (its complement) and ``count(dtype)`` (the
    number of valid frames, a 0-d tensor of ``dtype``), made once and handed out as they are: read them, do not
    change them in place (a change is noticed, and the mask made again)."""

    __slots__ = ("valid", "padding", "version", "_counts")

    def __init__(self, valid: Tensor, made_at: int, padding: Tensor | None = None,
                 counts: dict[torch.dtype, Tensor] | None = None) -> None:
        self.valid = valid
        self.padding = ~valid if padding is None else padding
        self.version = made_at  # the lengths tensor's version counter when the mask was made
        self._counts: dict[torch.dtype, Tensor] = counts or {}

    def count(self, dtype: torch.dtype) -> Tensor:
        """The number of valid frames as a 0-d tensor of ``dtype`` (made once per dtype; no host read)."""
        c = self._counts.get(dtype)
        if c is None or version(c):
            with torch.no_grad():
                c = self._counts[dtype] = self.valid.sum().to(dtype)
        return c

    def intact(self, lengths: Tensor) -> bool:
        """Neither the lengths nor the masks changed in place since the mask was made."""
        return version(lengths) == self.version and not version(self.valid) and not version(self.padding)

    def to(self, device: torch.device, non_blocking: bool = False) -> FrameMask:
        """The same masks and counts on ``device`` (copies, as the lengths tensor's own)."""
        return FrameMask(self.valid.to(device, non_blocking=non_blocking), 0,
                         self.padding.to(device, non_blocking=non_blocking),
                         {k: v.to(device, non_blocking=non_blocking) for k, v in self._counts.items()})


def frame_mask(lengths: Tensor, max_len: int) -> FrameMask:
    """The frame mask of a batch whose sequences have ``lengths`` (``[B]``), padded to ``max_len`` frames: kept with
    the lengths tensor, so made once per batch (``collate`` makes it when it builds the batch)."""
    kept: dict[int, FrameMask] | None = getattr(lengths, ATTRIBUTE, None)
    if kept is not None:
        frames = kept.get(max_len)
        if frames is not None and version(lengths) == frames.version and not version(frames.valid) \
                and not version(frames.padding):  # frames.intact(lengths), inline: this runs per minibatch
            return frames
    else:
        kept = {}
        setattr(lengths, ATTRIBUTE, kept)
    with torch.no_grad():
        valid = torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(1)
    frames = kept[max_len] = FrameMask(valid, version(lengths))
    frames.count(torch.get_default_dtype())  # the normalizer most losses return, made here too
    return frames


def carry(source: Tensor, moved: Tensor, non_blocking: bool = False) -> Tensor:
    """``moved`` (a copy of the lengths ``source`` on another device) with ``source``'s kept masks copied along,
    so that a batch moved to the device keeps what was made for it."""
    kept: dict[int, FrameMask] | None = getattr(source, ATTRIBUTE, None)
    if kept and moved is not source:
        setattr(moved, ATTRIBUTE, {t: f.to(moved.device, non_blocking) for t, f in kept.items() if f.intact(source)})
    return moved
