"""What a dashboard shows, as data: the plotted series collected from the history (``SeriesStore``) and
one immutable ``DashState`` from which every text on screen is derived (``texts.py`` renders it).

Both are plain Python: no widgets, so the controller and its tests run without ipywidgets.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from ..training.plotseries import panel_of

if TYPE_CHECKING:
    from ..core.trainer import Trainer

Series = tuple[list[float], list[float]]


MAX_GHOSTS = 3  # abandoned branches kept grey on the plot (the newest ones)


def with_abandoned(ghost: dict[str, Series], new: dict[str, Series], keep: int = MAX_GHOSTS) -> dict[str, Series]:
    """The grey curves after one more branch is abandoned: ``new`` after those of ``ghost`` (the last ``keep``
    branches), each branch apart from the next by a gap (a NaN value, so no line runs back to the branch's
    start). Nothing abandoned (a second re-initialise at once) keeps the grey curves as they are."""
    if not new:
        return ghost
    out: dict[str, Series] = {}
    for key in {**ghost, **new}:
        xs, ys = ghost.get(key, ([], []))
        gaps = [i for i, y in enumerate(ys) if math.isnan(y)]
        if len(gaps) >= keep - 1:  # drop the oldest branch
            cut = gaps[len(gaps) - keep + 1] + 1 if keep > 1 else len(xs)
            xs, ys = xs[cut:], ys[cut:]
        nx, ny = new.get(key, ([], []))
        if xs and nx:
            xs, ys = [*xs, xs[-1]], [*ys, math.nan]
        out[key] = ([*xs, *nx], [*ys, *ny])
    return {k: v for k, v in out.items() if v[0]}


class SeriesStore:
    """The history as ``column -> (steps, values)`` for every plotted column, grown row by row; the
    branch abandoned by a restore kept apart as the ghost; the event log and validation points.

    ``collect(trainer)`` reads only the rows added since the last call (cheap between steps);
    ``restored(step)`` marks a go-back so that the next collect moves what lies after ``step`` to
    the ghost. ``copy()`` gives a consistent copy for a drawing thread.
    """

    def __init__(self, series: dict[str, Series] | None = None, ghost: dict[str, Series] | None = None,
                 events: list[tuple[int, str]] | None = None, validation: list[dict[str, Any]] | None = None,
                 records: list[dict[str, Any]] | None = None, step: int = 0) -> None:
        self.series: dict[str, Series] = series or {}
        self.ghost: dict[str, Series] = ghost or {}
        self.events: list[tuple[int, str]] = events or []  # (step, what changed): the event log and plot marks
        self.event_minibatches: list[int] = [0] * len(self.events)  # each event's minibatch within its step (the journal's)
        self.minibatch_now: Callable[[], int] = lambda: 0  # the minibatch an event made now falls in (the controller's)
        self.validation: list[dict[str, Any]] = validation or []  # evaluate events and the loop's validation records
        self.records: list[dict[str, Any]] = records or []  # the loop's validation records (the validation table)
        self.step = step  # the step the collected data reach
        self.abandoned: set[int] = set()  # indices of the events of an abandoned branch: in the log, not marked
        self.branch_name: str | None = None  # the branch drawn beside the run ("fork here"), and its curves
        self.branch: dict[str, Series] = {}
        self.branch_version = 0  # counts changes of the branch's curves (the view redraws on a change)
        self.lock = threading.Lock()
        self._seen = 0
        self._reload: int | None = None

    def set_branch(self, name: str | None, series: dict[str, Series]) -> None:
        """The selected branch's curves (``branches.branch_series``), drawn beside the run's; None: no branch."""
        with self.lock:
            self.branch_name, self.branch = name, series
            self.branch_version += 1

    def clear(self) -> None:
        """Forget every row, ghost, event and validation point (the dashboard drives another trainer now)."""
        with self.lock:
            self.series, self.ghost, self.events, self.validation, self.records = {}, {}, [], [], []
            self.event_minibatches = []
            self.abandoned, self._seen, self._reload, self.step = set(), 0, None, 0

    def event(self, step: int, text: str, minibatch: int | None = None) -> None:
        """An event at ``step`` (and ``minibatch``: None, where the trainer stands now): numbered as the journal
        numbers its entries, "step N, minibatch M"."""
        where = self.minibatch_now() if minibatch is None else int(minibatch)
        with self.lock:
            self.events.append((int(step), text))
            self.event_minibatches.append(where)

    def where(self, i: int) -> str:
        """Where event ``i`` happened, as the journal says it: ``step 3`` or ``step 3, minibatch 2``."""
        return where_text(self.events[i][0], self.event_minibatches[i] if i < len(self.event_minibatches) else 0)

    def restored(self, step: int, everything: bool = False) -> None:
        """A restore went back to ``step``: the next collect keeps what lies after it as the ghost, and the events
        after it (``everything``: every event so far, a re-initialisation) are no longer marked on the plot."""
        with self.lock:
            self._reload = int(step)
            self.abandoned |= {i for i, (s, _) in enumerate(self.events) if everything or s > step}

    def marks(self) -> list[tuple[float, str]]:
        """The events as the plot marks them: numbered as in the log, an abandoned branch's at step inf (never
        inside the step range shown, so not drawn)."""
        with self.lock:
            return [(math.inf if i in self.abandoned else float(s), t) for i, (s, t) in enumerate(self.events)]

    def collect(self, trainer: Trainer) -> int:
        """Add the history rows written since the last call; returns how many."""
        rows = trainer.log.rows()
        with self.lock:
            if self._reload is not None or len(rows) < self._seen:
                back = self._reload if self._reload is not None else (rows[-1]["step"] if rows else 0)
                ghost = {k: ([x for x in xs if x > back], [y for x, y in zip(xs, ys) if x > back])
                         for k, (xs, ys) in self.series.items()}
                self.ghost = with_abandoned(self.ghost, {k: v for k, v in ghost.items() if v[0]})
                self.series, self._seen, self._reload = {}, 0, None
                self.validation = [v for v in self.validation if v["step"] <= trainer.step_count]
                self.records = [r for r in self.records if r["step"] <= trainer.step_count]
            new = rows[self._seen:]
            self._seen = len(rows)
            for row in new:
                step = row["step"]
                for key, value in row.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) \
                            and panel_of(key) is not None and math.isfinite(value):
                        xs, ys = self.series.setdefault(key, ([], []))
                        xs.append(step)
                        ys.append(value)
            self.step = trainer.step_count
            return len(new)

    def copy(self) -> SeriesStore:
        """A consistent copy (lists copied under the lock) for a drawing thread."""
        with self.lock:
            out = SeriesStore({k: (list(xs), list(ys)) for k, (xs, ys) in self.series.items()}, dict(self.ghost),
                              list(self.events), list(self.validation), list(self.records), self.step)
            out.abandoned = set(self.abandoned)
            out.event_minibatches = list(self.event_minibatches)
            out.branch_name, out.branch, out.branch_version = self.branch_name, dict(self.branch), self.branch_version
            return out

    def values_at(self, step: float) -> dict[str, tuple[int, float]]:
        """Every series' value at ``step`` (the last point at or before it): ``column -> (its step, value)``."""
        out: dict[str, tuple[int, float]] = {}
        with self.lock:
            for key, (xs, ys) in self.series.items():
                i = _last_at_or_before(xs, step)
                if i is not None:
                    out[key] = (int(xs[i]), float(ys[i]))
        return out

    def step_range(self) -> tuple[int, int]:
        """The first and last plotted step (ghost included); ``(0, 0)`` before the first row."""
        with self.lock:
            xs = [x for s in (self.series, self.ghost) for v in s.values() for x in (v[0][:1] + v[0][-1:])]
        return (int(min(xs)), int(max(xs))) if xs else (0, 0)


