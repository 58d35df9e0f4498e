"""A run's checkpoints: the trainer's state (``mtlab.core.state``) with the schedule and the recipe, and periodic
``latest.pt`` files.

Periodic checkpoints: ``latest.pt`` in the experiment folder every N steps, written at a step boundary, so a
killed run (or a torchrun group restarting after a worker died) continues exactly from there.

Examples:
    >>> periodic = mtlab.checkpoint.Periodic(exp, "exp/run", every=50).attach()  # doctest: +SKIP
    >>> mtlab.run(exp, expdir="exp/run")          # latest.pt at steps 50, 100, ...  # doctest: +SKIP
    >>> mtlab.checkpoint.resume_point("exp/run")  # the checkpoint a restart continues from  # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Mapping

import torch.distributed as dist

from ..core.events import Event, Payload, RunEndInfo, StepInfo, ValidationInfo
from ..core.state import CheckpointError, load_safe
from .distributed import active
from ..base.errors import ConfigError

if TYPE_CHECKING:
    from ..core.trainer import Trainer
    from .schedule import Schedule

LATEST = "latest.pt"


class Periodic:
    """A trainer listener that saves ``expdir/latest.pt`` after every ``every``-th step of a run, and at the first
    step boundary ``minutes`` after the last checkpoint (0: neither).

    It listens to the loop's ``step`` event. When the loop validates at that same step, the checkpoint waits for
    the ``validation`` event, so it holds the validation's decisions (learning-rate halving, go-back) too and a
    restart does not redo them. Data parallel: rank 0 writes (every rank holds the same state); the folder must
    be one every node can read for a multi-node restart. The clock counts only in one process: ranks would
    disagree on the moment, so a data-parallel run checkpoints by ``every`` alone.
    """

    def __init__(self, experiment: Any, expdir: str | Path, every: int = 0, minutes: float = 0.0) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ConfigError(f"Periodic: every must be a number of steps >= 0 (0: not by steps), got {every!r} "
                              "(checkpoint_frequency = 0 in a recipe means no checkpoints by steps)")
        if not isinstance(minutes, (int, float)) or isinstance(minutes, bool) or not 0 <= minutes < float("inf"):
            raise ConfigError(f"Periodic: minutes must be a number >= 0 (0: not by time), got {minutes!r} "
                              "(checkpoint_minutes = 0 in a recipe turns the timed checkpoint off)")
        if not every and not minutes:
            raise ConfigError("Periodic: every (steps) or minutes must be positive; with neither nothing is written")
        self.experiment, self.path, self.every = experiment, Path(expdir) / LATEST, every
        self.minutes = float(minutes) if self.trainer.parallel.world_size == 1 else 0.0
        self.pending: int | None = None  # a step whose checkpoint waits for its validation
        self.last = time.monotonic()  # when the last checkpoint was written (or the listener attached)

    @property
    def trainer(self) -> Any:
        """The trainer whose state is written."""
        return getattr(self.experiment, "trainer", self.experiment)

    @property
    def schedule(self) -> Any:
        """The experiment's schedule (None for a bare trainer, whose own ``schedule`` is something else)."""
        return None if self.experiment is self.trainer else getattr(self.experiment, "schedule", None)

    def attach(self) -> Periodic:
        """Start writing ``latest.pt`` every ``every`` steps (and ``minutes``)."""
        self.last = time.monotonic()
        self.trainer.add_callback(self)
        return self

    def detach(self) -> None:
        """Stop writing periodic checkpoints."""
        if self in self.trainer.callbacks:
            self.trainer.remove_callback(self)

    def save(self) -> Path | None:
        """Write ``latest.pt`` now (rank 0; other ranks return None). Every rank must call it (it gathers each
        rank's RNG and data positions, which ``restore_rank_state`` gives back to the same rank)."""
        self.pending = None
        trainer, schedule = self.trainer, self.schedule
        recipe = getattr(self.experiment, "recipe", None)
        extra: dict[str, Any] = {"ranks": rank_states(trainer)}
        if recipe is not None:
            extra["recipe"] = dict(recipe)
        if schedule is not None:
            extra["schedule"] = schedule.state_dict(include_best=schedule.go_back)
        written = trainer.save(self.path, extra=extra)
        self.last = time.monotonic()
        return written

    def due(self, step: int) -> bool:
        """Whether ``step`` gets a checkpoint: a multiple of ``every``, or ``minutes`` passed since the last one."""
        by_steps = bool(self.every) and step % self.every == 0
        return by_steps or (bool(self.minutes) and time.monotonic() - self.last >= 60 * self.minutes)

    def __call__(self, event: Event, info: Payload) -> None:
        if isinstance(info, StepInfo):
            if self.pending is not None:  # the validation of that step never came (no held-out data)
                self.save()
            step = info.step
            if not self.due(step):
                return
            schedule = self.schedule
            validates = schedule is not None and schedule.valid_frequency and step % schedule.valid_frequency == 0
            if validates:
                self.pending = step
            else:
                self.save()
        elif isinstance(info, ValidationInfo) and self.pending is not None and info.step == self.pending:
            self.save()
        elif isinstance(info, RunEndInfo) and self.pending is not None:
            self.save()


