"""Where the step core meets data parallelism: one object the trainer consults before its calls.

The trainer asks its ``Parallel`` to ``agree`` first thing in ``normalize``, ``clip`` and ``apply`` (``step()``
once for its whole cycle) and to ``reduce`` at the first call after the minibatches. Alone (no reducer) both
are local: ``reduce`` only refuses to train each rank alone when a process group is up. With a reducer
(``mtlab.distributed.attach`` installs ``AllReduce``), ranks check that they make the same call and sum their
accumulators, so the step equals one process over the union of their minibatches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from ..base.errors import ConfigError
from .accumulator import Accumulator, Reducer


class Parallel:
    """The trainer's data-parallel strategy: agreement on calls and reduction of accumulators."""

    def __init__(self, local_only: bool = False) -> None:
        self.reducer: Reducer | None = None
        self.local_only = local_only  # built with distributed=False: a process group does not concern it
        self.rank, self.world_size = 0, 1
        self.agreed = False  # inside step(): the ranks agreed on the whole cycle once, at its start

    def agree(self, call: str, task: str | None, accs: Mapping[str, Accumulator], next_calls: Mapping[str, str],
              reduces: bool, within: str | None = None) -> None:
        # The ranks agree on the call and its tasks before any local check or collective, so a mismatch fails on
        # every rank at once instead of leaving one waiting; the reducer may adopt a task that only other ranks
        # accumulated.
        agree = getattr(self.reducer, "agree", None)
        if agree is not None and not self.agreed:
            agree(call, task, accs, next_calls, reduces=reduces, within=within)

    @contextmanager
    def one_agreement(self, call: str, accs: Mapping[str, Accumulator], next_calls: Mapping[str, str]) -> Iterator[None]:
        """``step()``'s cycle: agree once at its start (``within="step"``), not again at each call inside."""
        self.agree(call, None, accs, next_calls, reduces=True, within="step")
        self.agreed = self.reducer is not None
        try:
            yield
        finally:
            self.agreed = False

    def reduce(self, accs: Mapping[str, Accumulator]) -> None:
        """Sum ``accs`` over the ranks (with a reducer); refuse to train each rank alone under a process group."""
        if self.reducer is not None:
            self.reducer.reduce("normalize", accs)
        elif not self.local_only and torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise ConfigError("a torch.distributed process group is up but this trainer would train each rank alone: "
                              "call mtlab.distributed.attach(trainer) first, or build it with distributed=False")
