"""Where a linked set's examples come from, and the views of them a stage trains on.

A linked set reads its examples from an :class:`ExampleSource` (a list of example dicts, a Dataset, a split of
``mtlab.data``). A :class:`DataSource` also describes its examples without reading them (lengths, per-frame
keys, shards); a :class:`StreamedSource` gives audio per example and turns a collated batch into features on
the trainer's device; an :class:`EpochSource` changes its examples per epoch. Reading an example may give a
:class:`Skipped` (a bad file under a skip policy) or, in a DataLoader worker, a :class:`Failed`. The views
:class:`SegmentedExamples` (every utterance cut into segments) and :class:`HeadExamples` (the head of the list,
:func:`trainset_fraction`) are sources themselves and carry the description through. How minibatches are
drawn from a source is :mod:`mtlab.tasks.sampling`'s.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from ..base.batching import Batch, as_entry, example_length
from ..base.errors import BatchError, ConfigError, MtlabError


@dataclass(frozen=True)
class Skipped:
    """An example a source could not give (a bad file under a skip policy): its name, list line and why."""

    name: str
    where: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """The skipped example as plain values (``skipped.jsonl``)."""
        return asdict(self)


@dataclass(frozen=True)
class Failed:
    """An example a DataLoader worker could not read (bad data under ``on_bad_data="raise"``): the error."""

    error: MtlabError


class ExampleSource(Protocol):
    """What a linked set reads examples from: a sized sequence of example dicts (a list, a Dataset, a split)."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Mapping[str, Tensor]: ...


@runtime_checkable
class DataSource(ExampleSource, Protocol):
    """A source that describes its examples without reading them: ``mtlab.data``'s splits, whose base class
    ``mtlab.data.source.Split`` gives the defaults (a source of one's own may subclass it, or define all three).

    - ``lengths``: frames per example, for bucketing;
    - ``sequence_keys``: the per-frame entries a segment cuts (None: every entry as long as its example);
    - ``shard_of``: the shard of each example, read whole by one rank (None: not written as shards).

    Any other source (a list of example dicts) is measured from its examples."""

    @property
    def lengths(self) -> Sequence[int]: ...
    @property
    def sequence_keys(self) -> Sequence[str] | None: ...
    @property
    def shard_of(self) -> Sequence[int] | np.ndarray | None: ...


@runtime_checkable
class StreamedSource(ExampleSource, Protocol):
    """A source whose audio is read per batch and featurized on the trainer's device (``mtlab.data``'s splits
    subclass ``mtlab.data.source.AudioSplit``, which also cuts segments)."""

    def audio(self, i: int) -> Any: ...
    def featurize(self, batch: Batch, device: Any = None) -> Batch: ...


class SegmentedSource(StreamedSource, Protocol):
    """A streamed source that cuts a segment of an utterance (``segment_length``)."""

    def segment(self, i: int, start: int, frames: int) -> Any: ...


@runtime_checkable
class EpochSource(Protocol):
    """A source whose examples change per epoch (dynamic mixing): told the epoch before a batch is drawn."""

    def set_epoch(self, epoch: int) -> None: ...


def streamed(source: ExampleSource) -> SegmentedSource:
    """``source`` as a streamed source (the wrappers forward these calls only for one)."""
    return cast(SegmentedSource, source)


class LengthsWarning(UserWarning):
    """A dataset is read in full to learn its examples' lengths (give them: ``LinkedSet(ds, lengths=[...])``)."""


_TOLD: set[int] = set()  # the sources whose lengths were read, said once each (by id: a Dataset need not hash)


def given_lengths(source: Any) -> Sequence[int] | None:
    """A source's ``lengths`` attribute (a :class:`DataSource`'s, a Dataset's own, ``LinkedSet(lengths=...)``), or
    None where it has none."""
    lengths = getattr(source, "lengths", None)
    if lengths is None or callable(lengths) or isinstance(lengths, (str, bytes)):
        return None
    return cast(Sequence[int], lengths)


def lengths_of(source: ExampleSource) -> list[int]:
    """Per-example lengths: the source's ``lengths`` (:func:`given_lengths`), else each example's first tensor's
    time axis, which reads every example once; for a Dataset (not a list in memory) that is said once, with how
    to give the lengths instead."""
    given = given_lengths(source)
    if given is not None:
        out = [int(x) for x in given]
        if len(out) != len(source):
            raise ConfigError(f"the source's lengths have {len(out)} entries for {len(source)} examples; give one "
                              "length (frames, or 1 for an example without a time axis) per example")
        return out
    tell = not isinstance(source, (list, tuple)) and id(source) not in _TOLD
    out = []
    for i in range(len(source)):
        out.append(example_length(as_example(source[i], None, i)))  # a tuple dataset: refused, naming fields=
        if tell:
            tell = False
            _TOLD.add(id(source))
            named = type(getattr(source, "source", source)).__name__
            warnings.warn(f"reading all {len(source)} examples of a {named} once to learn their lengths (for length "
                          "bucketing and the epoch's order): every __getitem__ runs before the first minibatch. Give "
                          "them instead: mtlab.LinkedSet(dataset, lengths=[...]) (frames per example) or a `lengths` "
                          "attribute of the dataset", LengthsWarning, stacklevel=3)
    return out


