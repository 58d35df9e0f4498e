"""Endless, reproducible, length-bucketed minibatch streams (one per linked set).

Utterances are sorted by length and cut into ``numbuckets`` groups of (nearly) equal size.
Each epoch, every bucket is shuffled and cut into batches, and the order of all batches is
shuffled, from a generator seeded by ``(seed, epoch)``: the same seed gives the same batches,
every utterance appears exactly once per epoch, and no batch mixes buckets. ``numbuckets=1``
is plain shuffled batching. The position (epoch, batch index) can be saved and restored exactly.
What the examples are, and the views of them a stage trains on, is :mod:`mtlab.tasks.sources`'s.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..base.batching import Batch, collate
from ..base.errors import ConfigError, DataError, MtlabError
from .loaders import FIX as LOADER_FIX, LoaderStream, check_loader_state, is_loader, unreproducible
# What a linked set's examples are and the views of them: .sources. These names were defined here up to 0.3
# (``mtlab.tasks.sampling.SegmentedExamples``, ``mtlab.sampling.DataSource``) and are re-exported for that.
from .sources import (AudioItems as AudioItems, DataSource as DataSource, EpochSource as EpochSource,
                      ExampleSource as ExampleSource, Failed as Failed, HeadExamples as HeadExamples,
                      SegmentedExamples as SegmentedExamples, SegmentedSource as SegmentedSource, Skipped as Skipped,
                      StreamedSource as StreamedSource, lengths_of as lengths_of, reads_audio as reads_audio,
                      shard_parts as shard_parts, streamed as streamed, tell_epoch as tell_epoch,
                      trainset_fraction as trainset_fraction)


class DataWorkerError(MtlabError, RuntimeError):
    """A data-loading worker died (killed, out of memory, crashed in native code); the message names the stream."""


def collate_kept(items: Sequence[Any]) -> tuple[Batch | Failed | None, list[Skipped]]:
    """Collate the items that are not :class:`Skipped`; returns (batch or None when none is left, the skipped).
    An item that :class:`Failed` takes the batch's place (the stream raises its error)."""
    failed = next((x for x in items if isinstance(x, Failed)), None)
    if failed is not None:
        return failed, []
    skipped = [x for x in items if isinstance(x, Skipped)]
    kept = [x for x in items if not isinstance(x, Skipped)]
    return (collate(kept) if kept else None), skipped


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

    def get_stream(self, task: Any, linkedset: str) -> Any:
        """The stream of ``task.linkedsets[linkedset]`` (``task`` is a ``mtlab.Task``): a :class:`BatchStream`, or a
        :class:`~mtlab.tasks.loaders.LoaderStream` for a linked set that draws from a DataLoader (whose batch size
        is the loader's: a task's batch size does not change it)."""
        key = (task.name, linkedset)
        stream = self.get(key)
        if stream is not None and stream.batch_size != task.batch_size and isinstance(stream, BatchStream):
            stream.set_batch_size(task.batch_size)  # Trainer.set_batch_size: from this draw
        if key not in self:
            ls = task.linkedsets[linkedset]
            if ls.examples is None:
                raise ConfigError(f"linked set {linkedset!r} of task {task.name!r} has no examples; pass "
                                  "batch=(data, seq_lengths) to process_minibatch or give LinkedSet(examples)")
            if is_loader(ls.examples):
                self[key] = LoaderStream(ls.examples, ls.fields, ls.loader_origin,
                                         where=f"task {task.name!r}, linked set {linkedset!r}: ")
                return self[key]
            self[key] = BatchStream(ls.examples, task.batch_size, task.numbuckets,
                                    seed=derived_seed(self.seed, task.name, linkedset), num_workers=ls.num_workers,
                                    pin_memory=self.pin_memory, shard=self.shard, device=self.device)
        return self[key]

    def state_dict(self) -> dict[str, Any]:
        """Every stream's position, for a checkpoint. A linked set whose DataLoader's position cannot be restored
        (shuffled by torch's global generator) is refused, naming it and the fix."""
        out = {f"{t}/{s}": dict(st.state_dict()) for (t, s), st in self.items()}
        for key, st in out.items():
            if st.get("reproducible") is False:
                task, linkedset = key.split("/", 1)
                raise ConfigError(f"task {task!r}, linked set {linkedset!r}: its DataLoader's position cannot be "
                                  f"saved: {st['why']}, so a resume, fork or replay would draw other batches. "
                                  f"To save, fork or replay this run, {LOADER_FIX}")
        return out

    def check_reproducible(self, tasks: Mapping[str, Any], what: str) -> None:
        """Refuse, before ``what`` (``"replay()"``) starts, a linked set whose DataLoader cannot give the same
        batches again, naming it and the fix."""
        for tname, task in tasks.items():
            for sname, ls in task.linkedsets.items():
                why = unreproducible(ls.examples) if is_loader(ls.examples) else None
                if why is not None:
                    raise ConfigError(f"{what}: task {tname!r}, linked set {sname!r}: {why}, so its batches would "
                                      f"differ from the run's; {LOADER_FIX}")

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
            examples = tasks[tname].linkedsets[sname].examples
            if is_loader(examples) or sst.get("kind") == "loader":
                where = f"task {tname!r}, linked set {sname!r}: "
                if not is_loader(examples):
                    raise ConfigError(f"{where}the saved position is a DataLoader's, but this linked set draws from "
                                      "examples; restore it into a trainer built with the same linked sets")
                stream = self.get((tname, sname))
                check_loader_state(sst, stream if isinstance(stream, LoaderStream) else LoaderStream(examples),
                                   where)
                if sst.get("reproducible") is False:
                    raise ConfigError(f"{where}the saved position of its DataLoader cannot be restored: "
                                      f"{sst.get('why')}; {LOADER_FIX}")
                continue
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
                if isinstance(stream, LoaderStream):
                    stream.load_state_dict(sst)
                    continue
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
