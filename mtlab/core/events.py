"""Events: who is told what happened, after it happened.

Each event is a member of :class:`Event` and carries one payload of its own frozen dataclass (``PAYLOADS``).
The trainer emits ``minibatch``, ``normalize``, ``clip``, ``transform`` (a call of a user's transform),
``apply``, ``reset``, ``knob`` (any knob change: ``KnobInfo``), ``reinitialize``, ``evaluate``, ``restore``
and ``fork``; the loop adds ``step``, ``validation``,
``data_skipped``, ``run_start`` and ``run_end``. A listener is any ``fn(event, info)``; loggers, the dashboard
and traces are listeners. ``Event`` is a ``StrEnum`` and every payload also reads as a mapping, so a listener
written for strings and dicts keeps working::

    def listener(event, info):
        if event == "minibatch":              # or: isinstance(info, MinibatchInfo)
            print(info["task"], info.task, dict(info))

A run of one process emits with no listener at all most of the time; emitting is one type check and one call
per listener.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .accumulator import Accumulator


class Event(StrEnum):
    """What happened (compares equal to its name, ``Event.APPLY == "apply"``)."""

    MINIBATCH = "minibatch"  # a minibatch was accumulated
    NORMALIZE = "normalize"  # a task's gradient was divided by its normalizer
    CLIP = "clip"  # a task's gradient was clipped
    TRANSFORM = "transform"  # a user's transform of the chain ran on a task (its call in ``info.call``)
    APPLY = "apply"  # the update was applied: a step ended
    RESET = "reset"  # a task's accumulation (or every task's) was discarded
    KNOB = "knob"  # a knob changed (lr, a weight, clipping, K, batch size, combine...): ``KnobInfo``
    REINITIALIZE = "reinitialize"  # back to the initial weights, step 0
    EVALUATE = "evaluate"  # a held-out loss was measured
    RESTORE = "restore"  # a state or checkpoint was loaded
    FORK = "fork"  # a branch of the trainer was made
    STEP = "step"  # the loop finished a step
    VALIDATION = "validation"  # the loop validated
    DATA_SKIPPED = "data_skipped"  # bad examples were left out during the step
    RUN_START = "run_start"
    RUN_END = "run_end"


class Payload(Mapping[str, Any]):
    """Base of every event's payload: a frozen dataclass whose fields also read as a mapping
    (``info.task == info["task"]``, ``info.get("task")``, ``dict(info)``), for listeners written for dicts."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if key in self._keys():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]  # every subclass is a dataclass


@dataclass(frozen=True, eq=False)
class MinibatchInfo(Payload):
    """A minibatch of ``linkedset`` was accumulated into ``task``'s state."""

    task: str
    linkedset: str
    state: Accumulator


@dataclass(frozen=True, eq=False)
class NormalizeInfo(Payload):
    """``task``'s accumulated gradient was divided by its normalizer."""

    task: str
    state: Accumulator


@dataclass(frozen=True, eq=False)
class ClipInfo(Payload):
    """``task``'s accumulated gradient was clipped."""

    task: str
    state: Accumulator


@dataclass(frozen=True, eq=False)
class TransformInfo(Payload):
    """A user's transform (its trainer call ``call``) ran on ``task``'s accumulated gradient."""

    task: str
    state: Accumulator
    call: str  # the transform's call name (``trainer.call(name)``)


@dataclass(frozen=True, eq=False)
class ApplyInfo(Payload):
    """The update of ``tasks`` was applied: step ``step`` ended, with history row ``row``."""

    tasks: list[str]
    step: int
    row: dict[str, Any]  # the step's history row (values may still be tensors on the device)


@dataclass(frozen=True, eq=False)
class ResetInfo(Payload):
    """``task``'s accumulation (None: every task's) was discarded."""

    task: str | None  # None: every task


@dataclass(frozen=True, eq=False)
class KnobInfo(Payload):
    """Knob ``name`` (``mtlab.core.knobs.KNOBS``) of the trainer, of ``task`` or of ``task``'s ``linkedset`` is now
    ``value``, in force from step ``step``'s minibatch ``minibatch`` on (as the journal numbers it)."""

    name: str
    value: Any
    task: str | None
    linkedset: str | None
    step: int
    minibatch: int


@dataclass(frozen=True, eq=False)
class ReinitializeInfo(Payload):
    """The trainer went back to its initial state (step 0) from step ``from_step``."""

    step: int
    from_step: int