class FieldExamples:
    """A dataset seen as example dicts: ``LinkedSet(ds, fields=("x", "y"))`` names the entries of the tuples a
    ``TensorDataset`` (or any tuple dataset) gives; ``lengths`` gives the examples' lengths so that nothing is read
    to learn them. Entries are returned as the dataset gives them (numpy arrays are taken as tensors at
    collation)."""

    def __init__(self, source: Any, fields: Sequence[str] | None = None, lengths: Sequence[int] | None = None) -> None:
        if fields is not None:
            if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields) or not fields:
                raise ConfigError(f"fields must name each entry of an example, e.g. fields=('x', 'y'), got {fields!r}")
            if len(set(fields)) != len(fields):
                raise ConfigError(f"fields must be distinct names, got {list(fields)}")
        self.source = source
        self.fields = None if fields is None else tuple(fields)
        if lengths is None and isinstance(source, torch.utils.data.TensorDataset) and self.fields is not None:
            lengths = tensor_lengths(source)  # every example of a TensorDataset is as long: no need to read one
        if lengths is not None:
            lengths = [check_length(x, i) for i, x in enumerate(lengths)]
            if len(lengths) != len(source):
                raise ConfigError(f"lengths has {len(lengths)} entries for the {len(source)} examples of the dataset;"
                                  " give one length (frames, or 1 for an example without a time axis) per example")
        self.lengths = lengths
        self.sequence_keys: Sequence[str] | None = None
        self.shard_of = None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Mapping[str, Any]:
        return as_example(self.source[i], self.fields, i)

    def __repr__(self) -> str:
        named = f", fields={list(self.fields)}" if self.fields is not None else ""
        return f"FieldExamples({type(self.source).__name__} of {len(self)}{named})"


def check_length(value: Any, i: int) -> int:
    """One example's length, a whole number >= 0, or a ConfigError naming the example."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"lengths[{i}] must be a whole number of frames >= 0, got {value!r}")
    return int(value)


def tensor_lengths(dataset: torch.utils.data.TensorDataset) -> list[int]:
    """The lengths of a TensorDataset's examples, from its first tensor's shape (the same for every example)."""
    first = dataset.tensors[0]
    return [1 if first.dim() == 1 else int(first.shape[1])] * len(dataset)


def as_example(item: Any, fields: Sequence[str] | None, i: int | None = None) -> Mapping[str, Any]:
    """``item`` as an example dict: a mapping as it is; a tuple or list named by ``fields``; else a BatchError
    that names the fix."""
    where = "" if i is None else f" {i}"
    if fields is None:
        if isinstance(item, Mapping):
            return item
        kind = type(item).__name__
        raise BatchError(f"example{where} is a {kind}, not a dict of entries"
                         + (f" ({len(item)} entries): name them, e.g. mtlab.LinkedSet(dataset, fields=("
                            + ", ".join(repr(f"x{k}") for k in range(len(item))) + "))"
                            if isinstance(item, (tuple, list)) else
                            "; give examples as dicts name -> tensor, or tuples with LinkedSet(..., fields=(...))"))
    if isinstance(item, Mapping):
        raise BatchError(f"example{where} is already a dict (entries {sorted(item)}); leave fields= out")
    if not isinstance(item, (tuple, list)) or len(item) != len(fields):
        got = f"{len(item)} entries" if isinstance(item, (tuple, list)) else f"a {type(item).__name__}"
        raise BatchError(f"example{where} has {got} but fields names {len(fields)} ({list(fields)}); give one name "
                         "per entry of the dataset's tuples")
    return dict(zip(fields, item))


def shard_parts(source: ExampleSource) -> list[int] | None:
    """The shard of each example of a source written as shards (a :class:`DataSource`'s ``shard_of``, which the
    segment and head views carry through), or None for any other source."""
    parts = source.shard_of if isinstance(source, DataSource) else None
    return None if parts is None else [int(x) for x in parts]


def reads_audio(source: Any) -> bool:
    """True for a source whose batches are collated from ``source.audio(i)`` items and turned into features by
    ``source.featurize(batch, device)`` (a streamed linked set), or a view of one."""
    if isinstance(source, (SegmentedExamples, HeadExamples)):
        return reads_audio(source.source)
    return isinstance(source, StreamedSource)


def tell_epoch(source: Any, epoch: int) -> None:
    """Give ``epoch`` to a source whose examples change per epoch (``set_epoch``, e.g. dynamic mixing), through
    the views wrapping it; before a batch is collated, so DataLoader workers receive it with their copy."""
    while source is not None:
        if isinstance(source, EpochSource):
            source.set_epoch(epoch)
        source = source.source if isinstance(source, (SegmentedExamples, HeadExamples)) else None


class AudioItems(torch.utils.data.Dataset):
    """``items[i] = source.audio(i)``: what a DataLoader worker reads for a streamed source."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        try:
            return streamed(self.source).audio(i)
        except MtlabError as err:  # sent back as a value: the stream raises it as is, without the worker's traceback
            return Failed(err)


