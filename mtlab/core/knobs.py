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

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..base.errors import ConfigError
from ..tasks.task import check_count, check_positive, check_relative_weights, check_weight
from .events import Event, KnobInfo
from .noise import NoiseScale
from .transforms import Chain, ClipByGlobalNorm, ClipByHistory, ClipByValue, Normalize, Transform

if TYPE_CHECKING:
    from ..tasks.sampling import Streams
    from ..tasks.task import LinkedSet, Task
    from .events import Events
    from .journal import Journal
    from .precision import Precision
    from .scope import RunLock
    from .update import PerTaskUpdate, Update

Scope = Literal["trainer", "task", "linkedset", "task_or_all"]
SCOPES = ("trainer", "task", "linkedset", "task_or_all")
# a control's look on a dashboard: ("log", lo, hi), ("linear", lo, hi), ("int", lo, hi), ("choice", options...),
# ("toggle",) or ("optional", lo, hi) (a number or None: off)
Control = tuple[Any, ...]


@dataclass(frozen=True)
class Knob:
    """One row of the knob table.

    ``check(trainer, value, task, linkedset) -> value`` refuses a bad value (a ConfigError naming the fix) and
    returns the value as stored; ``read(trainer, task, linkedset)`` and ``write(trainer, value, task, linkedset)``
    reach where the value lives (None: the trainer keeps it, starting at ``default``). ``when`` says where a
    change takes effect (``"minibatch"``: from the next minibatch; ``"step"``: from the next step; ``"apply"``:
    at the next apply). ``words(value, task, linkedset)`` puts a change into words."""

    name: str
    scope: Scope
    check: Callable[[Any, Any, str | None, str | None], Any] | None = None
    read: Callable[[Any, str | None, str | None], Any] | None = None
    write: Callable[[Any, Any, str | None, str | None], None] | None = None
    default: Any = None
    when: str = "minibatch"
    doc: str = ""
    control: Control | None = None
    label: str = ""
    replayable: Callable[[Any], bool] | None = None  # False for a value a journal cannot hold (an object)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ConfigError(f"knob {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")

    def words(self, value: Any, task: str | None = None, linkedset: str | None = None) -> str:
        """The change in words, the same everywhere (events, journal lines, status, ``plot_runs``): ``lr 1e-3``,
        ``a/noisy weight 0.5``, ``task a weight 0.7``, ``b/batch size 4``, ``a/K (minibatches per step) 2``,
        ``clip value off``."""
        label = self.label or self.name.replace("_", " ")
        if linkedset is not None:
            return f"{task}/{linkedset} {label} {fmt(value)}"
        if task is not None:
            where = f"task {task} " if self.scope == "task" and self.label == "weight" else f"{task}/"
            return f"{where}{label} {fmt(value)}"
        return f"{label} {fmt(value)}"


def fmt(value: Any) -> str:
    """A knob's value as a person writes it: ``1e-3``, ``2.5e-4``, ``0.5``, ``16``; None as ``off``."""
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Mapping):
        return str(value.get("type", value.get("name", "custom")))
    if not isinstance(value, (int, float)):
        return str(value)
    if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4):
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{value:.3g}"


def change_words(entry: Mapping[str, Any]) -> str | None:
    """A journal entry of a change in words, the one wording the journal's lines, the dashboard's events and
    ``plot_runs`` use (``lr -> 1e-3``, ``a/noisy weight -> 0.5``); None for what sets no knob (a data position,
    a fork)."""
    kind = entry.get("kind")
    if kind == "clip":  # a journal written before the knob table: every clip setting in one entry
        parts = [KNOBS[name].words(entry.get(key)) for key, name in
                 (("value", "clip_grad_value"), ("norm", "clip_grad_norm"), ("percentile", "clip_grad_percentile"))
                 if entry.get(key) is not None]
        return ", ".join(parts) or "clipping off"
    knob = KNOBS.get(str(kind))
    if knob is not None:
        value = entry["method"] if kind == "combine" and "value" not in entry and "method" in entry else entry.get("value")
        return knob.words(value, entry.get("task"), entry.get("linkedset"))
    if kind == "reinitialize":
        return f"re-initialised (from step {entry.get('from_step')})"
    if kind == "restore":
        return f"went back to step {entry.get('to_step')}"
    if kind == "resume":
        return f"resumed at step {entry.get('to_step')}"
    if kind in ("data_position", "fork"):
        return None
    return str(kind)


class KnobTable(Mapping[str, Knob]):
    """The knobs by name (``KNOBS``); ``add`` a row for a knob of your own."""

    def __init__(self) -> None:
        self._rows: dict[str, Knob] = {}

    def add(self, knob: Knob) -> Knob:
        """Add (or replace) a row; returns it."""
        self._rows[knob.name] = knob
        return knob

    def remove(self, name: str) -> None:
        """Take a row out (a knob added for a while, e.g. in a test)."""
        self._rows.pop(name, None)

    def get_knob(self, name: str) -> Knob:
        """The row named ``name``, or a ConfigError listing the knobs."""
        knob = self._rows.get(name)
        if knob is None:
            raise ConfigError(f"unknown knob {name!r}; the knobs are {list(self._rows)} (mtlab.core.knobs.KNOBS)")
        return knob

    def __getitem__(self, name: str) -> Knob:
        return self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


