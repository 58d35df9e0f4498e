"""Exact data-parallel accumulation on ``torch.distributed``: the trainer's reduction hook.

Each rank reads its own shard of every linked set and accumulates locally, with no communication per
minibatch. At ``normalize`` the trainer calls its reducer: each task's flat gradient buffer and its
(loss, normalizer) totals are summed over the ranks (SUM), so the result equals one process that saw the
union of the ranks' minibatches. A model no task uses keeps ``grad None`` everywhere.

>>> trainer = mtlab.Trainer(models, tasks)          # under torchrun, after init_process_group
>>> mtlab.distributed.attach(trainer)                # shards the data, checks every rank built the same
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from .accumulator import Accumulator
from .errors import ConfigError, MtlabError
from .trainer import Trainer


class DistributedError(MtlabError, RuntimeError):
    """Ranks that disagree or stopped answering."""


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) without one."""
    if not active():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def fingerprint(trainer: Trainer) -> str:
    """A hash of what must match across ranks: tasks, parameters and their shapes, settings."""
    desc: dict[str, Any] = {
        "tasks": {n: [list(t.linkedsets), t.batch_size, t.numbuckets, trainer.plans[n].model_names]
                  for n, t in trainer.tasks.items()},
        "params": {n: list(p.shape) for n, p in trainer.params.items()},
        "settings": [trainer.numbatches_to_aggregate, trainer.normalize_gradients, trainer.nonfinite,
                     trainer.acc_steps, trainer.seed],
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def check_consistent(trainer: Trainer) -> None:
    """Every rank must build the same trainer; otherwise say which ranks differ."""
    mine = fingerprint(trainer)
    everyone: list[Any] = [None] * trainer.world_size
    try:
        dist.all_gather_object(everyone, {"fingerprint": mine, "world_size": trainer.world_size})
    except RuntimeError as exc:
        raise DistributedError(f"rank {trainer.rank}: could not reach the other ranks at start-up ({exc})") from exc
    prints = [e["fingerprint"] for e in everyone]
    if len(set(prints)) > 1:
        groups: dict[str, list[int]] = {}
        for r, fp in enumerate(prints):
            groups.setdefault(fp, []).append(r)
        raise ConfigError(
            f"ranks built different trainers (recipe, models or settings differ): ranks grouped by trainer "
            f"{list(groups.values())}; start every rank with the same recipe"
        )


class AllReduce:
    """The reducer ``attach`` installs: sums each task's flat buffers and totals over the ranks."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def reduce(self, call: str, accs: Mapping[str, Accumulator]) -> None:
        for name, acc in accs.items():
            try:
                for buf in acc.buffers:
                    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                dist.all_reduce(acc.totals, op=dist.ReduceOp.SUM)
            except RuntimeError as exc:
                raise DistributedError(
                    f"rank {self.rank}: the all-reduce of task {name!r} at {call} failed "
                    f"({str(exc).splitlines()[0]}); another rank probably stopped or died: see its log. "
                    "The run cannot continue; resume from the last checkpoint") from exc


def attach(trainer: Trainer) -> Trainer:
    """Make ``trainer`` data parallel over the default process group: each rank reads its own shard of every
    linked set, and ``normalize`` sums the accumulators over the ranks. Every rank must build the same trainer."""
    if not active():
        raise ConfigError("mtlab.distributed.attach() needs torch.distributed.init_process_group() first "
                          "(torchrun does it for `python -m mtlab train`)")
    rank, world_size = world()
    trainer.set_shard(rank, world_size)
    trainer.reducer = AllReduce(rank, world_size)
    check_consistent(trainer)
    return trainer


def attach_if_distributed(trainer: Trainer) -> Trainer:
    """``attach`` when a process group with more than one rank is up (as under torchrun); else nothing."""
    if active() and world()[1] > 1:
        attach(trainer)
    return trainer