class SegmentedExamples:
    """Every utterance of ``source`` cut into segments of ``segment_length`` frames (the original's
    ``segment_lengths`` stages): an utterance of n frames gives ``n // segment_length`` consecutive segments
    (the remainder is dropped); one shorter than a segment stays whole, unpadded (batching pads and masks it).

    ``keys`` names the per-frame entries to cut; by default ``source.sequence_keys`` when the source has them,
    else every entry with a first axis as long as the utterance (per-utterance entries such as speaker ids
    or i-vectors are copied to each segment).

    Examples:
        >>> # len(segs) segments; segs.source is the uncut data
        >>> segs = SegmentedExamples(examples, 100)  # doctest: +SKIP
    """

    def __init__(self, source: ExampleSource, segment_length: int, keys: Sequence[str] | None = None) -> None:
        if not isinstance(segment_length, int) or isinstance(segment_length, bool) or segment_length < 1:
            raise ConfigError(f"segment_length must be a positive number of frames, got {segment_length!r}")
        self.source = source
        self.segment_length = segment_length
        if keys is None and isinstance(source, DataSource):
            keys = source.sequence_keys
        self.keys = None if keys is None else tuple(keys)
        self.sequence_keys = self.keys  # what is per-frame in a segment: as in the utterance
        self.index: list[tuple[int, int, int]] = []  # (utterance, first frame, frames)
        for i, n in enumerate(lengths_of(source)):
            if n < segment_length:
                self.index.append((i, 0, n))
            else:
                self.index.extend((i, k * segment_length, segment_length) for k in range(n // segment_length))
        self.lengths = [n for _, _, n in self.index]
        parts = source.shard_of if isinstance(source, DataSource) else None
        self.shard_of = None if parts is None else [int(parts[i]) for i, _, _ in self.index]

    def __len__(self) -> int:
        return len(self.index)

    def audio(self, j: int) -> Any:
        """The audio of segment ``j`` for a streamed source (its ``segment(i, start, frames)``)."""
        i, start, n = self.index[j]
        return streamed(self.source).segment(i, start, n)

    def featurize(self, batch: Batch, device: Any = None) -> Batch:
        """Features of a collated batch, by the uncut source."""
        return streamed(self.source).featurize(batch, device)

    def __getitem__(self, j: int) -> dict[str, Tensor]:
        i, start, n = self.index[j]
        example = self.source[i]
        full = example_length(example)
        out = {}
        for key, value in example.items():
            value = as_entry(value)
            timed = key in self.keys if self.keys is not None else (
                isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == full)
            out[key] = value[start : start + n] if timed else value
        return out

    def __repr__(self) -> str:
        return f"SegmentedExamples({len(self)} segments of <= {self.segment_length} frames from {len(self.source)} utterances)"


class HeadExamples:
    """The first ``count`` examples of ``source`` (the original's ``trainset_frac``: the head of the list, unshuffled)."""

    def __init__(self, source: ExampleSource, count: int, frac: float | None = None) -> None:
        if not isinstance(count, int) or not 1 <= count <= len(source):
            raise ConfigError(f"HeadExamples: count must be between 1 and {len(source)} (the examples there are), "
                              f"got {count!r}")
        self.source = source
        self.count = count
        self.frac = frac  # set by trainset_fraction: a stage's other view of the data keeps this fraction of it
        self.lengths = lengths_of(source)[:count]
        described = source if isinstance(source, DataSource) else None
        self.sequence_keys = described.sequence_keys if described is not None else None
        parts = described.shard_of if described is not None else None
        self.shard_of = None if parts is None else [int(x) for x in parts[:count]]

    def __len__(self) -> int:
        return self.count

    def audio(self, i: int) -> Any:
        """The audio of example ``i`` (the source's)."""
        return streamed(self.source).audio(i)

    def featurize(self, batch: Batch, device: Any = None) -> Batch:
        """Features of a collated batch, by the source."""
        return streamed(self.source).featurize(batch, device)

    def segment(self, i: int, start: int, frames: int) -> Any:
        """A segment of example ``i`` (the source's)."""
        return streamed(self.source).segment(i, start, frames)

    def __getitem__(self, i: int) -> Mapping[str, Tensor]:
        if not -self.count <= i < self.count:
            raise IndexError(f"example {i} of {self.count}")
        return self.source[i % self.count]

    def __repr__(self) -> str:
        return f"HeadExamples(first {self.count} of {len(self.source)})"


def trainset_fraction(source: ExampleSource, frac: float) -> HeadExamples:
    """The first ``int(len(source) x frac)`` examples (the original's ``trainset_frac``), at least one."""
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac <= 1:
        raise ConfigError(f"trainset_frac must be a fraction in (0, 1], got {frac!r}")
    count = int(len(source) * float(frac))
    if count < 1:
        raise ConfigError(f"trainset_frac = {frac} keeps none of the {len(source)} utterances; raise it")
    return HeadExamples(source, count, float(frac))
