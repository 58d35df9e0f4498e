"""What a history becomes on a plot, before anything is drawn: its columns sorted into panels (``panel_of``,
``panels_for``: the clipped share only when something was clipped, combine weights and task cosines when a
method recorded them), each column's points as a series (``series_from_frame``; thinned, smoothed, only the
positive ones on a log axis), the validation points a run kept (``validation_series``) and the knob changes to
mark (``events_from_frame``). The saved figures and the dashboard's painter read the same series.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import pandas as pd

from ..core.columns import COMBINE, COSINE, DIRECTION, parse_column, set_key
from .plotstyle import (
    PANEL_SPECS,
    Styles,
)

MAX_POINTS = 2000
PANELS = tuple(PANEL_SPECS)
TITLES = {name: spec.title for name, spec in PANEL_SPECS.items()}
Series = tuple[Sequence[float], Sequence[float]]


class HasHistory(Protocol):
    """A trainer: its ``history`` DataFrame."""

    @property
    def history(self) -> pd.DataFrame: ...


class HasFrame(Protocol):
    """A ``History``: its rows as a DataFrame."""

    def frame(self) -> pd.DataFrame: ...
HistoryLike: TypeAlias = pd.DataFrame | HasHistory | HasFrame  # what the plots read a history from
Validation: TypeAlias = pd.DataFrame | Iterable[Mapping[str, Any]] | None  # evaluate events, validation records
_UPDATE_PANELS = {COMBINE: "combine", COSINE: "cosine", DIRECTION: "grad_norm"}  # the update's columns
_TASK_PANELS = {"loss": "loss", "grad_norm": "grad_norm", "grad_norm_clipped": "grad_norm",
                "clip_fraction": "clip_fraction"}  # a task's (or a linked set's) columns


def panel_of(column: str) -> tuple[str, str, dict[str, Any]] | None:
    """Which panel a history column goes to, its legend label and line style (``Styles.line`` for a
    figure's own colours); None if not plotted.

    ``"a/loss"`` -> loss panel, label ``"a"``; ``"a/clean/loss"`` -> ``"a/clean"``;
    ``"a/grad_norm_clipped"`` -> gradient panel; ``"direction_norm"`` -> gradient panel;
    ``"combine/<group>/a"`` -> combine weights; ``"cos/<model>/a,b"`` -> task cosines.
    """
    parsed = parse_column(column)
    panel: str | None
    if parsed.kind in _UPDATE_PANELS and (parsed.group or not parsed.task):  # combine/<group>/<task>,
        # cos/<model>/<a>,<b>, direction_norm[/<group>]; not a transform's statistic <task>/cos
        panel = _UPDATE_PANELS[parsed.kind]
    else:  # <task>[/<set>]/<name>
        panel = _TASK_PANELS.get(parsed.kind) if parsed.task else None
    if panel is None:
        return None
    style = Styles(()).line(column) or {}
    return panel, style.pop("label"), style


def tasks_in(columns: Iterable[str]) -> list[str]:
    """Task names in history order: every row has ``<task>/weight`` for every task, so the order
    (hence the colours) does not depend on which tasks trained first."""
    parsed = [parse_column(str(c)) for c in columns]
    tasks = [c.task for c in parsed if c.kind == "weight" and c.task and not c.linkedset]
    tasks += [c.task for c in parsed if c.kind in _TASK_PANELS and c.task]  # histories without weight columns:
    return list(dict.fromkeys(tasks))  # the order of first appearance


def thin(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``max_points`` evenly spaced points (first and last kept)."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    stride = (n - 1) / (max_points - 1)
    idx = [round(i * stride) for i in range(max_points)]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def smooth(ys: Sequence[float], factor: float) -> list[float]:
    """Exponential moving average with debiasing (TensorBoard's smoothing); ``factor`` in [0, 1)."""
    if not 0.0 <= factor < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {factor!r}")
    if factor == 0.0:
        return list(ys)
    out, avg = [], 0.0
    for i, y in enumerate(ys, start=1):
        avg = factor * avg + (1.0 - factor) * y
        out.append(avg / (1.0 - factor ** i))
    return out


def as_frame(history: HistoryLike) -> pd.DataFrame:
    """A history DataFrame from a DataFrame, a ``Trainer`` or a ``History``."""
    if isinstance(history, pd.DataFrame):
        return history
    if hasattr(history, "history") and isinstance(history.history, pd.DataFrame):
        return history.history
    if hasattr(history, "frame"):
        return history.frame()
    raise TypeError(f"expected a history DataFrame, a Trainer or a History, got {type(history).__name__}")


def steps_of(df: pd.DataFrame) -> pd.Series:
    """The step of each row: the ``step`` column, else an index named ``step``, else 1, 2, ..."""
    if "step" in df.columns:
        return pd.to_numeric(df["step"], errors="coerce")
    if df.index.name == "step":
        return pd.Series(pd.to_numeric(df.index, errors="coerce"), index=df.index)
    return pd.Series(range(1, len(df) + 1), index=df.index)


def series_from_frame(df: pd.DataFrame, panel: str | None = None) -> dict[str, Series]:
    """Plotted columns of ``df`` (optionally one panel's) as ``column -> (steps, values)``, NaNs dropped."""
    out: dict[str, Series] = {}
    steps = steps_of(df)
    for col in df.columns:
        where = panel_of(str(col))
        if where is None or (panel is not None and where[0] != panel):
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        keep = values.notna()
        out[str(col)] = (steps[keep].tolist(), values[keep].tolist())
    return out


def validation_series(validation: Validation) -> dict[str, Series]:
    """Validation points as ``name -> (steps, losses)``, names matching the loss lines.

    Accepts evaluate events (dicts with step, task, linkedset, loss: name ``"task/linkedset"``),
    validation records of the loop (dicts with step and ``"task"`` / ``"task/linkedset"`` keys), or a
    DataFrame of either. A task's points equal to those of its only linked set are left out (drawn, its marker
    would hide under the set's, and the legend would name a marker no one can see).
    """
    if validation is None:
        return {}
    records: Iterable[Mapping[str, Any]]
    records = validation.to_dict("records") if isinstance(validation, pd.DataFrame) else validation
    points: dict[str, dict[float, float]] = {}  # name -> step -> value: the loop's record and the evaluate
    # events it made for the same step give one point, not two
    for r in records:
        if "task" in r and "linkedset" in r:
            items = [(set_key(r["task"], r["linkedset"]), r["loss"])]
        else:
            skip = {"step", "loss", "lr", "lr_scale", "tries", "best", "action"}
            items = [(k, v) for k, v in r.items() if k not in skip and isinstance(v, (int, float))]
        for key, value in items:
            if isinstance(value, (int, float)) and math.isfinite(value):
                points.setdefault(str(key), {})[r["step"]] = float(value)
    for key in [k for k in points if "/" not in k]:  # a task of one linked set: its points are the set's, and
        sets = [k for k in points if k.startswith(f"{key}/")]  # two markers on one place read as one, the
        if len(sets) == 1 and points[sets[0]] == points[key]:  # legend naming a marker no one can see
            del points[key]
    return {k: (list(v), list(v.values())) for k, v in points.items()}
GO_BACK = re.compile(r"go_back_to_(\d+)")


def kept_validation(validation: Validation) -> list[Mapping[str, Any]]:
    """The validation records of the run the history kept. A go_back (``action`` holds ``go_back_to_N``) undoes
    the steps after N, and the history forgets them: the validations made after step N, its own included, judged
    states that are gone, and left in a plot they would repeat a step (a step validated after each go_back to
    before it) or sit past the end of the curves. ``validation.csv`` keeps them all; records without an action
    (evaluate events) are kept."""
    if validation is None:
        return []
    records = validation.to_dict("records") if isinstance(validation, pd.DataFrame) else list(validation)
    kept: list[Mapping[str, Any]] = []
    for r in records:
        back = GO_BACK.search(str(r.get("action", "")))
        if back is None:
            kept.append(r)
        else:
            kept = [k for k in kept if k["step"] <= int(back.group(1))]
    return kept


def events_from_frame(df: pd.DataFrame) -> list[tuple[float, str]]:
    """``(step, "what changed")`` for each row where the lr or a weight differs from the row before."""
    cols = [c for c in df.columns if c == "lr" or ((parsed := parse_column(str(c))).kind == "weight" and parsed.task)]
    if not cols or len(df) < 2:
        return []
    steps = steps_of(df).tolist()
    out = []
    prev = df[cols].iloc[0].to_dict()
    for i in range(1, len(df)):
        row = df[cols].iloc[i].to_dict()
        changed = [f"{c} {prev[c]:.3g} -> {row[c]:.3g}" for c in cols
                   if isinstance(row[c], (int, float)) and isinstance(prev[c], (int, float))
                   and not (math.isnan(row[c]) and math.isnan(prev[c])) and row[c] != prev[c]
                   and not (c == "lr" and _relative_change(prev[c], row[c]) < 0.05)]
        if changed:
            out.append((steps[i], ", ".join(changed)))
        prev = row
    return out


def _relative_change(a: float, b: float) -> float:
    """A decaying lr changes a little every step: only jumps of >= 5% count as events."""
    return abs(b - a) / max(abs(a), 1e-30)


def panels_for(series: Mapping[str, Series], ghost: Mapping[str, Series] | None = None) -> tuple[str, ...]:
    """The panels worth a place: loss and gradient norm; the clipped share only when something was
    clipped; combine weights and task cosines when a combination method recorded them."""
    found: set[str] = {"loss"}
    for source in (series, ghost or {}):
        for col, (_, ys) in source.items():
            where = panel_of(col)
            if where is None:
                continue
            if where[0] == "clip_fraction" and not any(y > 0 for y in ys):
                continue
            found.add(where[0])
    return tuple(p for p in PANELS if p in found)


def positive(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """The points whose y is above 0 (what a log axis can show)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def step_range(df: pd.DataFrame, validation: Validation = None, ghost: Mapping[str, Series] | None = None
               ) -> tuple[float, float] | None:
    """The step limits every figure of one history shares: its rows, validation points and ghost lines,
    padded a little (so that two PNGs of one run always agree)."""
    xs = [x for xs_, _ in (*series_from_frame(df).values(), *validation_series(validation).values(),
                           *(ghost or {}).values()) for x in xs_]
    if not xs:
        return None
    lo, hi = min(xs), max(xs)
    pad = max(0.02 * (hi - lo), 0.5)
    return lo - pad, hi + pad
