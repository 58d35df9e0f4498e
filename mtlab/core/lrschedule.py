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


class LrScaler:
    """The ``lr`` knob over an optimizer's own hyperparameters: reads the base lr from the first param group
    (divided by that group's ratio to the optimizer's ``defaults["lr"]`` when it was built), and moving it
    multiplies every group's lr, and a scheduler's base lrs, by the same factor. With ``acc_steps`` (one
    optimizer per task, each stepped with lr × task weight) it keeps the value itself, as the original did."""

    def __init__(self, optimizers: list[Any], own: float | None = None) -> None:
        self.optimizers = optimizers
        self.schedulers: list[Any] = []
        self.own = own
        self.ratios: list[list[float]] = []
        for opt in optimizers:
            base = opt.defaults.get("lr") if opt is not None else None
            if base is None or not float(base) > 0:
                raise ConfigError(f"{type(opt).__name__} has no positive default lr (defaults['lr'] = {base!r}); "
                                  "give the optimizer an lr, e.g. torch.optim.SGD(params, lr=0.1)")
            self.ratios.append([float(g["lr"]) / float(base) for g in opt.param_groups])

    def _anchor(self) -> tuple[Any, int]:
        opt = self.optimizers[0]
        ratios = self.ratios[0]
        i = next((i for i, r in enumerate(ratios) if r > 0), 0)
        return opt, i

    def read(self) -> float:
        """The base lr now (scheduled and knobbed)."""
        if self.own is not None:
            return self.own
        opt, i = self._anchor()
        ratio = self.ratios[0][i]
        lr = float(opt.param_groups[i]["lr"])
        return lr if ratio == 1.0 else lr / ratio

    def write(self, value: float) -> None:
        """Scale every group (and every scheduler's base lrs) so that the base lr reads ``value``."""
        if self.own is not None:
            self.own = value
            return
        current = self.read()
        if current == value:
            return
        for opt in self.optimizers:
            opt.defaults["lr"] = value
            for g in opt.param_groups:
                g["lr"] = value * (float(g["lr"]) / current) if current > 0 else value
                if "initial_lr" in g:
                    g["initial_lr"] = value * (float(g["initial_lr"]) / current) if current > 0 else value
        factor = value / current if current > 0 else 1.0
        for sch in self.schedulers:
            if hasattr(sch, "base_lrs"):
                sch.base_lrs = [b * factor for b in sch.base_lrs]
            if hasattr(sch, "min_lrs"):  # ReduceLROnPlateau's floor scales with the rest
                sch.min_lrs = [m * factor for m in sch.min_lrs]

    def group_lrs(self) -> list[float]:
        """Every group's lr now (of the first optimizer)."""
        return [float(g["lr"]) for g in self.optimizers[0].param_groups] if self.own is None else [self.own]
