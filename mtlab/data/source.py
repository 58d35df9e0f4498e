"""The base class of a linked set whose audio is read per batch (``mtlab.tasks.sampling.StreamedSource``).

A subclass reads utterance ``i``'s audio in :meth:`~AudioSplit.audio` (a dict of int16 waveforms and per-utterance
targets, or a :class:`~mtlab.tasks.sampling.Skipped` for a bad file); cutting a segment and computing features and
targets on the training device are the same for every such split and live here::

    class MySplit(AudioSplit):
        def __init__(self, ...):
            self.featurizer = Featurizer(...)   # features, targets and normalization, on the device
            self.lengths = [...]                # frames per utterance, for bucketing

        def __len__(self): ...
        def audio(self, index): ...
"""

from __future__ import annotations

from typing import Any

import torch

from ..tasks.sampling import Skipped
from .ondevice import Featurizer


class AudioSplit(torch.utils.data.Dataset):
    """A streamed linked set: ``audio(i)`` read per batch, ``featurize(batch, device)`` on the device."""

    featurizer: Featurizer
    lengths: list[int]

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def audio(self, index: int) -> dict[str, torch.Tensor] | Skipped:
        """Utterance ``index``'s waveforms and per-utterance targets (or why it was skipped)."""
        raise NotImplementedError(f"{type(self).__name__} must define audio(index)")

    def set_epoch(self, epoch: int) -> None:
        """The epoch about to be drawn (a split whose examples change per epoch, e.g. dynamic mixing, uses it)."""

    def segment(self, index: int, start: int, frames: int) -> dict[str, torch.Tensor] | Skipped:
        """``audio(index)`` with ``segment = [start, frames]``: the frames the batch keeps of the utterance."""
        out = self.audio(index)
        if isinstance(out, Skipped):
            return out
        return {**out, "segment": torch.tensor([start, frames], dtype=torch.long)}

    def featurize(self, batch: Any, device: torch.device | str | None = None) -> Any:
        """Features and targets of a collated batch of :meth:`audio` items, computed on ``device``."""
        return self.featurizer(batch, device)
