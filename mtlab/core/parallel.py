"""Where the step core meets data parallelism: one object that wraps each call of the trainer.

Every call after the minibatches (each call of the chain, and ``apply``) starts with ``trainer.parallel.enter``:
the ranks agree on the call and its tasks, the tasks it covers are chosen (a PhaseError names the call that
comes first), and at the first call after the minibatches (``chain.reducing_call()``) the accumulators are
summed over the ranks. Alone (no reducer) only the choice is made, and the reduction only refuses to train
each rank alone when a process group is up. With a reducer (``mtlab.distributed.attach`` installs
``AllReduce``) the step equals one process over the union of the ranks' minibatches.

>>> trainer.parallel.rank, trainer.parallel.world_size  # doctest: +SKIP
(0, 1)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from ..base.errors import ConfigError
from ..tasks.sampling import Streams
from .accumulator import Accumulator, Reducer
from .transforms import Chain

_ALONE = nullcontext()  # one_agreement on one process (reusable: it holds nothing)


class Parallel:
    """The trainer's data-parallel strategy: which shard it reads, agreement on calls, reduction of accumulators."""

    def __init__(self, streams: Streams, local_only: bool = False) -> None:
        self.streams = streams
        self.reducer: Reducer | None = None  # the reduction hook (``mtlab.distributed.attach`` installs it)
        self.local_only = local_only  # built with distributed=False: a process group does not concern it
        self.rank, self.world_size = 0, 1
        self.agreed = False  # inside step(): the ranks agreed on the whole cycle once, at its start

    def set_shard(self, rank: int, world_size: int) -> None:
        """Read shard ``rank`` of ``world_size`` of every linked set (data parallel); before any stream is used."""
        if self.streams:
            raise ConfigError("set_shard() must come before the first minibatch is drawn")
        self.rank, self.world_size = self.streams.shard = (int(rank), int(world_size))

    def enter(self, call: str, task: str | None, accs: Mapping[str, Accumulator], chain: Chain,
              reduces: bool) -> dict[str, Accumulator]:
        """Start ``call``: agree with the other ranks, choose the tasks it covers and, when it ``reduces``, sum
        their accumulators over the ranks. Returns the chosen accumulators."""
        if self.reducer is None:  # one process (the usual case): choose, and refuse a process group left out
            chosen = chain.select(call, task, accs)
            if reduces and not self.local_only and torch.distributed.is_available() \
                    and torch.distributed.is_initialized():
                self.reduce(call, chosen)
            return chosen
        if not self.agreed:
            self.agree(call, task, accs, chain, reduces)
        chosen = chain.select(call, task, accs)
        if reduces:
            self.reduce(call, chosen)
        return chosen

    def agree(self, call: str, task: str | None, accs: Mapping[str, Accumulator], chain: Chain, reduces: bool,
              within: str | None = None) -> None:
        # The ranks agree on the call and its tasks before any local check or collective, so a mismatch fails on
        # every rank at once instead of leaving one waiting; the reducer may adopt a task that only other ranks
        # accumulated.
        agree = getattr(self.reducer, "agree", None)  # optional in the Reducer protocol
        if agree is not None:
            agree(call, task, accs, {n: chain.next_call(a) for n, a in accs.items()}, reduces=reduces, within=within)

    def one_agreement(self, accs: Mapping[str, Accumulator], chain: Chain) -> AbstractContextManager[None]:
        """``step()``'s cycle: agree once at its start (``within="step"``), not again at each call inside (one
        process: nothing to agree on)."""
        return _ALONE if self.reducer is None else self._agreement(accs, chain)

    @contextmanager
    def _agreement(self, accs: Mapping[str, Accumulator], chain: Chain) -> Iterator[None]:
        self.agree(chain.reducing_call(), None, accs, chain, reduces=True, within="step")
        self.agreed = True
        try:
            yield
        finally:
            self.agreed = False

    def reduce(self, call: str, accs: Mapping[str, Accumulator]) -> None:
        """Sum ``accs`` over the ranks (with a reducer); refuse to train each rank alone under a process group."""
        if self.reducer is not None:
            self.reducer.reduce(call, accs)
        elif not self.local_only and torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise ConfigError("a torch.distributed process group is up but this trainer would train each rank alone: "
                              "call mtlab.distributed.attach(trainer) first, or build it with distributed=False")