KNOBS = KnobTable()


# ---------------------------------------------------------------------------------------------- the rows' parts
def _lr_check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> float:
    return check_positive(value, "lr")


def _weight_check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> float:
    assert task is not None and linkedset is not None
    w = check_weight(value, f"weight of linked set {linkedset!r} of task {task!r}")
    if tr.linkedset_weights == "relative":
        check_relative_weights(tr.tasks[task], {linkedset: w})
    return w


def _clip_check(kind: Callable[[float], Transform], what: str) -> Callable[[Any, Any, str | None, str | None], float | None]:
    def check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> float | None:
        if value is None:
            return None
        kind(value)  # the transform's own check (a ConfigError naming the setting)
        return float(value)
    check.__doc__ = f"{what}: a positive number, or None (off)"
    return check


def _clip_read(kind: type[Transform], attr: str) -> Callable[[Any, str | None, str | None], float | None]:
    def read(tr: Any, task: str | None, linkedset: str | None) -> float | None:
        t = tr.chain.find(kind)
        return None if t is None else float(getattr(t, attr))
    return read


def _clip_write(kind: Callable[[float], Transform]) -> Callable[[Any, Any, str | None, str | None], None]:
    def write(tr: Any, value: Any, task: str | None, linkedset: str | None) -> None:
        tr.chain = tr.chain.replaced(kind, None if value is None else kind(value))
    return write


def _k_check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> int:
    return check_count(value, "minibatches per step" if task is None else f"minibatches per step of task {task!r}",
                       "minibatch rounds accumulated before each apply(); e.g. set('minibatches_per_step', 2)")


class Rounds:
    """Minibatch rounds per step (K): ``default`` for every task without its own, ``per_task`` the others."""

    def __init__(self, default: int) -> None:
        self.default = default
        self.per_task: dict[str, int] = {}

    def of(self, task: str | None) -> int:
        """K of ``task`` (None: the default)."""
        return self.default if task is None else self.per_task.get(task, self.default)

    def set(self, value: int, task: str | None) -> None:
        """K of ``task``; None sets the default and every task's."""
        if task is None:
            self.default = value
            self.per_task.clear()
        else:
            self.per_task[task] = value


def _k_read(tr: Any, task: str | None, linkedset: str | None) -> Any:
    return tr.rounds.of(task)


def _k_write(tr: Any, value: Any, task: str | None, linkedset: str | None) -> None:
    tr.rounds.set(value, task)


def _batch_check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> int:
    return check_count(value, f"batch size of task {task!r}",
                       f"examples per minibatch; e.g. set('batch_size', 8, task={task!r})")


def _batch_write(tr: Any, value: Any, task: str | None, linkedset: str | None) -> None:
    assert task is not None
    tr.tasks[task].batch_size = value  # the streams adopt it at their next draw


def _combine_check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> Any:
    from .update import resolve_method

    if tr.acc_steps and value not in (None, "sum"):
        raise ConfigError(f"combine {value!r} needs the single optimizer: acc_steps steps one optimizer per task")
    resolve_method(value)  # refuses an unknown method, naming the methods there are
    return value


def _combine_read(tr: Any, task: str | None, linkedset: str | None) -> Any:
    return tr.update.method


def _combine_write(tr: Any, value: Any, task: str | None, linkedset: str | None) -> None:
    tr.update.set_method(value)


def _normalize_check(tr: Any, value: Any, task: str | None, linkedset: str | None) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"normalize_gradients must be True or False, got {value!r}")
    return value


