"""The knobs of a trainer, as one table (``KNOBS``) and one way in (``Trainer.set``).

A knob is a row: its name, its scope (the trainer, a task, a task's linked set, or a task or all tasks), how
a value is checked, read and written, how a change is put into words, and how a dashboard shows it. Every
path that changes a knob goes through ``Trainer.set``: the public setters and properties (``trainer.lr =``,
``set_weight``, ``set_clip``, ...), the dashboard's controls, ``mtlab.replay`` (a journal entry is a ``set``),
and ``load_state_dict`` (a state's ``knobs``). So a change is checked the same way everywhere, applied at the
same point of the cycle (at once when no call runs, else at the running call's next knob read), recorded as
one journal entry named after the knob, and announced as one event (``Event.KNOB``, ``KnobInfo``).

Hyperparameters stay where PyTorch keeps them: the ``lr`` knob reads and scales the optimizer's
``param_groups`` (and a scheduler's base lrs), never a copy of its own. A new knob is one row::

    >>> from mtlab.core.knobs import KNOBS, Knob
    >>> KNOBS.add(Knob("label_smoothing", "trainer", default=0.0, doc="smoothing of the loss",
    ...                control=("linear", 0.0, 0.3)))  # doctest: +SKIP
    >>> trainer.set("label_smoothing", 0.1)  # doctest: +SKIP

plus the line where it acts (``trainer.get("label_smoothing")`` in a loss); a row with no ``read``/``write`` of
its own keeps its value in the trainer. Journal, events, replay, forks, checkpoints and the dashboard's
slider follow from the row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..base.errors import ConfigError
from .events import Event, KnobInfo
from .knobtable import KNOBS, Change, Knob, Rounds, change_words, differs, fmt, knob_keys, plain
from .lrschedule import LrScaler
from .noise import NoiseScale
from .transforms import IDLE, Chain, Normalize

if TYPE_CHECKING:
    from ..tasks.sampling import Streams
    from ..tasks.task import LinkedSet, Task
    from .events import Events
    from .journal import Journal
    from .precision import Precision
    from .scope import RunLock
    from .update import PerTaskUpdate, Update

__all__ = ["KNOBS", "Change", "Knob", "Knobs", "LrScaler", "Rounds", "change_words", "fmt", "knob_keys"]


class Knobs:
    """Mixed into ``Trainer``: ``set``/``get`` over the knob table, the public setters and properties as one-line
    wrappers, and how a change is made (``command``) and recorded (``record_change``)."""

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
    lr_scaler: LrScaler
    acc_steps: bool
    rounds: Rounds
    _own_knobs: dict[tuple[str, str | None, str | None], Any]

    if TYPE_CHECKING:
        def task(self, task: str) -> Task: ...  # the Trainer's

        def linkedset(self, task: str, linkedset: str) -> LinkedSet: ...  # the Trainer's

    # ------------------------------------------------------------------ the one way in
    def _where(self, knob: Knob, task: str | None, linkedset: str | None) -> None:
        """Refuse a task/linked set the knob's scope does not take, or that the trainer does not have."""
        name = knob.name
        if knob.scope == "trainer" and (task is not None or linkedset is not None):
            raise ConfigError(f"knob {name!r} is the trainer's, not a task's; call set({name!r}, value) "
                              "without task= or linkedset=")
        if knob.scope in ("task", "linkedset") and task is None:
            raise ConfigError(f"knob {name!r} needs task=" + (" and linkedset=" if knob.scope == "linkedset" else "")
                              + f"; e.g. set({name!r}, value, task={next(iter(self.tasks))!r}"
                              + (", linkedset=...)" if knob.scope == "linkedset" else ")"))
        if knob.scope != "linkedset" and linkedset is not None:
            raise ConfigError(f"knob {name!r} has no linked-set scope; call it without linkedset=")
        if knob.scope == "linkedset":
            if linkedset is None:
                raise ConfigError(f"knob {name!r} needs linkedset= (the task's linked sets: "
                                  f"{list(self.task(task).linkedsets)})")  # type: ignore[arg-type]
            self.linkedset(task, linkedset)  # type: ignore[arg-type]
        elif task is not None:
            self.task(task)

    def get(self, name: str, task: str | None = None, linkedset: str | None = None) -> Any:
        """A knob's value now (``get("weight", task="a", linkedset="noisy")``)."""
        knob = KNOBS.get_knob(name)
        self._where(knob, task, linkedset)
        return self._read(knob, task, linkedset)

    def _read(self, knob: Knob, task: str | None, linkedset: str | None) -> Any:
        if knob.read is not None:
            return knob.read(self, task, linkedset)
        return self._own_knobs.get((knob.name, task, linkedset), knob.default)

    def _write(self, knob: Knob, value: Any, task: str | None, linkedset: str | None) -> None:
        if knob.write is not None:
            knob.write(self, value, task, linkedset)
        else:
            self._own_knobs[(knob.name, task, linkedset)] = value

    def check_knob(self, name: str, value: Any, task: str | None = None, linkedset: str | None = None) -> Any:
        """The value ``set`` would store, or the ConfigError it would raise; changes nothing."""
        knob = KNOBS.get_knob(name)
        self._where(knob, task, linkedset)
        return knob.check(self, value, task, linkedset) if knob.check is not None else value

    def set(self, name: str, value: Any, task: str | None = None, linkedset: str | None = None) -> Change:
        """Set knob ``name`` (``mtlab.core.knobs.KNOBS``) of the trainer, of ``task``, or of ``task``'s
        ``linkedset``: checked now (a bad value is refused here, nothing changed), applied at once when no call
        runs, else at the running call's next knob read; one journal entry named after the knob, one
        ``Event.KNOB``. Returns where it takes effect.

        >>> trainer.set("lr", 2e-3)  # doctest: +SKIP
        >>> trainer.set("weight", 0.5, task="frames", linkedset="noisy")  # doctest: +SKIP
        >>> trainer.set("minibatches_per_step", 4)  # every task; task="a": task a only  # doctest: +SKIP
        """
        knob = KNOBS.get_knob(name)
        value = self.check_knob(name, value, task, linkedset)
        words = knob.words(value, task, linkedset)
        apply = (between_steps(self, lambda: self._apply_knob(knob, value, task, linkedset), words)
                 if knob.between_steps else lambda: self._apply_knob(knob, value, task, linkedset))
        pending = self.command(apply, words)
        return Change(name, value, task, linkedset, pending, self.step_count, knob.when, words)

    def _apply_knob(self, knob: Knob, value: Any, task: str | None, linkedset: str | None,
                    announce: bool = True) -> None:
        """Apply a checked change (a call of the trainer holds its lock, or none runs): write, record, announce."""
        with self.journal.lock:
            before = self._read(knob, task, linkedset)
            changed = differs(before, value)
            if changed:
                self._write(knob, value, task, linkedset)
                stored = self._read(knob, task, linkedset)
                if self._journaling:
                    payload: dict[str, Any] = {"value": plain(stored)}
                    if task is not None:
                        payload["task"] = task
                    if linkedset is not None:
                        payload["linkedset"] = linkedset
                    if knob.replayable is not None and not knob.replayable(stored):
                        payload["replayable"] = False
                    self.journal.change(knob.name, self.step_count, **payload)
        if changed and announce and self.events.listeners:
            self.events.emit(Event.KNOB, KnobInfo(name=knob.name, value=stored, task=task, linkedset=linkedset,
                                                  step=self.step_count, minibatch=self.journal.minibatch))

    def knobs(self) -> list[dict[str, Any]]:
        """Every knob of this trainer as ``{"name", "task", "linkedset", "value"}`` (a state's ``knobs``)."""
        return [{"name": name, "task": t, "linkedset": s, "value": plain(self._read(knob, t, s))}
                for name, knob in KNOBS.items() for t, s in knob_keys(self, knob)]

    def check_knobs(self, entries: Any, source: str = "the state") -> None:
        """Refuse a state's ``knobs`` that this trainer cannot take (unknown knob, task, value), naming the entry."""
        if not isinstance(entries, list):
            raise ConfigError(f"{source}: 'knobs' must be a list of {{name, task, linkedset, value}}")
        for e in entries:
            try:
                if not isinstance(e, Mapping):
                    raise ConfigError(f"not a mapping: {e!r}")
                if e.get("name") not in KNOBS:
                    raise ConfigError(f"unknown knob {e.get('name')!r} (the knobs: {list(KNOBS)})")
                self.check_knob(e["name"], e.get("value"), e.get("task"), e.get("linkedset"))
            except ConfigError as exc:
                raise ConfigError(f"{source}: knob entry {dict(e) if isinstance(e, Mapping) else e!r}: {exc}; "
                                  "load it into a trainer built from the same recipe") from None

    def load_knobs(self, entries: Sequence[Mapping[str, Any]], announce: bool = True) -> None:
        """Set every knob of a state (checked with ``check_knobs`` first), through the same path as ``set``
        (``announce=False``: no events, as when re-initialise keeps the knobs it had)."""
        for e in entries:
            knob = KNOBS[e["name"]]
            if knob.check is not None:
                value = knob.check(self, e.get("value"), e.get("task"), e.get("linkedset"))
            else:
                value = e.get("value")
            self._apply_knob(knob, value, e.get("task"), e.get("linkedset"), announce)

    def set_knobs(self, entries: Sequence[Mapping[str, Any]]) -> list[str]:
        """Set every knob of ``entries`` (``knobs()``'s list, taken earlier) that differs from now, each through
        ``set`` (journaled, as from wherever the call comes); what changed, in words."""
        now = {(e["name"], e["task"], e["linkedset"]): e["value"] for e in self.knobs()}
        changed = []
        for e in entries:
            key = (e["name"], e.get("task"), e.get("linkedset"))
            if key in now and differs(now[key], e.get("value")):
                changed.append(self.set(e["name"], e.get("value"), e.get("task"), e.get("linkedset")).words)
        return changed

    # ------------------------------------------------------------------ making and recording a change
    def record_change(self, kind: str, **payload: Any) -> None:
        """An entry in ``trainer.journal`` for what is not a knob (restore, fork, a schedule's stage)."""
        if self._journaling:
            self.journal.change(kind, self.step_count, **payload)

    def command(self, apply: Callable[[], None], what: str) -> bool:
        """Make a checked change: now when no call of the trainer runs (or from inside the call's own thread),
        else queued in ``journal.pending`` for the call in progress, which applies it at its next knob read;
        ``what`` names it in ``pending_changes()`` meanwhile. Never waits for a step. True when queued."""
        journal = self.journal
        if self.lock.acquire(blocking=False):
            try:
                if journal.pending:
                    journal.run_pending()  # those made before this one first
                apply()
            finally:
                self.lock.release()
            return False
        source = journal.current_source()  # where it came from (the dashboard's thread), kept for its entry

        def later() -> None:
            with journal.source(source):
                apply()
        with journal.pending_lock:
            journal.pending.append((what, later))
        return True

    def pending_changes(self) -> list[str]:
        """The knob changes made while a call runs, waiting for its next knob read (e.g. "lr 0.001")."""
        with self.journal.pending_lock:
            return [what for what, _ in self.journal.pending]

    # ------------------------------------------------------------------ the public setters: one line each
    @property
    def lr(self) -> float:
        """The base learning rate: the optimizer's (``defaults["lr"]`` when built; scheduled and knobbed since).
        Setting it scales every param group (and a scheduler's base lrs) by the same factor."""
        return float(self.lr_scaler.read())

    @lr.setter
    def lr(self, value: float) -> None:
        self.set("lr", value)

    @property
    def noise_scale(self) -> NoiseScale | None:
        """The gradient noise scale measured at each step (``mtlab.NoiseScale``), or None. Attach one with
        ``trainer.noise_scale = mtlab.NoiseScale()`` (or True); the same checks as ``Trainer(noise_scale=...)``."""
        return self._noise_scale

    @noise_scale.setter
    def noise_scale(self, value: bool | NoiseScale | None) -> None:
        self._noise_scale = NoiseScale.build(value, self.precision.scaling)

    @property
    def normalize_gradients(self) -> bool:
        """The chain holds ``Normalize`` (setting it adds or removes it, in its place)."""
        return self.chain.find(Normalize) is not None

    @normalize_gradients.setter
    def normalize_gradients(self, value: bool) -> None:
        self.set("normalize_gradients", bool(value))

    @property
    def clip_grad_value(self) -> float | None:
        """Element-wise clipping bound (``ClipByValue`` in the chain), or None; setting it replaces that transform."""
        return self.get("clip_grad_value")

    @clip_grad_value.setter
    def clip_grad_value(self, value: float | None) -> None:
        self.set("clip_grad_value", value)

    @property
    def clip_grad_norm(self) -> float | None:
        """Global-norm clipping bound per task (``ClipByGlobalNorm`` in the chain), or None."""
        return self.get("clip_grad_norm")

    @clip_grad_norm.setter
    def clip_grad_norm(self, value: float | None) -> None:
        self.set("clip_grad_norm", value)

    @property
    def clip_grad_percentile(self) -> float | None:
        """AutoClip: each task's global norm clipped to this percentile of its norm history
        (``ClipByHistory`` in the chain), or None."""
        return self.get("clip_grad_percentile")

    @clip_grad_percentile.setter
    def clip_grad_percentile(self, value: float | None) -> None:
        self.set("clip_grad_percentile", value)

    def clip_settings(self) -> tuple[float | None, float | None, float | None]:
        """(clip_grad_value, clip_grad_norm, clip_grad_percentile), read from the chain."""
        return self.clip_grad_value, self.clip_grad_norm, self.clip_grad_percentile

    def set_clip(self, value: float | None, norm: float | None = None, percentile: float | None = None,
                 normalize: bool | None = None) -> None:
        """Every clip setting at once (and ``normalize_gradients`` unless None); each is checked before any is
        set, and each that changes is one journal entry."""
        wanted = {"clip_grad_value": value, "clip_grad_norm": norm, "clip_grad_percentile": percentile}
        if normalize is not None:
            wanted["normalize_gradients"] = bool(normalize)
        for name, v in wanted.items():
            self.check_knob(name, v)
        for name, v in wanted.items():
            self.set(name, v)

    @property
    def numbatches_to_aggregate(self) -> int:
        """Minibatch rounds per step of every task without its own; setting it sets every task's."""
        return self.rounds.default

    @numbatches_to_aggregate.setter
    def numbatches_to_aggregate(self, value: int) -> None:
        self.set("minibatches_per_step", value)

    @property
    def minibatches_per_step(self) -> dict[str, int]:
        """Task -> minibatch rounds (each active linked set once) that ``step()`` accumulates (K)."""
        return {n: self.rounds.of(n) for n in self.tasks}

    def set_minibatches_per_step(self, k: int, task: str | None = None) -> None:
        """Minibatch rounds per step (K) of ``task`` (None: every task, and the default), from the next step."""
        self.set("minibatches_per_step", k, task=task)

    def set_batch_size(self, task: str, batch_size: int) -> None:
        """Examples per minibatch of ``task``'s linked sets, from the next minibatch drawn on."""
        self.set("batch_size", batch_size, task=task)

    def set_weight(self, task: str, linkedset: str, weight: float) -> None:
        """Weight of a linked set, used from the next minibatch on (0 leaves the set out of step())."""
        self.set("weight", weight, task=task, linkedset=linkedset)

    def set_task_weight(self, task: str, weight: float) -> None:
        """Weight of a task in the combined update (0 leaves the task out of step() and apply())."""
        self.set("task_weight", weight, task=task)

    def set_combine(self, method: Any) -> None:
        """How tasks' processed gradients become one direction, from the next apply() on: ``"sum"`` (the
        default), a ``mtlab.combine`` aggregator, a ``mtlab.weighting`` loss weighting, or both (``"dwa+upgrad"``)."""
        self.set("combine", method)

    def set_data_positions(self, positions: Mapping[str, Any]) -> None:
        """Move the data streams to ``positions`` (``trainer.streams.state_dict()``), e.g. to go on with the data
        that follow those already drawn after a go-back; journaled."""
        with self.journal.lock:
            self.streams.load_state_dict(positions, self.tasks)
            self.record_change("data_position", positions={k: dict(v) for k, v in positions.items()})


def between_steps(trainer: Any, apply: Callable[[], None], words: str) -> Callable[[], None]:
    """``apply`` for a knob that changes the step's shape (the chain's transforms, the combine method): taken
    from inside a running call while a step is half done (tasks accumulated, normalized, clipped), it waits in
    the queue for the next knob read between steps; from code between calls it applies at once."""
    journal = trainer.journal

    def at_boundary() -> None:
        if journal.depth > 0 and any(phase not in IDLE for phase in trainer.phase().values()):
            source = journal.current_source()

            def again() -> None:
                with journal.source(source):
                    at_boundary()
            with journal.pending_lock:
                journal.pending.append((words, again))
            return
        apply()
    return at_boundary
