"""Endless, reproducible, length-bucketed minibatch streams (one per linked set).

Utterances are sorted by length and cut into ``numbuckets`` groups of (nearly) equal size.
Each epoch, every bucket is shuffled and cut into batches, and the order of all batches is
shuffled, from a generator seeded by ``(seed, epoch)``: the same seed gives the same batches,
every utterance appears exactly once per epoch, and no batch mixes buckets. ``numbuckets=1``
is plain shuffled batching. The position (epoch, batch index) can be saved and restored exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from ..base.batching import Batch, collate, example_length
from ..base.errors import ConfigError, DataError, MtlabError


class DataWorkerError(MtlabError, RuntimeError):
    """A data-loading worker died (killed, out of memory, crashed in native code); the message names the stream."""


@dataclass(frozen=True)
class Skipped:
    """An example a source could not give (a bad file under a skip policy): its name, list line and why."""

    name: str
    where: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """The skipped example as plain values (``skipped.jsonl``)."""
        return asdict(self)


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


@dataclass(frozen=True)
class Failed:
    """An example a DataLoader worker could not read (bad data under ``on_bad_data="raise"``): the error."""

    error: MtlabError


def collate_kept(items: Sequence[Any]) -> tuple[Batch | Failed | None, list[Skipped]]:
    """Collate the items that are not :class:`Skipped`; returns (batch or None when none is left, the skipped).
    An item that :class:`Failed` takes the batch's place (the stream raises its error)."""
    failed = next((x for x in items if isinstance(x, Failed)), None)
    if failed is not None:
        return failed, []
    skipped = [x for x in items if isinstance(x, Skipped)]
    kept = [x for x in items if not isinstance(x, Skipped)]
    return (collate(kept) if kept else None), skipped


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


def lengths_of(source: ExampleSource) -> list[int]:
    """Per-example lengths: a :class:`DataSource`'s ``lengths``, else each example's first tensor's time axis."""
    if isinstance(source, DataSource):
        out = [int(x) for x in source.lengths]
        if len(out) != len(source):
            raise ConfigError(f"source.lengths has {len(out)} entries for {len(source)} examples")
        return out
    return [example_length(source[i]) for i in range(len(source))]


def bucket_batches(
    lengths: Sequence[int], batch_size: int, numbuckets: int, seed: int, epoch: int, shuffle: bool = True
) -> list[list[int]]:
    """The batches (lists of example indices) of one epoch."""
    n = len(lengths)
    order = np.argsort(np.asarray(lengths), kind="stable").tolist()  # by length, ties by index; fast at 10^5
    nb = max(1, min(numbuckets, n))
    bounds = [round(k * n / nb) for k in range(nb + 1)]
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) % (2**63))
    batches: list[list[int]] = []
    for k in range(nb):
        bucket = order[bounds[k] : bounds[k + 1]]
        if shuffle:
            perm = torch.randperm(len(bucket), generator=gen).tolist()
            bucket = [bucket[j] for j in perm]
        batches.extend(bucket[s : s + batch_size] for s in range(0, len(bucket), batch_size))
    if shuffle:
        perm = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[j] for j in perm]
    return batches


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
            timed = key in self.keys if self.keys is not None else (value.dim() >= 1 and value.shape[0] == full)
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


def shard_parts(source: ExampleSource) -> list[int] | None:
    """The shard of each example of a source written as shards (a :class:`DataSource`'s ``shard_of``, which the
    segment and head views carry through), or None for any other source."""
    parts = source.shard_of if isinstance(source, DataSource) else None
    return None if parts is None else [int(x) for x in parts]


