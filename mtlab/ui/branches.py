"""The branches of a dashboard ("fork here"): each a trainer forked from the one the dashboard drives, kept by
name with the step it was forked at; one of them selected, its lines drawn on the live plot beside the run's.
A ``Controller`` holds one ``Branches`` and offers the commands (fork, continue, switch, compare, drop); this
part only keeps the data and reads a branch's curves. Plain Python: no widgets."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from ..core.columns import parse_column
from .runs import Run

if TYPE_CHECKING:
    from ..core.trainer import Trainer

Series = tuple[list[float], list[float]]
BRANCH_KINDS = ("loss", "grad_norm")  # a branch's lines on the live plot: each task's loss and gradient norm


def branch_series(trainer: Trainer, from_step: int) -> dict[str, Series]:
    """A branch's own curves: each task's loss and gradient norm from the fork's step on (the shared past is
    the run's own line)."""
    out: dict[str, Series] = {}
    for row in trainer.log.rows():
        step = row.get("step")
        if not isinstance(step, (int, float)) or step < from_step:
            continue
        for key, value in row.items():
            c = parse_column(str(key))
            if c.kind in BRANCH_KINDS and c.task and not c.linkedset and not c.group \
                    and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                xs, ys = out.setdefault(str(key), ([], []))
                xs.append(float(step))
                ys.append(float(value))
    return out


class Branches:
    """Name -> forked trainer, the step each was forked at, the selected one and each branch's background run.
    ``driven`` names the trainer the dashboard drives (``"main"`` until a switch)."""

    def __init__(self) -> None:
        self.trainers: dict[str, Trainer] = {}
        self.fork_steps: dict[str, int] = {}
        self.runs: dict[str, Run] = {}
        self.selected: str | None = None
        self.driven = "main"
        self.lock = threading.Lock()

    def __contains__(self, name: object) -> bool:
        return name in self.trainers

    def new_name(self) -> str:
        i = len(self.trainers) + 1
        while f"branch-{i}" in self.trainers or f"branch-{i}" == self.driven:
            i += 1
        return f"branch-{i}"

    def add(self, name: str, trainer: Trainer, step: int) -> None:
        with self.lock:
            self.trainers[name] = trainer
            self.fork_steps[name] = int(step)
            self.selected = name

    def remove(self, name: str) -> Trainer:
        with self.lock:
            trainer = self.trainers.pop(name)
            self.fork_steps.pop(name, None)
            self.runs.pop(name, None)
            if self.selected == name:
                self.selected = next(iter(self.trainers), None)
            return trainer

    def running(self, name: str) -> bool:
        run = self.runs.get(name)
        return run is not None and run.alive

    def labels(self) -> tuple[tuple[str, str], ...]:
        """``(label, name)`` of each branch for the selector: ``branch-1: from step 12, now 20 (training)``."""
        with self.lock:
            return tuple((f"{n}: from step {self.fork_steps[n]}, now {t.step_count}"
                          + (" (training)" if self.running(n) else ""), n) for n, t in self.trainers.items())

    def series(self) -> tuple[str | None, dict[str, Series]]:
        """The selected branch's name and curves (``branch_series``), or ``(None, {})``."""
        with self.lock:
            name = self.selected
            trainer = self.trainers.get(name) if name is not None else None
            step = self.fork_steps.get(name, 0) if name is not None else 0
        if trainer is None:
            return None, {}
        return name, branch_series(trainer, step)
