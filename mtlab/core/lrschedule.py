"""A torch LR scheduler of the user's, stepped by the trainer: ``Trainer(scheduler=lambda opt: StepLR(opt, 10))``.

The scheduler is built on ``trainer.optimizer`` and stepped once per ``apply()``, after the optimizer step (as
a plain loop calls ``scheduler.step()`` after ``optimizer.step()``). It writes the param groups' lrs, which
are what the optimizer reads: the history's ``lr`` column reads them back. Its ``state_dict`` is part of the
trainer's, so a resumed run, a fork and a replay continue the schedule exactly.

The ``lr`` knob scales the schedule: moving it multiplies every group's lr and the scheduler's base lrs by
the same factor, so the change stays in force through the scheduler's next steps (``mtlab.core.knobs.LrScaler``).
``ReduceLROnPlateau`` is stepped with the step's loss (the sum over tasks of Σloss/Σnormalizer); to step it on a
validation loss instead, build it yourself on ``trainer.optimizer`` and call its ``step(metric)``.
A scheduler you build on ``trainer.optimizer`` and step by hand works as in plain PyTorch (the history shows
its lrs); it is yours to save and restore.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..base.errors import ConfigError

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class Schedulers:
    """The trainer's scheduler (``Trainer(scheduler=...)``), or none; a piece of the trainer's state."""

    def __init__(self, trainer: Any, factory: SchedulerFactory | None) -> None:
        self.factory = factory
        self.scheduler: Any = None
        if factory is None:
            return
        if not callable(factory):
            raise ConfigError(f"scheduler= must be a function optimizer -> torch LR scheduler, got "
                              f"{type(factory).__name__}; e.g. scheduler=lambda opt: torch.optim.lr_scheduler."
                              "StepLR(opt, step_size=10, gamma=0.5)")
        if trainer.optimizer is None:
            raise ConfigError("scheduler= needs the single optimizer; acc_steps steps one optimizer per task "
                              "(build each task's schedule into the lr knob instead)")
        sch = factory(trainer.optimizer)
        if not callable(getattr(sch, "step", None)) or not callable(getattr(sch, "state_dict", None)):
            raise ConfigError(f"scheduler=: the function returned {type(sch).__name__}, which has no step() and "
                              "state_dict(); return a torch.optim.lr_scheduler scheduler built on the optimizer "
                              "it is given")
        if getattr(sch, "optimizer", trainer.optimizer) is not trainer.optimizer:
            raise ConfigError("scheduler=: the scheduler was built on another optimizer; build it on the one the "
                              "function is given: scheduler=lambda opt: torch.optim.lr_scheduler.X(opt, ...)")
        self.scheduler = sch
        trainer.lr_scaler.schedulers.append(sch)

    @property
    def plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def step(self, loss: Callable[[], float]) -> None:
        """After an optimizer step: one scheduler step (``loss()``, read only for ``ReduceLROnPlateau``)."""
        sch = self.scheduler
        if sch is None:
            return
        if self.plateau:
            sch.step(loss())
        else:
            sch.step()

    def state_dict(self) -> dict[str, Any]:
        """``{}`` without a scheduler; else its class and its own ``state_dict()``."""
        sch = self.scheduler
        if sch is None:
            return {}
        state = {k: v for k, v in sch.state_dict().items() if not callable(v)}
        return {"type": type(sch).__name__, "state": state}

    def check_state(self, state: Any, source: str) -> None:
        """Refuse a state this scheduler cannot take, naming both (changes nothing)."""
        if not isinstance(state, Mapping):
            raise ConfigError(f"{source}: 'scheduler' must be a mapping")
        saved = state.get("type")
        ours = None if self.scheduler is None else type(self.scheduler).__name__
        if saved != ours:
            raise ConfigError(f"{source} was saved with scheduler {saved or 'none'} and this trainer has "
                              f"{ours or 'none'}; build the trainer with the same scheduler= to continue it")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back a ``state_dict()`` (checked with ``check_state`` first)."""
        if self.scheduler is not None and state:
            self.scheduler.load_state_dict(dict(state["state"]))
