"""Exact data-parallel accumulation on ``torch.distributed``: the trainer's reduction hook.

Each rank reads its own shard of every linked set and accumulates locally, with no communication per
minibatch. At ``normalize`` the trainer calls its reducer: each task's flat gradient buffer and its
(loss, normalizer) totals are summed over the ranks (SUM), so the result equals one process that saw the
union of the ranks' minibatches. A model no task uses keeps ``grad None`` everywhere.

Examples:
    >>> trainer = mtlab.Trainer(models, tasks)          # under torchrun, after init_process_group  # doctest: +SKIP
    >>> # shards the data, checks every rank built the same
    >>> mtlab.distributed.attach(trainer)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..core.accumulator import Accumulator
from ..base.errors import ConfigError, MtlabError
from ..core.trainer import Trainer
from ..core.transforms import Call


class DistributedError(MtlabError, RuntimeError):
    """Ranks that disagree or stopped answering."""


def active() -> bool:
    """Whether a default process group is initialized (data-parallel training)."""
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
    everyone: list[Any] = [None] * trainer.parallel.world_size
    try:
        dist.all_gather_object(everyone, {"fingerprint": mine, "world_size": trainer.parallel.world_size})
    except RuntimeError as exc:
        raise DistributedError(f"rank {trainer.parallel.rank}: could not reach the other ranks at start-up ({exc})") from exc
    prints = [e["fingerprint"] for e in everyone]
    if len(set(prints)) > 1:
        groups: dict[str, list[int]] = {}
        for r, fp in enumerate(prints):
            groups.setdefault(fp, []).append(r)
        raise ConfigError(
            f"ranks built different trainers (recipe, models or settings differ): ranks grouped by trainer "
            f"{list(groups.values())}; start every rank with the same recipe"
        )


CALLS = tuple(str(c) for c in Call)  # the trainer's own call names (0.2's list); a chain may add its own


def call_code(call: str) -> int:
    """A number every rank gives the same call name (any call of any chain: a hash of the name)."""
    return zlib.crc32(str(call).encode()) % (1 << 30)


def check_same_start(trainer: Trainer, source: str) -> None:
    """After a restart every rank must continue from the same step; otherwise say which rank read what."""
    if trainer.parallel.world_size == 1 or not active():
        return
    everyone: list[Any] = [None] * trainer.parallel.world_size
    dist.all_gather_object(everyone, [trainer.step_count, source])
    if len({step for step, _ in everyone}) > 1:
        seen = "; ".join(f"rank {r}: step {step} from {src}" for r, (step, src) in enumerate(everyone))
        raise DistributedError(f"the ranks restarted from different steps ({seen}); every node must see the same "
                               "experiment folder (a shared filesystem) to resume together")


class AllReduce:
    """The reducer ``attach`` installs.

    ``agree`` runs first in every ``normalize``, ``clip`` and ``apply``: one small all-gather in which each rank
    says which call it makes, for which task, and where each of its tasks stands. Different calls (or, at
    ``clip``/``apply``, tasks in different places) raise :class:`DistributedError` on every rank, naming each
    rank's call and tasks, before anything changes. At ``normalize`` a task that some ranks accumulated and
    others did not is adopted (zeros) by the others, so ``reduce`` sums it everywhere: the step equals one
    process over the union of every rank's minibatches. ``reduce`` sums each task's flat buffers, its
    (loss, normalizer) totals and per-linked-set totals over the ranks; ``minibatches`` becomes the count
    over every rank.
    """

    def __init__(self, rank: int, world_size: int, linkedsets: Mapping[str, Sequence[str]] | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.linkedsets = {t: tuple(s) for t, s in (linkedsets or {}).items()}  # task -> linked set names, in order
        self._counts: dict[str, int] = {}  # task -> minibatches over every rank (from the last agreement)
        self._present: dict[str, set[str]] = {}  # task -> linked sets some rank accumulated

    # ------------------------------------------------------------------ agreement
    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _gather(self, row: list[int], call: str) -> list[list[int]]:
        mine = torch.tensor(row, dtype=torch.int64, device=self._device())
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            dist.all_gather(everyone, mine)
        except RuntimeError as exc:
            raise DistributedError(
                f"rank {self.rank}: the ranks could not agree on {call}() ({str(exc).splitlines()[0]}); another rank "
                "probably stopped or died, or never made this call: see its log. The run cannot continue; resume "
                "from the last checkpoint") from exc
        return torch.stack(everyone).tolist()

    def agree(self, call: str, task: str | None, accs: Mapping[str, Accumulator], next_calls: Mapping[str, str],
              reduces: bool, within: str | None = None) -> None:
        """Check every rank makes this call on the same tasks (one all-gather); at the call that ``reduces`` (the
        chain's first), adopt tasks that other ranks accumulated. ``within`` names the call this one opens
        (``"step"``: the ranks agree once for the whole cycle). Raises :class:`DistributedError` on every rank
        when they differ, naming each rank's call."""
        names = list(accs)
        sets = {t: self.linkedsets.get(t, ()) for t in names}
        row = [call_code(within or call), -1 if task is None else (names.index(task) if task in names else -2)]
        for t in names:
            row += [call_code(next_calls[t]), accs[t].minibatches]
        row += [int(s in accs[t].set_totals) for t in names for s in sets[t]]
        rows = self._gather(row, within or call)
        width = 2 + 2 * len(names)
        if any(len(r) != len(row) for r in rows) or len({tuple(r[:2]) for r in rows}) > 1:
            raise self._mismatch(within or call, rows, names, next_calls, "different calls")
        code = call_code
        if not reduces:
            if len({tuple(r[2:width:2]) for r in rows}) > 1:
                raise self._mismatch(call, rows, names, next_calls, "tasks in different places")
            return
        targets = names if task is None else [task] if task in names else []
        chosen: dict[str, int] = {}
        for t in targets:
            i = 2 + 2 * names.index(t)
            at = [r[i] for r in rows]
            if code(call) not in at:
                continue
            if any(c not in (code(call), code(Call.PROCESS_MINIBATCH)) for c in at):
                raise self._mismatch(within or call, rows, names, next_calls, f"task {t!r} already past {call} on some ranks")
            chosen[t] = sum(r[i + 1] for r in rows if r[i] == code(call))
        offset = width
        for t in names:
            if t in chosen:
                self._counts[t] = chosen[t]
                self._present[t] = {s for j, s in enumerate(sets[t]) if any(r[offset + j] for r in rows)}
            offset += len(sets[t])
        for t, total in chosen.items():
            if next_calls[t] == Call.PROCESS_MINIBATCH:
                accs[t].adopt(total)  # zeros here; the reduction brings the other ranks' sums

    def _mismatch(self, call: str, rows: list[list[int]], names: list[str], next_calls: Mapping[str, str],
                  what: str) -> DistributedError:
        # The names this rank knows (the calls of its chain that its tasks are at, and the trainer's own); a
        # call only another rank makes is described as unknown.
        known = {call_code(c): str(c) for c in (*Call, *next_calls.values(), call)}

        def describe(r: list[int]) -> str:
            name = known.get(r[0], "an unknown call")
            arg = "" if r[1] == -1 else repr(names[r[1]]) if r[1] >= 0 else "an unknown task"
            tasks = [f"{t} ({r[3 + 2 * i]} minibatches, next {known.get(r[2 + 2 * i], '?')})"
                     for i, t in enumerate(names) if r[2 + 2 * i] != call_code(Call.PROCESS_MINIBATCH)]
            return f"{name}({arg}) with tasks {', '.join(tasks) if tasks else 'none accumulated'}"

        lines = "; ".join(f"rank {i}: {describe(r)}" for i, r in enumerate(rows))
        return DistributedError(
            f"rank {self.rank}: the ranks made different stepwise calls ({what}), so none was made and nothing "
            f"changed: {lines}. Every rank must call normalize/clip/apply together, on the same task (tasks "
            "accumulated on some ranks only are fine at normalize); reset() on every rank to start the step again")

    # ------------------------------------------------------------------ reduction
    def reduce(self, call: str, accs: Mapping[str, Accumulator]) -> None:
        """Sum each task's buffers and totals over the ranks, in place (every rank passes the same tasks)."""
        for name, acc in accs.items():
            sets = self.linkedsets.get(name, ())
            present = self._present.pop(name, set(acc.set_totals))
            zero = torch.zeros(2, dtype=torch.float64, device=acc.totals.device)
            packed = torch.cat([acc.totals.reshape(2), *(acc.set_totals.get(s, zero) for s in sets)])
            try:
                for buf in acc.buffers:
                    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                dist.all_reduce(packed, op=dist.ReduceOp.SUM)
            except RuntimeError as exc:
                raise DistributedError(
                    f"rank {self.rank}: the all-reduce of task {name!r} at {call} failed "
                    f"({str(exc).splitlines()[0]}); another rank probably stopped or died: see its log. "
                    "The run cannot continue; resume from the last checkpoint") from exc
            summed = {s: packed[2 + 2 * j:4 + 2 * j].clone() for j, s in enumerate(sets) if s in present}
            acc.take_reduced(packed[:2], summed, sets, self._counts.pop(name, None))


def attach(trainer: Trainer) -> Trainer:
    """Make ``trainer`` data parallel over the default process group: each rank reads its own shard of every
    linked set, and ``normalize`` sums the accumulators over the ranks. Every rank must build the same trainer."""
    if not active():
        raise ConfigError("mtlab.training.distributed.attach() needs torch.distributed.init_process_group() first "
                          "(torchrun does it for `python -m mtlab train`)")
    rank, world_size = world()
    trainer.parallel.set_shard(rank, world_size)
    trainer.parallel.reducer = AllReduce(rank, world_size, {n: list(t.linkedsets) for n, t in trainer.tasks.items()})
    check_consistent(trainer)
    return trainer


def attach_if_distributed(trainer: Trainer) -> Trainer:
    """``attach`` when a process group with more than one rank is up (as under torchrun); else nothing."""
    if active() and world()[1] > 1:
        attach(trainer)
    return trainer