def batch_count(n: int, batch_size: int, numbuckets: int) -> int:
    """Batches per epoch that :func:`bucket_batches` cuts from ``n`` examples."""
    nb = max(1, min(numbuckets, n))
    bounds = [round(k * n / nb) for k in range(nb + 1)]
    return sum(-(-(bounds[k + 1] - bounds[k]) // batch_size) for k in range(nb))


def own_examples(parts: Sequence[int], batch_size: int, numbuckets: int, rank: int,
                 world: int) -> tuple[list[int], int]:
    """The examples in the shards of ``rank`` (shard ``i`` belongs to rank ``i % world``) and the batches per epoch
    of every rank (the most any rank has: the others cycle, so the ranks stay in step)."""
    counts = [0] * world
    for p in parts:
        counts[p % world] += 1
    empty = [r for r in range(world) if counts[r] == 0]
    if empty:
        raise ConfigError(f"rank(s) {empty} of {world} get no example: the examples used lie in {len(set(parts))} "
                          f"shard(s), and each rank reads whole shards of its own (shard i on rank i % {world}); write "
                          f"at least {world} shards (`mtlab shard ... --shard-size N` with a smaller N), or run on "
                          "fewer ranks")
    own = [i for i, p in enumerate(parts) if p % world == rank]
    return own, max(batch_count(c, batch_size, numbuckets) for c in counts)


def trainset_fraction(source: ExampleSource, frac: float) -> HeadExamples:
    """The first ``int(len(source) x frac)`` examples (the original's ``trainset_frac``), at least one."""
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac <= 1:
        raise ConfigError(f"trainset_frac must be a fraction in (0, 1], got {frac!r}")
    count = int(len(source) * float(frac))
    if count < 1:
        raise ConfigError(f"trainset_frac = {frac} keeps none of the {len(source)} utterances; raise it")
    return HeadExamples(source, count, float(frac))


class BatchStream:
    """An endless stream of collated minibatches drawn from ``source``.

    Examples:
        >>> stream = BatchStream(examples, batch_size=8, numbuckets=4, seed=0)  # doctest: +SKIP
        >>> data, seq_lengths = next(stream)  # doctest: +SKIP
        >>> state = stream.state_dict(); a = next(stream)  # doctest: +SKIP
        >>> stream.load_state_dict(state); b = next(stream)  # doctest: +SKIP
    """

    def __init__(
        self,
        source: ExampleSource,
        batch_size: int,
        numbuckets: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
        shard: tuple[int, int] = (0, 1),
        device: torch.device | str | None = None,
    ) -> None:
        if len(source) == 0:
            raise ConfigError("a linked set needs at least one example; this one is empty")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(numbuckets, int) or numbuckets < 1:
            raise ConfigError(f"numbuckets must be a positive integer, got {numbuckets!r}")
        self.source = source
        self.batch_size = batch_size
        self.numbuckets = numbuckets
        self.seed = int(seed)
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.device = device  # where a streamed source computes its features (None: on the CPU)
        self.audio = reads_audio(source)
        self.skipped: list[dict[str, Any]] = []  # examples a skip policy left out: name, where, reason, epoch
        self.lengths = lengths_of(source)
        rank, world = shard
        if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
            raise ConfigError(f"shard must be (rank, world_size) with 0 <= rank < world_size, got {shard!r}")
        self.rank, self.world_size = rank, world
        self.parts = shard_parts(source)
        if self.parts is not None:
            self._own, self._epoch_size = own_examples(self.parts, batch_size, numbuckets, rank, world)
        self.epoch = 0
        self.position = 0
        self._batches: list[list[int]] | None = None
        # a batch-size change mid-epoch: (the size the epoch was cut with, [(position, new size), ...])
        self._recut: tuple[int, list[tuple[int, int]]] | None = None
        self._loader_iter: Iterator[Batch] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.epoch_batches())

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """This shard's batches of an epoch. Every rank computes the same global order; with
        several ranks it is padded (cycling from its start) to a multiple of the world size, so
        every rank has the same number of batches and stays in step with the others. A source written as shards
        (``source.shard_of``) is split by shard instead: each rank draws only from its own shards (see
        :func:`own_examples`), so it opens no other rank's files."""
        if epoch is None or epoch == self.epoch:
            if self._batches is None:
                self._batches = self._epoch_batches(self.epoch)
            return self._batches
        return self._epoch_batches(epoch)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        if self._recut is not None and epoch == self.epoch:  # what was drawn stays; the rest, in order, re-cut
            size, cuts = self._recut
            batches = bucket_batches(self.lengths, size, self.numbuckets, self.seed, epoch, self.shuffle)
            for position, new in cuts:
                rest = [i for b in batches[position:] for i in b]
                batches = batches[:position] + [rest[s : s + new] for s in range(0, len(rest), new)]
            return batches
        if self.parts is not None:  # a source written as shards: this rank's batches come from its own shards only
            seed = self.seed + 1_000_033 * self.rank  # rank 0 draws as a single process does
            local = bucket_batches([self.lengths[i] for i in self._own], self.batch_size, self.numbuckets, seed,
                                   epoch, self.shuffle)
            batches = [[self._own[j] for j in b] for b in local]
            return [batches[i % len(batches)] for i in range(self._epoch_size)]  # every rank: as many batches
        return self._shard(bucket_batches(self.lengths, self.batch_size, self.numbuckets, self.seed, epoch,
                                          self.shuffle))

    def _shard(self, batches: list[list[int]]) -> list[list[int]]:
        if self.world_size == 1:
            return batches
        n = -(-len(batches) // self.world_size) * self.world_size
        padded = [batches[i % len(batches)] for i in range(n)]
        return padded[self.rank :: self.world_size]

    def next_indices(self) -> list[int]:
        """Indices of the next batch; advances the position."""
        batches = self._batches if self._batches is not None else self.epoch_batches()
        if self.position >= len(batches):
            self._advance_epoch()
            batches = self.epoch_batches()
        idx = batches[self.position]
        self.position += 1
        return idx

    def _advance_epoch(self) -> None:
        self.epoch += 1
        self.position = 0
        self._batches = None
        self._recut = None
        self._close_loader()

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        """The next batch. A draw that raises leaves the stream where it started (the next draw retries the
        same batch), with or without DataLoader workers."""
        start = (self.epoch, self.position)
        try:
            if not self.audio and self.num_workers == 0:  # examples in memory (the usual small case): collate here
                return collate([self.source[i] for i in self.next_indices()], pin_memory=self.pin_memory)
            return self._draw()
        except BaseException:
            if (self.epoch, self.position) != start or self._loader_iter is not None:
                self.seek(*start)
                self._close_loader()  # its workers went on past the failed batch: fresh ones start there
            raise

    def _draw(self) -> Batch:
        if not self.audio:
            if self.num_workers > 0:
                return self._next_from_loader()
            return collate([self.source[i] for i in self.next_indices()], pin_memory=self.pin_memory)
        start, kept_records, empty = (self.epoch, self.position), len(self.skipped), 0
        while True:  # a streamed source: collate its audio, then compute the features on the device
            if empty and empty >= len(self.epoch_batches()):  # a whole epoch in a row without one readable example
                self._no_readable_data(start, kept_records, empty)
            if self.num_workers > 0:
                batch, skipped = self._next_from_loader()
            else:
                indices = self.next_indices()
                tell_epoch(self.source, self.epoch)
                batch, skipped = collate_kept([streamed(self.source).audio(i) for i in indices])
                if batch is not None and not isinstance(batch, Failed) and self.pin_memory:
                    batch = ({k: v.pin_memory() for k, v in batch[0].items()}, batch[1])
            if isinstance(batch, Failed):
                raise batch.error
            self.skipped.extend({**s.to_dict(), "epoch": self.epoch} for s in skipped)
            if batch is not None:  # else every example of the batch was bad: draw the next
                return streamed(self.source).featurize(batch, self.device)
            empty += 1

    def _no_readable_data(self, start: tuple[int, int], kept_records: int, empty: int) -> None:
        """Under a skip policy every example of a whole epoch was bad (the files are gone): raise instead of
        drawing forever, with the stream back where the draw started and none of its records kept."""
        records = self.skipped[kept_records:]
        del self.skipped[kept_records:]
        self.seek(*start)
        first, last = records[0], records[-1]
        raise DataError(f"no readable example left: {empty} batches in a row (a whole epoch, {len(records)} "
                        f"examples) were all bad under on_bad_data='skip', e.g. {first['where']}: {first['reason']}; "
                        f"last {last['where']}: {last['reason']}. The data went away (an unmounted disk, deleted "
                        "files?): make them readable again, then continue (the stream is back where this draw "
                        "started)")

    def _next_from_loader(self) -> Any:
        batches = self.epoch_batches()
        if self.position >= len(batches):
            self._advance_epoch()
            batches = self.epoch_batches()
        if self._loader_iter is None:
            tell_epoch(self.source, self.epoch)  # before the workers copy the source
            loader = torch.utils.data.DataLoader(
                AudioItems(self.source) if self.audio else self.source,  # type: ignore[arg-type]
                batch_sampler=batches[self.position :],
                collate_fn=collate_kept if self.audio else collate,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                # its own generator: creating workers must not draw from the global RNG (dropout, input
                # noise), or training would depend on when loaders were (re)started, e.g. after a resume
                generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch),
            )
            self._loader_iter = iter(loader)
        try:
            batch = next(self._loader_iter)
        except (RuntimeError, OSError, EOFError) as err:
            # a dead worker shows as torch's RuntimeError, or as a broken connection while its batch was in
            # transit; the same types raised by the data themselves come re-raised with "in DataLoader worker"
            if "DataLoader worker (pid" not in str(err) if isinstance(err, RuntimeError) else \
                    "in DataLoader worker process" in str(err):
                raise
            self._close_loader()  # torch stops watching its workers; the next draw starts fresh ones here
            raise DataWorkerError(f"a data worker of this stream died at epoch {self.epoch}, batch {self.position} "
                                  f"({err}); the position is kept, so the next draw retries the same batch. Check "
                                  "memory (fewer num_workers) or the files of that batch") from err
        self.position += 1
        return batch

    def _close_loader(self) -> None:
        """End the DataLoader iterator now: its workers are stopped and torch stops watching them, so neither its
        SIGCHLD handler nor a copy of the iterator in a later worker (forked with it) reports their end again."""
        it, self._loader_iter = getattr(self, "_loader_iter", None), None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is None or not hasattr(it, "_shutdown"):
            return
        for _ in range(2):  # torch's SIGCHLD handler may raise its report of a death once more, here
            try:
                shutdown()
                return
            except RuntimeError:
                continue

    def set_batch_size(self, batch_size: int) -> None:
        """Batches of ``batch_size`` from the next draw on. In one process the examples of this epoch not yet
        drawn are drawn once each, in their order, in batches of the new size; the next epochs are cut with it.
        With several ranks (or shards) the epoch is re-cut and each rank continues at the same share of it, so
        that every rank keeps as many batches as the others."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if batch_size == self.batch_size:
            return
        if self.parts is None and self.world_size == 1:
            size, cuts = self._recut if self._recut is not None else (self.batch_size, [])
            self._recut = (size, [*cuts, (self.position, batch_size)])
            self.batch_size = batch_size
            self._batches = None
            self._close_loader()
            return
        old = len(self.epoch_batches())
        self.cut(batch_size)
        self.position = self.position * len(self.epoch_batches()) // max(old, 1)

    def cut(self, batch_size: int) -> None:
        """Cut the epochs in batches of ``batch_size``, the position left as it is (``set_batch_size`` moves it to
        the same share of the epoch; a restore sets it from the state)."""
        self.batch_size = batch_size
        self._recut = None
        if self.parts is not None:
            self._own, self._epoch_size = own_examples(self.parts, batch_size, self.numbuckets, self.rank,
                                                       self.world_size)
        self._batches = None
        self._close_loader()

    def seek(self, epoch: int, position: int) -> None:
        """Go to batch ``position`` of ``epoch`` (what ``state_dict`` saves)."""
        if epoch != self.epoch:
            self._batches = None
            self._recut = None
        if (epoch, position) != (self.epoch, self.position):
            self._close_loader()
        self.epoch, self.position = int(epoch), int(position)

    def state_dict(self) -> dict[str, Any]:
        """Plain-int position: restoring it reproduces the same next batches."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "numbuckets": self.numbuckets, "batch_size": self.batch_size, "size": len(self.lengths),
                "world_size": self.world_size,
                **({"recut": [self._recut[0], [list(c) for c in self._recut[1]]]} if self._recut is not None else {})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a position ``state_dict`` gave (exact resume)."""
        check_stream_state(state, self.state_dict())
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        position = int(state["position"])
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.world_size:
            # Same place in the global batch order, counted in this stream's shard.
            position = position * saved_world // self.world_size
        self.position = position
        recut = state.get("recut")
        self._recut = None if recut is None else (int(recut[0]), [(int(p), int(n)) for p, n in recut[1]])
        self._batches = None
        self._close_loader()


class Streams(dict):
    """The endless stream of every (task, linked set), created on first use; a dict ``(task, set) -> BatchStream``
    that also saves and restores every position. ``shard=(rank, world_size)`` splits each linked set for
    data parallelism."""

    def __init__(self, seed: int, pin_memory: bool = False, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.seed, self.pin_memory, self.shard, self.device = seed, pin_memory, (0, 1), device

    def get_stream(self, task: Any, linkedset: str) -> BatchStream:
        """The stream of ``task.linkedsets[linkedset]`` (``task`` is a ``mtlab.Task``)."""
        key = (task.name, linkedset)
        stream = self.get(key)
        if stream is not None and stream.batch_size != task.batch_size:  # Trainer.set_batch_size: from this draw
            stream.set_batch_size(task.batch_size)
        if key not in self:
            ls = task.linkedsets[linkedset]
            if ls.examples is None:
                raise ConfigError(f"linked set {linkedset!r} of task {task.name!r} has no examples; pass "
                                  "batch=(data, seq_lengths) to process_minibatch or give LinkedSet(examples)")
            self[key] = BatchStream(ls.examples, task.batch_size, task.numbuckets,
                                    seed=derived_seed(self.seed, task.name, linkedset), num_workers=ls.num_workers,
                                    pin_memory=self.pin_memory, shard=self.shard, device=self.device)
        return self[key]

    def state_dict(self) -> dict[str, Any]:
        """Every stream's position, for a checkpoint."""
        return {f"{t}/{s}": dict(st.state_dict()) for (t, s), st in self.items()}

    def skipped(self) -> list[dict[str, Any]]:
        """Every example a skip policy left out so far: name, where (list line), reason, epoch, task, linkedset."""
        return [{**r, "task": t, "linkedset": s} for (t, s), st in self.items() for r in st.skipped]

    def new_skipped(self) -> list[dict[str, Any]]:
        """The records of :meth:`skipped` not returned by an earlier call (for announcing them once)."""
        records = self.skipped()
        fresh = records[getattr(self, "reported", 0):]
        self.reported = len(records)
        return fresh

    def check_state_dict(self, state: Mapping[str, Any], tasks: Mapping[str, Any],
                         declared: Mapping[str, int] | None = None) -> None:
        """Raise the ConfigError :meth:`load_state_dict` would raise, changing nothing (no stream is opened).
        ``declared``: task -> the batch size the saved trainer's task had; a saved stream may still be at its
        previous one (``set_batch_size`` takes effect at the next draw), and it is that task's batch size that
        must agree with this trainer's."""
        for key, sst in state.items():
            tname, sname = key.split("/", 1)
            if tname not in tasks or sname not in tasks[tname].linkedsets:
                continue
            if declared is not None and declared.get(tname) is not None:
                sst = {**sst, "batch_size": declared[tname]}
            if (tname, sname) in self:  # it adopts its task's batch size (Trainer.set_batch_size) when next used
                ours = {**self[(tname, sname)].state_dict(), "batch_size": tasks[tname].batch_size}
            else:
                task, examples = tasks[tname], tasks[tname].linkedsets[sname].examples
                if examples is None:
                    continue  # load_state_dict's get_stream says what is missing
                ours = {"batch_size": task.batch_size, "numbuckets": task.numbuckets, "size": len(examples)}
            check_stream_state(sst, ours, f"task {tname!r}, linked set {sname!r}: ",
                               f"; trainer.set_batch_size({tname!r}, {sst.get('batch_size')}) first makes them agree")

    def load_state_dict(self, state: Mapping[str, Any], tasks: Mapping[str, Any],
                        declared: Mapping[str, int] | None = None) -> None:
        """Restore positions of the streams whose task and linked set ``tasks`` still has (``declared``: see
        :meth:`check_state_dict`). A stream saved before it adopted its task's new batch size comes back at the
        batch size it was saved with and adopts the task's at its next draw, as it would have."""
        self.check_state_dict(state, tasks, declared)
        for key, sst in state.items():
            tname, sname = key.split("/", 1)
            if tname in tasks and sname in tasks[tname].linkedsets:
                stream = self.get_stream(tasks[tname], sname)
                saved = int(sst.get("batch_size", stream.batch_size))
                if declared is not None and declared.get(tname) is not None and saved != stream.batch_size:
                    stream.cut(saved)
                stream.load_state_dict(sst)


def check_stream_state(state: Mapping[str, Any], ours: Mapping[str, Any], where: str = "",
                       batch_fix: str = "") -> None:
    """Refuse a saved stream position taken with other settings than ``ours`` (batch size, buckets, list size);
    ``batch_fix`` ends the message of a batch size that differs (how to make them agree)."""
    for key in ("batch_size", "numbuckets", "size"):
        if key in state and state[key] != ours[key]:
            raise ConfigError(f"{where}stream state has {key}={state[key]} but this stream has {ours[key]}; "
                              "restore it into a stream built with the same data and settings"
                              + (batch_fix if key == "batch_size" else ""))


def derived_seed(seed: int, *names: str) -> int:
    """A stable per-stream seed from the trainer seed and names (independent of PYTHONHASHSEED)."""
    return (int(seed) * 7919 + zlib.crc32("/".join(names).encode())) % (2**31)