@dataclass(frozen=True, eq=False)
class EvaluateInfo(Payload):
    """The held-out loss of ``task``'s linked set ``linkedset`` was measured at step ``step``."""

    task: str
    linkedset: str
    loss: float
    step: int


@dataclass(frozen=True, eq=False)
class RestoreInfo(Payload):
    """A state or checkpoint was loaded: the trainer is at step ``step``."""

    step: int


@dataclass(frozen=True, eq=False)
class ForkInfo(Payload):
    """A branch ``name`` of the trainer was made at step ``step``."""

    name: str
    step: int


@dataclass(frozen=True, eq=False)
class StepInfo(Payload):
    """The loop finished step ``step`` (its history row, None before the first)."""

    step: int
    row: dict[str, Any] | None


@dataclass(frozen=True, eq=False)
class ValidationInfo(Payload):
    """The loop validated at step ``step`` (``record``: its losses and decision)."""

    step: int
    record: dict[str, Any]


@dataclass(frozen=True, eq=False)
class DataSkippedInfo(Payload):
    """Bad examples (``examples``, one record each) were left out during step ``step``."""

    step: int
    examples: list[dict[str, Any]]


@dataclass(frozen=True, eq=False)
class RunStartInfo(Payload):
    """The loop starts at step ``step`` (``num_steps``: the schedule's length)."""

    step: int
    num_steps: int | None


@dataclass(frozen=True, eq=False)
class RunEndInfo(Payload):
    """The loop ended at step ``step`` after ``steps_run`` steps, for ``reason``."""

    reason: str
    step: int
    steps_run: int


PAYLOADS: dict[Event, type[Payload]] = {
    Event.MINIBATCH: MinibatchInfo, Event.NORMALIZE: NormalizeInfo, Event.CLIP: ClipInfo,
    Event.TRANSFORM: TransformInfo, Event.APPLY: ApplyInfo, Event.RESET: ResetInfo, Event.KNOB: KnobInfo,
    Event.REINITIALIZE: ReinitializeInfo,
    Event.EVALUATE: EvaluateInfo, Event.RESTORE: RestoreInfo, Event.FORK: ForkInfo, Event.STEP: StepInfo,
    Event.VALIDATION: ValidationInfo, Event.DATA_SKIPPED: DataSkippedInfo, Event.RUN_START: RunStartInfo,
    Event.RUN_END: RunEndInfo,
}
"""The payload type of each event."""


def call_done(call: str, task: str, state: Accumulator) -> tuple[Event, Payload]:
    """The event of a chain's call having run on ``task``: ``normalize``, ``clip``, or ``transform`` for a user's."""
    if call == Event.NORMALIZE:
        return Event.NORMALIZE, NormalizeInfo(task, state)
    if call == Event.CLIP:
        return Event.CLIP, ClipInfo(task, state)
    return Event.TRANSFORM, TransformInfo(task, state, str(call))


Listener = Callable[[Event, Payload], None]


class Events:
    """A list of listeners called in order; a listener may remove itself while being called."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def subscribe(self, fn: Listener) -> Listener:
        """Call ``fn(event, info)`` on every event from now on; returns ``fn``."""
        if not callable(fn):
            raise TypeError(f"a listener must be callable as fn(event, info), got {type(fn).__name__}")
        self.listeners.append(fn)
        return fn

    def unsubscribe(self, fn: Listener) -> None:
        """Stop calling ``fn`` (no error if it was not subscribed)."""
        if fn in self.listeners:
            self.listeners.remove(fn)

    def emit(self, event: Event, info: Payload) -> None:
        """Call every listener with ``(event, info)``, in the order they subscribed. ``event`` must be a member
        of :class:`Event` (or its name) and ``info`` that event's payload (``PAYLOADS[event]``)."""
        if type(info) is not PAYLOADS.get(event):
            _refuse(event, info)
        for fn in list(self.listeners):
            fn(event, info)

    def __len__(self) -> int:
        return len(self.listeners)


def _refuse(event: object, info: object) -> None:
    if event not in PAYLOADS:
        raise ValueError(f"unknown event {event!r}: an event is one of {', '.join(e.value for e in Event)} "
                         "(mtlab.core.events.Event)")
    want = PAYLOADS[Event(str(event))].__name__
    raise TypeError(f"event {str(event)!r} carries a {want}, got {type(info).__name__}: emit({event!r}, "
                    f"{want}(...))")
