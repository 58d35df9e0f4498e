"""The knobs of a trainer: lr, clipping, weights, the combination method (``Knobs``), minibatch rounds per
step (K) per task and batch size per task (``AccumulationKnobs``).

Each setter checks its value in the caller's thread (a bad value is refused there, nothing changed), then
hands the change to ``command``: applied at once when no call of the trainer runs, else queued and applied by
the call in progress at its next knob read (``mtlab.core.scope``). Applying it changes the knob under
``journal.lock``, records it through one hook, ``record_change``, where it took effect, and announces it as a
trainer event, so a dashboard, a journal or a logger can follow it. A new knob is one setter and one event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..tasks.task import check_count, check_positive, check_relative_weights, check_weight
from .events import BatchSizeInfo, CombineInfo, Event, MinibatchesPerStepInfo, TaskWeightInfo, WeightInfo
from .noise import NoiseScale
from .transforms import Chain, ClipByGlobalNorm, ClipByHistory, ClipByValue, Normalize, Transform

if TYPE_CHECKING:
    from ..tasks.sampling import Streams
    from ..tasks.task import LinkedSet, Task
    from .events import Events
    from .journal import Journal
    from .precision import Precision
    from .scope import RunLock
    from .update import MethodSpec, PerTaskUpdate, Update


class AccumulationKnobs:
    """Mixed into ``Trainer``: reads ``tasks``, ``events``, ``step_count``, ``task()``; owns ``_k_default`` and
    ``_k_task``."""

    tasks: dict[str, Task]
    events: Events
    step_count: int
    _k_default: int
    _k_task: dict[str, int]
    journal: Journal

    if TYPE_CHECKING:
        def record_change(self, kind: str, **payload: Any) -> None: ...  # Knobs'

        def command(self, apply: Callable[[], None], what: str) -> None: ...  # Knobs'

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
        if task is not None:
            self.task(task)

        def apply() -> None:
            with self.journal.lock:  # step() reads the rounds under this lock
                before = self.minibatches_per_step
                if task is None:
                    self._k_default = k
                    self._k_task.clear()
                else:
                    self._k_task[task] = k
                changed = self.minibatches_per_step != before
                if changed:
                    self.record_change("minibatches_per_step", value=k, task=task)
            if changed:
                self.events.emit(Event.MINIBATCHES_PER_STEP,
                                 MinibatchesPerStepInfo(task=task, k=k, step=self.step_count))
        self.command(apply, f"minibatches per step {k}" + (f" of task {task!r}" if task is not None else ""))

    def set_batch_size(self, task: str, batch_size: int) -> None:
        """Examples per minibatch of ``task``'s linked sets, from the next minibatch drawn on. Each stream draws
        the examples of its epoch not yet drawn once each, in their order, in batches of the new size
        (``BatchStream.set_batch_size``)."""
        t = self.task(task)
        check_count(batch_size, f"batch size of task {task!r}",
                    f"examples per minibatch; e.g. set_batch_size({task!r}, 8)")

        def apply() -> None:
            if t.batch_size == batch_size:
                return
            with self.journal.lock:
                t.batch_size = batch_size  # the streams adopt it at their next draw (after the knobs were read)
                self.record_change("batch_size", task=task, value=batch_size)
            self.events.emit(Event.BATCH_SIZE, BatchSizeInfo(task=task, batch_size=batch_size, step=self.step_count))
        self.command(apply, f"batch size {batch_size} of task {task!r}")


class Knobs:
    """Settings of a :class:`~mtlab.core.trainer.Trainer` that a person changes while it trains. Mixed into
    ``Trainer``: reads the attributes and lookups declared here, which the Trainer sets and defines."""

    journal: Journal
    _journaling: bool
    lock: RunLock
    precision: Precision
    _noise_scale: NoiseScale | None
    chain: Chain
    step_count: int
    tasks: dict[str, Task]
    streams: Streams
    events: Events
    update: Update | PerTaskUpdate
    linkedset_weights: str

    if TYPE_CHECKING:
        def task(self, task: str) -> Task: ...  # the Trainer's

        def linkedset(self, task: str, linkedset: str) -> LinkedSet: ...  # the Trainer's

    @property
    def lr(self) -> float:
        """The learning rate of the next ``apply()`` (set it between calls; must be > 0)."""
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        value = check_positive(value, "lr")

        def apply() -> None:
            with self.journal.lock:
                changed = getattr(self, "_lr", None) != value
                self._lr = value
                if changed:
                    self.record_change("lr", value=value)
        self.command(apply, f"lr {value:g}")

    @property
    def noise_scale(self) -> NoiseScale | None:
        """The gradient noise scale measured at each step (``mtlab.NoiseScale``), or None. Attach one with
        ``trainer.noise_scale = mtlab.NoiseScale()`` (or True); the same checks as ``Trainer(noise_scale=...)``."""
        return self._noise_scale

    @noise_scale.setter
    def noise_scale(self, value: bool | NoiseScale | None) -> None:
        self._noise_scale = NoiseScale.build(value, self.precision.scaling)

    def record_change(self, kind: str, **payload: Any) -> None:
        """The one hook every setter calls after a change: an entry in ``trainer.journal``."""
        if self._journaling:
            self.journal.change(kind, self.step_count, **payload)

    def command(self, apply: Callable[[], None], what: str) -> None:
        """Make a checked knob change: now when no call of the trainer runs (or from inside the call's own
        thread), else queued in ``journal.pending`` for the call in progress, which applies it at its next knob
        read; ``what`` names it in ``pending_changes()`` meanwhile. Never waits for a step."""
        journal = self.journal
        if self.lock.acquire(blocking=False):
            try:
                if journal.pending:
                    journal.run_pending()  # those made before this one first
                apply()
            finally:
                self.lock.release()
            return
        source = journal.current_source()  # where it came from (the dashboard's thread), kept for its entry

        def later() -> None:
            with journal.source(source):
                apply()
        with journal.pending_lock:
            journal.pending.append((what, later))

    def pending_changes(self) -> list[str]:
        """The knob changes made while a call runs, waiting for its next knob read (e.g. "lr 0.001")."""
        with self.journal.pending_lock:
            return [what for what, _ in self.journal.pending]

    def _setting(self, kind: type[Transform], attr: str) -> float | None:
        t = self.chain.find(kind)
        return None if t is None else float(getattr(t, attr))

    @property
    def normalize_gradients(self) -> bool:
        """The chain holds ``Normalize`` (setting it adds or removes it, in its place)."""
        return self.chain.find(Normalize) is not None

    @normalize_gradients.setter
    def normalize_gradients(self, value: bool) -> None:
        self.set_clip(*self.clip_settings(), normalize=bool(value))

    @property
    def clip_grad_value(self) -> float | None:
        """Element-wise clipping bound (``ClipByValue`` in the chain), or None; setting it replaces that transform."""
        return self._setting(ClipByValue, "value")

    @clip_grad_value.setter
    def clip_grad_value(self, value: float | None) -> None:
        self._set_clip(value, *self.clip_settings()[1:])

    @property
    def clip_grad_norm(self) -> float | None:
        """Global-norm clipping bound per task (``ClipByGlobalNorm`` in the chain), or None."""
        return self._setting(ClipByGlobalNorm, "max_norm")

    @clip_grad_norm.setter
    def clip_grad_norm(self, value: float | None) -> None:
        current = self.clip_settings()
        self._set_clip(current[0], value, current[2])

    @property
    def clip_grad_percentile(self) -> float | None:
        """AutoClip: each task's global norm clipped to this percentile of its norm history
        (``ClipByHistory`` in the chain), or None."""
        return self._setting(ClipByHistory, "percentile")

    @clip_grad_percentile.setter
    def clip_grad_percentile(self, value: float | None) -> None:
        self._set_clip(*self.clip_settings()[:2], value)

    def clip_settings(self) -> tuple[float | None, float | None, float | None]:
        """(clip_grad_value, clip_grad_norm, clip_grad_percentile), read from the chain."""
        return (self._setting(ClipByValue, "value"), self._setting(ClipByGlobalNorm, "max_norm"),
                self._setting(ClipByHistory, "percentile"))

    def set_clip(self, value: float | None, norm: float | None = None, percentile: float | None = None,
                 normalize: bool | None = None) -> None:
        """Every clip setting at once (and ``normalize_gradients`` unless None): one journal entry."""
        self._set_clip(value, norm, percentile, normalize)

    def set_data_positions(self, positions: Mapping[str, Any]) -> None:
        """Move the data streams to ``positions`` (``trainer.streams.state_dict()``), e.g. to go on with the data
        that follow those already drawn after a go-back; journaled."""
        with self.journal.lock:
            self.streams.load_state_dict(positions, self.tasks)
            self.record_change("data_position", positions={k: dict(v) for k, v in positions.items()})

    def knobs_loaded(self) -> None:
        """After a state was loaded quietly: nothing to remember (the clip settings are read from the chain)."""

    def _set_clip(self, value: float | None, norm: float | None, percentile: float | None = None,
                  normalize: bool | None = None) -> None:
        """Replace the built-in transforms whose setting changes, each in its place; a user's transforms and an
        unchanged transform's state (AutoClip's norm history) are kept; one journal entry."""
        Chain.from_settings(bool(normalize), value, norm, percentile)  # checks each value first

        def apply() -> None:
            with self.journal.lock:
                before = (self.clip_settings(), self.normalize_gradients)
                chain = self.chain
                if normalize is not None and bool(normalize) != before[1]:
                    chain = chain.replaced(Normalize, Normalize() if normalize else None)
                for kind, old, new in ((ClipByValue, before[0][0], value), (ClipByGlobalNorm, before[0][1], norm),
                                       (ClipByHistory, before[0][2], percentile)):
                    wanted = None if new is None else float(new)
                    if wanted != old:
                        chain = chain.replaced(kind, None if wanted is None else kind(wanted))
                self.chain = chain
                after = (self.clip_settings(), self.normalize_gradients)
                if after != before:
                    clip = after[0]
                    self.record_change("clip", normalize=after[1], value=clip[0], norm=clip[1], percentile=clip[2])
        self.command(apply, f"clipping (value {value}, norm {norm}, percentile {percentile})")

    def set_weight(self, task: str, linkedset: str, weight: float) -> None:
        """Weight of a linked set, used from the next minibatch on (0 leaves the set out of step())."""
        ls = self.linkedset(task, linkedset)
        weight = check_weight(weight, f"weight of linked set {linkedset!r} of task {task!r}")
        if self.linkedset_weights == "relative":
            check_relative_weights(self.tasks[task], {linkedset: weight})

        def apply() -> None:
            with self.journal.lock:
                changed, ls.weight = ls.weight != weight, weight
                if changed:
                    self.record_change("weight", task=task, linkedset=linkedset, value=weight)
            self.events.emit(Event.WEIGHT, WeightInfo(task=task, linkedset=linkedset, weight=ls.weight))
        self.command(apply, f"weight {weight:g} of {task}/{linkedset}")

    def set_task_weight(self, task: str, weight: float) -> None:
        """Weight of a task in the combined update (0 leaves the task out of step() and apply())."""
        t = self.task(task)
        weight = check_weight(weight, f"weight of task {task!r}")

        def apply() -> None:
            with self.journal.lock:
                changed, t.weight = t.weight != weight, weight
                if changed:
                    self.record_change("task_weight", task=task, value=weight)
            self.events.emit(Event.TASK_WEIGHT, TaskWeightInfo(task=task, weight=t.weight))
        self.command(apply, f"weight {weight:g} of task {task}")

    def set_combine(self, method: MethodSpec) -> None:
        """How tasks' processed gradients become one direction, from the next apply() on: ``"sum"`` (the
        default), a ``mtlab.combine`` aggregator, a ``mtlab.weighting`` loss weighting, or both (``"dwa+upgrad"``)."""
        with self.lock, self.journal.lock:
            self.update.set_method(method)
            stored = self.update.method
            plain = stored is None or isinstance(stored, (str, Mapping))
            self.record_change("combine", method=dict(stored) if isinstance(stored, Mapping) else stored,
                                **({} if plain else {"replayable": False}))
            self.events.emit(Event.COMBINE, CombineInfo(method=self.update.method))