for _row in (
    Knob("lr", "trainer", _lr_check, lambda tr, t, s: tr.lr_scaler.read(),
         lambda tr, v, t, s: tr.lr_scaler.write(v), when="apply", control=("log", 1e-6, 1e-1),
         doc="the base learning rate: the optimizer's param groups (and a scheduler's base lrs) scaled by the "
             "same factor, so their ratios stay"),
    Knob("weight", "linkedset", _weight_check, lambda tr, t, s: tr.tasks[t].linkedsets[s].weight,
         lambda tr, v, t, s: setattr(tr.tasks[t].linkedsets[s], "weight", v), control=("linear", 0.0, 2.0),
         doc="weight of a linked set's loss and normalizer (0 leaves it out of step())"),
    Knob("task_weight", "task", lambda tr, v, t, s: check_weight(v, f"weight of task {t!r}"),
         lambda tr, t, s: tr.tasks[t].weight, lambda tr, v, t, s: setattr(tr.tasks[t], "weight", v),
         control=("linear", 0.0, 2.0), doc="weight of a task in the combined update (0 leaves it out)",
         label="weight"),
    Knob("clip_grad_value", "trainer", _clip_check(ClipByValue, "clip_grad_value"),
         _clip_read(ClipByValue, "value"), _clip_write(ClipByValue), when="apply", control=("optional", 0.01, 10.0),
         label="clip value",
         doc="element-wise clipping bound (ClipByValue in the chain), or None"),
    Knob("clip_grad_norm", "trainer", _clip_check(ClipByGlobalNorm, "clip_grad_norm"),
         _clip_read(ClipByGlobalNorm, "max_norm"), _clip_write(ClipByGlobalNorm), when="apply", label="clip norm",
         control=("optional", 0.01, 100.0), doc="global-norm clipping bound per task, or None"),
    Knob("clip_grad_percentile", "trainer", _clip_check(ClipByHistory, "clip_grad_percentile"),
         _clip_read(ClipByHistory, "percentile"), _clip_write(ClipByHistory), when="apply",
         label="clip percentile",
         control=("optional", 1.0, 100.0), doc="AutoClip: clip to this percentile of the norm history, or None"),
    Knob("normalize_gradients", "trainer", _normalize_check,
         lambda tr, t, s: tr.chain.find(Normalize) is not None,
         lambda tr, v, t, s: setattr(tr, "chain", tr.chain.replaced(Normalize, Normalize() if v else None)),
         when="apply", control=("toggle",), doc="divide each task's gradients by its accumulated normalizer"),
    Knob("minibatches_per_step", "task_or_all", _k_check, _k_read, _k_write, when="step",
         control=("int", 1, 16), label="K (minibatches per step)", doc="minibatch rounds accumulated per step (K)"),
    Knob("batch_size", "task", _batch_check, lambda tr, t, s: tr.tasks[t].batch_size, _batch_write,
         control=("int", 1, 64), doc="examples per minibatch of a task's linked sets"),
    Knob("combine", "trainer", _combine_check, _combine_read, _combine_write, when="apply",
         control=("choice", "sum", "pcgrad", "upgrad", "mgda", "cagrad", "nashmtl", "dwa"),
         replayable=lambda v: v is None or isinstance(v, (str, Mapping)),
         doc="how tasks' gradients combine: 'sum', a mtlab.combine aggregator, a weighting, or both"),
):
    KNOBS.add(_row)


def knob_keys(trainer: Any, knob: Knob) -> list[tuple[str | None, str | None]]:
    """Every ``(task, linkedset)`` a knob exists for in ``trainer``."""
    if knob.scope == "trainer":
        return [(None, None)]
    if knob.scope == "task":
        return [(t, None) for t in trainer.tasks]
    if knob.scope == "task_or_all":
        return [(None, None), *((t, None) for t in trainer.tasks)]
    return [(t, s) for t, task in trainer.tasks.items() for s in task.linkedsets]


@dataclass(frozen=True)
class Change:
    """What ``Trainer.set`` did: the knob, its value and where it takes effect."""

    name: str
    value: Any
    task: str | None = None
    linkedset: str | None = None
    pending: bool = False  # a call was running: in force from its next knob read
    step: int = 0
    when: str = "minibatch"
    words: str = field(default="", compare=False)

    def __str__(self) -> str:
        where = {"minibatch": "from the next minibatch", "step": "from the next step",
                 "apply": "at the next apply"}.get(self.when, "at once")
        return f"{self.words}: {'queued, ' if self.pending else ''}{where} (step {self.step})"


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
        pending = self.command(lambda: self._apply_knob(knob, value, task, linkedset), words)
        return Change(name, value, task, linkedset, pending, self.step_count, knob.when, words)

    def _apply_knob(self, knob: Knob, value: Any, task: str | None, linkedset: str | None,
                    announce: bool = True) -> None:
        """Apply a checked change (a call of the trainer holds its lock, or none runs): write, record, announce."""
        with self.journal.lock:
            before = self._read(knob, task, linkedset)
            changed = _differs(before, value)
            if changed:
                self._write(knob, value, task, linkedset)
                stored = self._read(knob, task, linkedset)
                if self._journaling:
                    payload: dict[str, Any] = {"value": _plain(stored)}
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
        return [{"name": name, "task": t, "linkedset": s, "value": _plain(self._read(knob, t, s))}
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
            if key in now and _differs(now[key], e.get("value")):
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

    def knobs_loaded(self) -> None:
        """After a state was loaded quietly: nothing to remember (every knob is read where it lives)."""


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return False
    try:
        return bool(a != b)
    except Exception:  # an object whose comparison is not a bool (a tensor)
        return a is not b


def _plain(value: Any) -> Any:
    """A value as a journal holds it (plain JSON: a mapping becomes a dict; an object its repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    return repr(value)