def where_text(step: int, minibatch: int = 0) -> str:
    """The one numbering of the dashboard, the journal's: ``step N`` (N steps applied before it), and
    ``, minibatch M`` when it happened inside the accumulation of the step after those (M minibatches begun)."""
    return f"step {step}" + (f", minibatch {minibatch}" if minibatch else "")


def _last_at_or_before(xs: list[float], step: float) -> int | None:
    """Index of the last x <= step in the sorted ``xs`` (binary search), or None."""
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] <= step:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1 if lo else None


@dataclass(frozen=True)
class RunView:
    """A background run as the screen shows it."""

    state: str  # running, pausing, paused, stopping, ended
    steps_done: int
    total: int  # steps this run aims at (0: until stopped)
    rate: float  # steps per second
    elapsed: float  # seconds running, paused time excluded
    reason: str | None  # why it ended
    failed: bool
    minibatch: int = 0  # minibatches done in the step in flight (shown during a long step; 0: between steps)
    minibatches: int = 0  # minibatches that step draws
    end_step: int | None = None  # the step the run ended at (None: not ended)


@dataclass(frozen=True)
class DashState:
    """Everything a dashboard shows, taken at one moment between steps (or while idle)."""

    step: int
    phases: Mapping[str, str]
    next_call: str
    skipped: Mapping[str, str]  # task -> why step() leaves it out
    weights: Mapping[str, float]  # "a" task weight, "a/clean" linked-set weight
    lr: float
    clip: float | None
    combine: str
    run: RunView | None
    status: str
    status_error: bool
    error: str | None  # the latest traceback (collapsible on screen), None when cleared
    events: tuple[tuple[int, str], ...]  # (step, text); where each happened: ``places``
    records: tuple[Mapping[str, Any], ...]
    snapshots: tuple[str, ...]
    schedule: str  # "schedule: step 154 of 251, lr 1.2e-03" or "" without one
    run_refusal: str | None  # why the run button would be refused now, None when it would start
    table_html: str = field(default="", repr=False)  # the per-task state table (needs the accumulators)
    journal: tuple[str, ...] = ()  # trainer.journal's knob changes, one line each
    noise_html: str = field(default="", repr=False)  # the noise-scale panel
    branches: tuple[tuple[str, str], ...] = ()  # (label, name) of each branch made by "fork here"
    branch: str | None = None  # the selected branch (drawn on the plot)
    driven: str = "main"  # the name of the trainer the dashboard drives
    places: tuple[str, ...] = ()  # where each event happened, in the journal's numbering ("step 3, minibatch 2")

    @property
    def running(self) -> bool:
        """A run is in progress and not paused."""
        return self.run is not None and self.run.state in ("running", "pausing", "stopping")
