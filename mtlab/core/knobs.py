"""The accumulation knobs of a trainer: minibatch rounds per step (K) per task and batch size per task.

Each knob change is applied in one place (the ``set_*`` methods here) and announced as a trainer event
(``minibatches_per_step``, ``batch_size``), so a dashboard, a journal or a logger can follow it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tasks.task import check_count

if TYPE_CHECKING:
    from ..tasks.task import Task
    from .events import Events


class AccumulationKnobs:
    """Mixed into ``Trainer``: reads ``tasks``, ``events``, ``step_count``, ``task()``; owns ``_k_default`` and
    ``_k_task``."""

    tasks: dict[str, Task]
    events: Events
    step_count: int
    _k_default: int
    _k_task: dict[str, int]

    if TYPE_CHECKING:
        def task(self, task: str) -> Task: ...  # the Trainer's

    @property
    def numbatches_to_aggregate(self) -> int:
        """Minibatch rounds per step of every task without its own (``set_minibatches_per_step``); setting
        it sets every task's, as ``set_minibatches_per_step(k)`` does."""
        return self._k_default

    @numbatches_to_aggregate.setter
    def numbatches_to_aggregate(self, value: int) -> None:
        self.set_minibatches_per_step(value)

    @property
    def minibatches_per_step(self) -> dict[str, int]:
        """Task -> minibatch rounds (each active linked set once) that ``step()`` accumulates (K)."""
        return {n: self._k_task.get(n, self._k_default) for n in self.tasks}

    def set_minibatches_per_step(self, k: int, task: str | None = None) -> None:
        """Minibatch rounds per step (K) of ``task`` (None: every task, and the default), from the next
        ``step()`` on; a step in progress keeps the rounds it started with.

        >>> trainer.set_minibatches_per_step(4, "a")  # task a: 4 rounds, the others keep theirs  # doctest: +SKIP
        """
        check_count(k, "minibatches per step" if task is None else f"minibatches per step of task {task!r}",
                    "minibatch rounds accumulated before each apply(); e.g. set_minibatches_per_step(2)")
        before = self.minibatches_per_step
        if task is None:
            self._k_default = k
            self._k_task.clear()
        else:
            self.task(task)
            self._k_task[task] = k
        if self.minibatches_per_step != before:
            self.events.emit("minibatches_per_step", {"task": task, "k": k, "step": self.step_count})

    def set_batch_size(self, task: str, batch_size: int) -> None:
        """Examples per minibatch of ``task``'s linked sets, from the next minibatch drawn on. Each stream keeps
        its epoch and its place in it (the same share of the epoch), re-cut into batches of the new size."""
        t = self.task(task)
        check_count(batch_size, f"batch size of task {task!r}",
                    f"examples per minibatch; e.g. set_batch_size({task!r}, 8)")
        if t.batch_size != batch_size:
            t.batch_size = batch_size  # the streams adopt it when they next draw (in the training thread)
            self.events.emit("batch_size", {"task": task, "batch_size": batch_size, "step": self.step_count})