def rank_states(trainer: Trainer) -> list[dict[str, Any]]:
    """Each rank's RNG state and data positions, in rank order (one all-gather when data parallel): ranks draw
    different noise and, with the stepwise API, may draw different numbers of minibatches."""
    mine = {"rng": trainer.rng.state_dict(), "streams": trainer.streams.state_dict()}
    if trainer.parallel.world_size == 1 or not active():
        return [mine]
    everyone: list[Any] = [None] * trainer.parallel.world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def restore_rank_state(trainer: Trainer, path: str | Path) -> bool:
    """Give this rank back its own RNG and data positions from a checkpoint ``Periodic`` wrote; False (nothing
    changed) when the checkpoint has none or was written by another number of ranks."""
    ranks = load_safe(path).get("ranks")
    if not isinstance(ranks, list) or len(ranks) != trainer.parallel.world_size:
        return False
    mine = ranks[trainer.parallel.rank]
    trainer.streams.load_state_dict(mine["streams"], trainer.tasks)
    trainer.rng.load_state_dict(mine["rng"])
    return True


def _at_boundary(state: dict[str, Any]) -> bool:
    """The checkpoint was taken between steps: no task holds part of a step (its data positions are exact)."""
    return all(t.get("phase") in ("empty", "applied") for t in state.get("tasks", {}).values())


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint a run continues from (``path`` None: none usable) and why, in words."""

    path: Path | None
    why: str


def choose_resume(expdir: str | Path, fallback: bool = True) -> ResumeChoice:
    """The checkpoint every resume path continues from (``mtlab resume``, a torchrun restart), and why.

    The latest state taken between steps: ``latest.pt`` (``checkpoint_frequency``) or ``final.pt``, whichever is
    further on (at the same step ``latest.pt``, which also holds each rank's RNG and data positions). A
    ``final.pt`` saved mid-step (a run stopped by an error) counts only when nothing else is there, then
    ``best.pt`` (``fallback``; a restart of a worker group never goes back to them). A checkpoint that cannot be
    read is passed over and named in ``why``."""
    expdir = Path(expdir)
    found: list[tuple[int, int, Path]] = []
    skipped: list[str] = []
    mid_step: Path | None = None
    for rank, name in enumerate((LATEST, "final.pt")):
        path = expdir / name
        if not path.is_file():
            continue
        try:
            state = load_safe(path)
        except CheckpointError as exc:
            skipped.append(f"{name} passed over: {exc}")
            continue
        if name == LATEST or _at_boundary(state):
            found.append((int(state["step"]), -rank, path))
        else:
            mid_step = path
    passed = f" ({'; '.join(skipped)})" if skipped else ""
    if found:
        step, _, path = max(found)
        others = [f"{p.name} at step {s}" for s, _, p in found if p != path]
        return ResumeChoice(path, f"{path} (step {step}, the latest checkpoint taken between steps"
                                  + (f"; {', '.join(others)} is older or the same" if others else "") + ")" + passed)
    if fallback and mid_step is not None:
        return ResumeChoice(mid_step, f"{mid_step} (saved in the middle of a step, the only checkpoint there)" + passed)
    best = expdir / "best.pt"
    if fallback and best.is_file():
        return ResumeChoice(best, f"{best} (the best validated state: neither latest.pt nor final.pt is there, a "
                                  "killed run?)" + passed)
    return ResumeChoice(None, f"no checkpoint in {expdir} (latest.pt, final.pt or best.pt)" + passed)


def resume_point(expdir: str | Path) -> Path | None:
    """The checkpoint a restarted run continues from: ``latest.pt``, or ``final.pt`` when that one is later and
    was taken between steps (a run that stopped on an error saves ``final.pt`` mid-step); None when neither
    (``choose_resume(expdir, fallback=False)``, which also says why)."""
    return choose_resume(expdir, fallback=False).path


def save_checkpoint(trainer: Trainer, schedule: Schedule | None, path: str | Path, include_best: bool = True,
                    recipe: Mapping[str, Any] | None = None) -> Path | None:
    """Atomic checkpoint of the trainer state plus its recipe and schedule (``mtlab.recipe.load`` reads it).
    Data parallel: rank 0 writes it (every rank holds the same state); other ranks return None."""
    extra: dict[str, Any] = {}
    if recipe is not None:
        extra["recipe"] = dict(recipe)
    if schedule is not None:
        extra["schedule"] = schedule.state_dict(include_best=include_best and schedule.keeps_best)
    return trainer.save(path, extra=extra)
