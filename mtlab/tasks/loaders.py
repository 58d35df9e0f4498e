"""A linked set drawn from one's own ``torch.utils.data.DataLoader``: ``mtlab.LinkedSet(loader)``.

Each draw is the loader's next batch; at its end a new epoch begins (``iter(loader)`` again, as a plain loop
does). The loader's batch size, sampler, ``collate_fn`` and workers decide what a batch is; a batch may be

- ``(data, seq_lengths)`` as ``mtlab.collate`` makes it (``DataLoader(..., collate_fn=mtlab.collate)``);
- a dict of batched tensors (the default ``collate_fn`` on dict examples): every entry full length;
- a tuple or list of batched tensors (a ``TensorDataset``), named by ``LinkedSet(loader, fields=("x", "y"))``.

A stream owns the state of the loader's generators (swapped in around its calls, as the trainer does with
torch's global one), so a fork or a second trainer drawing from the same loader changes nothing here. Its
position saves and restores exactly: torchdata's ``StatefulDataLoader`` through its ``state_dict``; a plain
DataLoader whose order is reproducible (a seeded ``generator``, a sequential sampler, or a sampler with its
own generator or ``set_epoch``) by the generator states at the start of the epoch and the count of batches
drawn, re-iterated to that count on restore. A loader whose order cannot be re-created (shuffled by torch's
global generator) trains as it is, and is refused where its position would have to be restored (a save, a
fork, a replay) with an error that names the fix. The last few batches are kept, so going back a few draws
(a refused minibatch, a peek at the next one) reads nothing again.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from ..base.batching import Batch, as_entry
from ..base.errors import BatchError, ConfigError

KEEP = 8  # batches kept for going back without reading them again
FIX = ("build the DataLoader with a seeded generator (DataLoader(..., shuffle=True, "
       "generator=torch.Generator().manual_seed(0))), or use torchdata's StatefulDataLoader, whose state_dict "
       "holds its position")


def is_loader(obj: Any) -> bool:
    """True for a ``torch.utils.data.DataLoader`` (torchdata's ``StatefulDataLoader`` is one)."""
    return isinstance(obj, DataLoader)


def is_stateful(loader: Any) -> bool:
    """True for a loader that saves and restores its own position (``state_dict``/``load_state_dict``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _samplers(loader: DataLoader) -> list[Any]:
    batch_sampler = loader.batch_sampler
    parts = [loader, loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None)]
    return [p for p in parts if p is not None]


def loader_generators(loader: DataLoader) -> list[torch.Generator]:
    """The generators a loader draws from (its own, its sampler's, its batch sampler's), each once."""
    out: list[torch.Generator] = []
    for part in _samplers(loader):
        g = getattr(part, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not h for h in out):
            out.append(g)
    return out


def unreproducible(loader: DataLoader) -> str | None:
    """Why iterating ``loader`` again would not give the same batches (None: it would), in words."""
    if is_stateful(loader):
        return None
    if isinstance(loader.dataset, IterableDataset):
        return "it reads an IterableDataset, whose position a DataLoader cannot restore"
    for part in _samplers(loader)[1:]:
        if isinstance(part, (SequentialSampler, BatchSampler, list, tuple, range)):
            continue  # a BatchSampler's own sampler is checked as the next part
        if isinstance(getattr(part, "generator", None), torch.Generator) or callable(getattr(part, "set_epoch", None)):
            continue
        if isinstance(part, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)):
            return f"its {type(part).__name__} shuffles with torch's global generator (no generator= given)"
        return (f"its sampler {type(part).__name__} has neither a generator nor set_epoch, so the order of an "
                "epoch drawn again is unknown")
    return None


_FIELDS: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()


def name_fields(loader: DataLoader, fields: Sequence[str] | None) -> None:
    """Remember the names ``LinkedSet(loader, fields=...)`` gave a loader's tuple batches (for evaluation)."""
    if fields is not None:
        _FIELDS[loader] = tuple(fields)


def loader_fields(loader: DataLoader) -> tuple[str, ...] | None:
    """The names a linked set gave the entries of this loader's tuple batches, or None."""
    return _FIELDS.get(loader)


def loader_origin(loader: DataLoader) -> list[Tensor]:
    """The states of the loader's generators now: where every stream of the linked set starts."""
    return [g.get_state() for g in loader_generators(loader)]


def as_batch(raw: Any, fields: Sequence[str] | None, where: str = "") -> Batch:
    """A loader's batch as ``(data, seq_lengths)``: see the module docstring for the forms taken."""
    if (isinstance(raw, (tuple, list)) and len(raw) == 2 and isinstance(raw[0], Mapping)
            and isinstance(raw[1], Mapping)):
        data, lengths = raw
        return ({k: as_entry(v) for k, v in data.items()}, {k: as_entry(v) for k, v in lengths.items()})
    if isinstance(raw, (tuple, list)):
        if fields is None:
            raise BatchError(f"{where}the DataLoader gives batches as a {type(raw).__name__} of {len(raw)}; name its "
                             "entries with mtlab.LinkedSet(loader, fields=(" + ", ".join(
                                 repr(f"x{k}") for k in range(len(raw))) + ")), or build the loader with "
                             "collate_fn=mtlab.collate over dict examples")
        if len(raw) != len(fields):
            raise BatchError(f"{where}the DataLoader's batches have {len(raw)} entries but fields names "
                             f"{len(fields)} ({list(fields)}); give one name per entry")
        raw = dict(zip(fields, raw))
    if not isinstance(raw, Mapping):
        raise BatchError(f"{where}the DataLoader gives batches as a {type(raw).__name__}; give (data, seq_lengths) "
                         "as mtlab.collate makes them (collate_fn=mtlab.collate), a dict of batched tensors, or a "
                         "tuple of them named with LinkedSet(loader, fields=(...))")
    data = {k: as_entry(v) for k, v in raw.items()}
    lengths = {}
    for k, v in data.items():
        if isinstance(v, Tensor) and v.dim() >= 1:  # [B]: one value an example (length 1); [B, T, ...]: T each
            n = 1 if v.dim() == 1 else int(v.shape[1])
            lengths[k] = torch.full((int(v.shape[0]),), n, dtype=torch.long)
    return data, lengths


class LoaderStream:
    """The endless stream of a linked set's DataLoader: ``next(stream)`` is its next batch as ``(data,
    seq_lengths)``; ``state_dict``/``load_state_dict``/``seek`` as a :class:`~mtlab.tasks.sampling.BatchStream`'s.

    Examples:
        >>> loader = DataLoader(dataset, batch_size=4, shuffle=True, collate_fn=mtlab.collate,
        ...                     generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
        >>> stream = LoaderStream(loader)  # doctest: +SKIP
        >>> state = stream.state_dict(); a = next(stream)  # doctest: +SKIP
        >>> stream.load_state_dict(state); b = next(stream)  # the same batch  # doctest: +SKIP
    """

    def __init__(self, loader: DataLoader, fields: Sequence[str] | None = None,
                 origin: Sequence[Tensor] | None = None, where: str = "") -> None:
        if not is_loader(loader):
            raise ConfigError(f"{where}expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
        self.loader: Any = loader
        self.source = loader
        self.fields = None if fields is None else tuple(fields)
        self.where = where
        self.stateful = is_stateful(loader)
        self.why_not = unreproducible(loader)  # None: the position can be restored
        self.generators = loader_generators(loader)
        states = list(origin) if origin is not None and len(origin) == len(self.generators) else \
            loader_origin(loader)
        self._states = [s.clone() for s in states]  # this stream's generator states, as they stand
        self._epoch_states = [s.clone() for s in states]  # ... at the start of the epoch
        self.epoch = 0
        self.position = 0  # batches of this epoch given out
        self.skipped: list[dict[str, Any]] = []
        self._it: Any = None
        self._drawn = 0  # batches of this epoch the live iterator gave
        self._kept: dict[int, tuple[Batch, Any]] = {}  # position -> (batch, the loader's state before it)
        self._resume: Mapping[str, Any] | None = None  # a stateful loader's state to open the iterator from

    # ------------------------------------------------------------------ what the trainer reads
    @property
    def batch_size(self) -> int | None:
        """The loader's batch size (its own: a task's ``batch_size`` does not change it)."""
        return self.loader.batch_size

    @property
    def reproducible(self) -> bool:
        """True when the position can be restored anywhere (a save, a fork, a replay)."""
        return self.why_not is None

    def __len__(self) -> int:
        """Batches per epoch (the loader's ``len``)."""
        return len(self.loader)

    def __iter__(self) -> LoaderStream:
        return self

    def __repr__(self) -> str:
        return f"LoaderStream({type(self.loader).__name__}, epoch {self.epoch}, batch {self.position})"

    # ------------------------------------------------------------------ drawing
    def _own(self, fn: Any) -> Any:
        """``fn()`` with this stream's generator states in the loader's generators (theirs back afterwards)."""
        gens = self.generators
        if not gens:
            return fn()
        theirs = [g.get_state() for g in gens]
        for g, s in zip(gens, self._states):
            g.set_state(s)
        try:
            return fn()
        finally:
            self._states = [g.get_state() for g in gens]
            for g, s in zip(gens, theirs):
                g.set_state(s)

    def _open(self) -> None:
        """Start the iterator of this epoch at ``position``: fresh at an epoch's start, else from the saved state
        (a StatefulDataLoader) or by drawing the batches before it again, outside the run's random numbers (their
        draws were made when those batches were first drawn)."""
        loader = self.loader
        for part in _samplers(loader)[1:]:
            if callable(getattr(part, "set_epoch", None)):
                part.set_epoch(self.epoch)
        if self.position == 0 and self._resume is None:
            self._states = [s.clone() for s in self._epoch_states]
            if self.stateful:
                loader.load_state_dict({})  # a fresh iterator of its own, whatever another stream left there
            self._it = self._own(lambda: self._iterator())
            self._drawn = 0
            return
        if self.stateful and self._resume is None:
            raise ConfigError(f"{self.where}no saved state of the StatefulDataLoader for batch {self.position} of "
                              f"epoch {self.epoch}; restore a state that stream.state_dict() gave")
        if not self.stateful and self.why_not is not None:
            raise ConfigError(f"{self.where}cannot go back to batch {self.position} of epoch {self.epoch} of this "
                              f"DataLoader: {self.why_not}. To resume, fork or replay such a run, {FIX}")
        with torch.random.fork_rng(devices=[]):
            if self.stateful:
                resume, self._resume, saved = self._resume, None, [s.clone() for s in self._states]
                loader.load_state_dict(dict(resume or {}))
                self._it = self._own(lambda: self._iterator())
                if resume:  # the loader's state re-made what its iterator drew: the generators go on as saved
                    self._states = saved
            else:
                self._states = [s.clone() for s in self._epoch_states]
                self._it = self._own(lambda: self._iterator())
                for k in range(self.position):
                    try:
                        self._own(lambda: next(self._it))
                    except StopIteration:
                        self._close()
                        raise ConfigError(f"{self.where}the DataLoader gave {k} batches in epoch {self.epoch}, the "
                                          f"saved position is batch {self.position}; restore it with the same "
                                          "dataset and loader settings") from None
        self._drawn = self.position

    def _iterator(self) -> Any:
        loader = self.loader
        fresh = getattr(loader, "_get_iterator", None)  # torch's, as the stream's closing reaches its workers
        if loader.persistent_workers and loader.num_workers > 0 and not self.stateful and fresh is not None:
            return fresh()  # its own workers: iter() would reset the one iterator the loader shares with a fork
        return iter(loader)

    def __next__(self) -> Batch:
        """The next batch; a new epoch when the loader is exhausted. A draw that raises leaves the position as
        it was (the next draw reads that batch again) where the position can be restored."""
        if self.position < self._drawn:  # gone back: from the kept batches
            kept = self._kept.get(self.position)
            if kept is not None:
                self.position += 1
                return kept[0]
            self._close()  # not kept: the iterator opens at the position
        for _ in range(2):
            if self._it is None:
                self._open()
            before = self._it.state_dict() if self.stateful else None
            try:
                raw = self._own(lambda: next(self._it))
            except StopIteration:
                if self._drawn == 0:
                    self._close()
                    raise ConfigError(f"{self.where}the DataLoader gives no batch (len(dataset) "
                                      f"{_dataset_len(self.loader)}, batch_size {self.loader.batch_size}, drop_last "
                                      f"{self.loader.drop_last}); give it examples or a smaller batch size") from None
                self._new_epoch()
                continue
            except BaseException:
                if self.why_not is None:
                    self._resume = before
                    self._close()  # the next draw opens it again at this position
                else:
                    self.position = self._drawn = self._drawn + 1  # its order cannot be re-created: past it
                raise
            batch = as_batch(raw, self.fields, self.where)
            self._kept[self._drawn] = (batch, before)
            self._kept.pop(self._drawn - KEEP, None)
            self._drawn += 1
            self.position = self._drawn
            return batch
        raise ConfigError(f"{self.where}the DataLoader gives no batch")  # pragma: no cover (an empty epoch raises)

    def _new_epoch(self) -> None:
        self._close()
        self.epoch += 1
        self.position = self._drawn = 0
        self._kept.clear()
        self._resume = None
        self._epoch_states = [s.clone() for s in self._states]

    def _close(self) -> None:
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None and not (self.loader.persistent_workers and it is getattr(self.loader, "_iterator", None)):
            try:
                shutdown()
            except RuntimeError:
                pass
        if it is not None:
            self._drawn = self.position if self.position < self._drawn else self._drawn
            self._kept = {p: v for p, v in self._kept.items() if p < self._drawn}

    # ------------------------------------------------------------------ position
    def state_dict(self) -> dict[str, Any]:
        """The position: epoch and batch, with the loader's own state (a StatefulDataLoader) or this epoch's
        generator states (a plain DataLoader). ``reproducible`` is False, with ``why``, for a loader whose
        position cannot be restored outside this stream's memory (``Streams.state_dict`` refuses it)."""
        state: dict[str, Any] = {"kind": "loader", "epoch": self.epoch, "position": self.position,
                                 "loader_type": type(self.loader).__name__}
        if self.stateful:
            if self.position < self._drawn and self.position in self._kept:
                state["loader"] = self._kept[self.position][1]
            elif self._it is not None:
                state["loader"] = self._it.state_dict()
            elif self._resume is not None or self.position == 0:
                state["loader"] = dict(self._resume or {})
            state["generators"] = [s.clone() for s in self._states]  # as they stand: the loader's state has the rest
        else:
            state["epoch_generators"] = [s.clone() for s in self._epoch_states]  # drawn again to the position
        if self.why_not is not None:
            state.update(reproducible=False, why=self.why_not)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a position :meth:`state_dict` gave (its next batch is the one that followed it)."""
        check_loader_state(state, self, self.where)
        epoch, position = int(state["epoch"]), int(state["position"])
        if (epoch == self.epoch and position <= self._drawn and self._it is not None
                and all(p in self._kept for p in range(position, self._drawn))):
            self.position = position  # a few draws back: the kept batches come again
            return
        if self.why_not is not None:  # not restorable: refused now, before anything moved
            raise ConfigError(f"{self.where}cannot restore the position (epoch {epoch}, batch {position}) of this "
                              f"DataLoader: {self.why_not}. To resume, fork or replay such a run, {FIX}")
        self._close()
        self.epoch, self.position, self._drawn = epoch, position, position
        self._kept.clear()
        if self.stateful:
            self._resume = state.get("loader")
            self._states = [s.clone() for s in state["generators"]]
            self._epoch_states = [s.clone() for s in self._states]
        else:
            self._epoch_states = [s.clone() for s in state["epoch_generators"]]

    def seek(self, epoch: int, position: int) -> None:
        """Go back to batch ``position`` of ``epoch`` (a refused minibatch: the next draw gives that batch again)."""
        if (epoch, position) == (self.epoch, self.position):
            return
        self.load_state_dict({**self.state_dict(), "epoch": epoch, "position": position})

    def set_batch_size(self, batch_size: int) -> None:
        """Refused: the loader's own batch size decides."""
        raise ConfigError(f"{self.where}the batch size of a linked set drawn from a DataLoader is the loader's "
                          f"({self.loader.batch_size}); build the DataLoader with batch_size={batch_size}")


def _dataset_len(loader: DataLoader) -> str:
    try:
        return str(len(loader.dataset))  # type: ignore[arg-type]
    except TypeError:
        return "unknown"


def check_loader_state(state: Mapping[str, Any], stream: LoaderStream, where: str = "") -> None:
    """Refuse a saved position that is not a loader stream's, or one taken from another kind of loader."""
    if state.get("kind") != "loader":
        raise ConfigError(f"{where}the saved position is a stream of examples, but this linked set draws from a "
                          "DataLoader; restore it into a trainer built with the same linked sets")
    if state.get("loader_type", type(stream.loader).__name__) != type(stream.loader).__name__ or \
            ("generators" if stream.stateful else "epoch_generators") not in state:
        raise ConfigError(f"{where}the saved position is of a {state.get('loader_type')}, this linked set draws from "
                          f"a {type(stream.loader).__name__}; restore it with the same kind of loader")
    saved = state.get("generators" if stream.stateful else "epoch_generators", [])
    if len(saved) != len(stream.generators):
        raise ConfigError(f"{where}the saved position holds {len(saved)} generator states, "
                          f"this DataLoader draws from {len(stream.generators)}; build it as the saved run did "
                          "(the same sampler and generator=)")
