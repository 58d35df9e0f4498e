"""The base classes of mtlab.data's splits: :class:`Split` describes its examples (the members of
``mtlab.tasks.sources.DataSource``, with their defaults), :class:`AudioSplit` is a split whose audio is read per
batch (``mtlab.tasks.sources.StreamedSource``).

An :class:`AudioSplit` subclass reads utterance ``i``'s audio in :meth:`~AudioSplit.audio` (a dict of int16
waveforms and per-utterance targets, or a :class:`~mtlab.tasks.sources.Skipped` for a bad file); the lengths and
per-frame keys it describes, cutting a segment and computing features and targets on the training device are the
same for every such split and live here::

    class MySplit(AudioSplit):
        def __init__(self, ...):
            super().__init__(Featurizer(...), samples)  # features and targets on the device; samples per utterance

        def __len__(self): ...
        def audio(self, index): ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..tasks.sources import Skipped
from .ondevice import Featurizer

# The per-frame keys of a split, in this order (a per-utterance vector is not one, however long it is).
SEQUENCE_KEYS = ("features", "mix_mag", "src_mag", "binary_targets", "usedbins", "frame_target")


class Split(torch.utils.data.Dataset):
    """A linked set's examples, described without reading them (``mtlab.tasks.sources.DataSource``):
    ``lengths`` (frames per example, for bucketing), ``sequence_keys`` (the per-frame entries a segment cuts; None:
    every entry as long as its example) and ``shard_of`` (the shard of each example; None: not written as shards)."""

    lengths: list[int]
    sequence_keys: tuple[str, ...] | None = None
    shard_of: Sequence[int] | np.ndarray | None = None

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")


class AudioSplit(Split):
    """A streamed linked set: ``audio(i)`` read per batch, ``featurize(batch, device)`` on the device."""

    featurizer: Featurizer
    samples: np.ndarray  # the mixture's samples per utterance

    def __init__(self, featurizer: Featurizer, samples: Sequence[int] | np.ndarray) -> None:
        self.featurizer = featurizer
        self.samples = np.asarray(samples, dtype=np.int64)
        self.lengths = [featurizer.spectral.num_frames(int(n)) for n in self.samples]
        self.sequence_keys = tuple(k for k in SEQUENCE_KEYS if k == "features" or k in featurizer.keys)

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
