"""The knob table: every setting a person changes while a run trains, one row each (``KNOBS``).

A row (``Knob``) says the knob's name, its scope (the trainer, a task, a task's linked set, or a task or every
task), how a value is checked, read and written, when a change takes effect, how it is put into words and how a
dashboard shows it. ``mtlab.core.knobs`` makes every change through the rows (``Trainer.set``); the journal's
lines, the dashboard's events and ``plot_runs`` word changes with ``Knob.words``/``change_words``. A knob of
your own is one row (``KNOBS.add``) plus the line where it acts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..base.errors import ConfigError
from ..tasks.task import check_count, check_positive, check_relative_weights, check_weight
from .transforms import ClipByGlobalNorm, ClipByHistory, ClipByValue, Normalize, Transform

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
    between_steps: bool = False  # changes the step's shape (chain, combine): during a run, taken between steps

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
         label="clip value", between_steps=True,
         doc="element-wise clipping bound (ClipByValue in the chain), or None"),
    Knob("clip_grad_norm", "trainer", _clip_check(ClipByGlobalNorm, "clip_grad_norm"),
         _clip_read(ClipByGlobalNorm, "max_norm"), _clip_write(ClipByGlobalNorm), when="apply", label="clip norm", between_steps=True,
         control=("optional", 0.01, 100.0), doc="global-norm clipping bound per task, or None"),
    Knob("clip_grad_percentile", "trainer", _clip_check(ClipByHistory, "clip_grad_percentile"),
         _clip_read(ClipByHistory, "percentile"), _clip_write(ClipByHistory), when="apply",
         label="clip percentile", between_steps=True,
         control=("optional", 1.0, 100.0), doc="AutoClip: clip to this percentile of the norm history, or None"),
    Knob("normalize_gradients", "trainer", _normalize_check,
         lambda tr, t, s: tr.chain.find(Normalize) is not None,
         lambda tr, v, t, s: setattr(tr, "chain", tr.chain.replaced(Normalize, Normalize() if v else None)),
         when="apply", control=("toggle",), between_steps=True,
         doc="divide each task's gradients by its accumulated normalizer"),
    Knob("minibatches_per_step", "task_or_all", _k_check, _k_read, _k_write, when="step",
         control=("int", 1, 16), label="K (minibatches per step)", doc="minibatch rounds accumulated per step (K)"),
    Knob("batch_size", "task", _batch_check, lambda tr, t, s: tr.tasks[t].batch_size, _batch_write,
         control=("int", 1, 64), doc="examples per minibatch of a task's linked sets"),
    Knob("combine", "trainer", _combine_check, _combine_read, _combine_write, when="apply",
         control=("choice", "sum", "pcgrad", "upgrad", "mgda", "cagrad", "nashmtl", "dwa"),
         replayable=lambda v: v is None or isinstance(v, (str, Mapping)), between_steps=True,
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



def differs(a: Any, b: Any) -> bool:
    """Two knob values differ (NaN equals NaN; an object that compares to no bool: by identity)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return False
    try:
        return bool(a != b)
    except Exception:  # an object whose comparison is not a bool (a tensor)
        return a is not b


def plain(value: Any) -> Any:
    """A value as a journal holds it (plain JSON: a mapping becomes a dict; an object its repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    return repr(value)
