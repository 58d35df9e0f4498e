"""Plots of a trainer's history: helpers that return a matplotlib ``Figure`` (and accept ``ax=``),
usable headless (the experiment folder's PNGs are drawn here), and the pieces the dashboard's
``LivePlot`` draws with. Needs matplotlib (``pip install "mtlab[notebook]"``); the core never imports
this module.

Owned ``Figure`` objects only (never pyplot), so nothing depends on a GUI backend::

    fig = plot_losses(trainer.history, scale="log", smoothing=0.8)
    fig.savefig("losses.png")
    save_plots(trainer.history, "runs/exp1")   # losses.png, grad_norms.png, [clip_fraction.png,] history.png

How series are told apart (colour = task, dash = linked set, a marker per linked set for validation
points) and where panels and the shared legend go: ``plotstyle``. One panel per quantity (``panels_for``:
the clipped share only when something was clipped, combine weights and task cosines when a method
recorded them) on a shared step axis, in a grid chosen from the width; one legend row under the panels;
figures sized in pixels of a notebook's width (shown 1:1), every text at least 10 px. Changes of a weight
or of the learning rate found in the history are dotted lines with numbers that merge rather than
overprint (``events_from_frame`` lists them, the legend says what they are).
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, PercentFormatter

from ..core.columns import COMBINE, COSINE, DIRECTION, NOISE, parse_column, set_key
from ..core.journal import Journal
from .plotstyle import (  # noqa: F401 (re-exported: mtlab.plots.PALETTE, ...)
    DPI,
    EVENT,
    GHOST,
    INK,
    PALETTE,
    PANEL_SPECS,
    ROW_PX,
    SET_DASHES,
    SET_MARKERS,
    PanelSpec,
    Styles,
    figure_height,
    grid,
    legend_columns,
    task_colors,
    text_pt,
)

MAX_POINTS = 2000
WIDTH_PX = 830  # a notebook output's width in JupyterLab and Voila at 1280 px
PANELS = tuple(PANEL_SPECS)
TITLES = {name: spec.title for name, spec in PANEL_SPECS.items()}
MAX_EVENT_MARKS = 30
LEGEND_CELL = "legend cell"  # the label of the hidden axes in a grid's empty cells that may hold the legend
EVENTS_LABEL = "n: weight/lr change n"  # the dotted event lines' legend entry in saved figures

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
RunLike: TypeAlias = HistoryLike | str | Path  # a run of plot_runs: a trainer, a history, an experiment folder


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


def _steps(df: pd.DataFrame) -> pd.Series:
    """The step of each row: the ``step`` column, else an index named ``step``, else 1, 2, ..."""
    if "step" in df.columns:
        return pd.to_numeric(df["step"], errors="coerce")
    if df.index.name == "step":
        return pd.Series(pd.to_numeric(df.index, errors="coerce"), index=df.index)
    return pd.Series(range(1, len(df) + 1), index=df.index)


def series_from_frame(df: pd.DataFrame, panel: str | None = None) -> dict[str, Series]:
    """Plotted columns of ``df`` (optionally one panel's) as ``column -> (steps, values)``, NaNs dropped."""
    out: dict[str, Series] = {}
    steps = _steps(df)
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
    DataFrame of either.
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
    steps = _steps(df).tolist()
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


def new_figure(width_px: int = WIDTH_PX, height_px: int | None = None, dpi: int = DPI) -> Figure:
    """A Figure of exactly ``width_px`` x ``height_px`` pixels at ``dpi``, laid out by constrained layout."""
    height_px = height_px if height_px is not None else int(width_px * 0.42)
    return Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, layout=constrained_layout())


def constrained_layout() -> ConstrainedLayoutEngine:
    """The layout of every figure here: room for the shared legend and every label, no text over another."""
    return ConstrainedLayoutEngine(w_pad=4 / 72, h_pad=4 / 72, wspace=0.04, hspace=0.05)


def figure_of(ax: Axes) -> Figure:
    """The figure ``ax`` is drawn in (the root one, for an axes of a subfigure)."""
    fig = ax.get_figure(root=True)
    if fig is None:
        raise ValueError("these axes belong to no figure; make them with fig.add_subplot()")
    return fig


def panel_axes(fig: Figure, panels: Sequence[str], scale: str = "linear", cols: int | None = None,
               font_scale: float = 1.0) -> dict[str, Axes]:
    """One axes per panel (``cols`` columns) on a shared step axis; x tick labels and "step" only where
    no panel is below. The empty cells of the last row become one hidden axes labelled ``LEGEND_CELL``
    (``shared_legend`` puts the legend there when it fits)."""
    if cols is None:
        cols = grid(len(panels), int(fig.bbox.width), font_scale)[1]
    rows = math.ceil(len(panels) / cols)
    out: dict[str, Axes] = {}
    first: Axes | None = None
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1, sharex=first)
        first = first or ax
        decorate(ax, panel, scale, bottom=i + cols >= len(panels), font_scale=font_scale)
        out[panel] = ax
    spec = first.get_subplotspec() if first is not None else None
    if spec is not None and rows > 1 and len(panels) % cols:
        cell = fig.add_subplot(spec.get_gridspec()[rows - 1, len(panels) % cols:], label=LEGEND_CELL)
        cell.axis("off")
    return out


def _cell_fits(entries: Sequence[tuple[Any, str]], panels: int, width_px: int, font_scale: float) -> int:
    """Legend columns if ``entries`` fit in the empty cells of the last row of ``panels`` panels, else 0."""
    rows, cols = grid(panels, width_px, font_scale)
    if not entries or rows < 2 or not panels % cols:
        return 0
    size = text_pt("legend", font_scale)
    cell_w = width_px * (cols - panels % cols) / cols - 16
    ncols = legend_columns([label for _, label in entries], int(cell_w), size)
    lines = math.ceil(len(entries) / ncols)
    cell_h = (ROW_PX - 56) * font_scale ** 0.5  # the axes' share of a row, tick labels and title left out
    return ncols if lines * size * DPI / 72 * 1.55 + 6 <= cell_h else 0


def shared_legend(fig: Figure, entries: Sequence[tuple[Any, str]], font_scale: float = 1.0) -> Legend | None:
    """One legend for every panel: in the empty cell of the last row when it fits there, else in a row
    of its own under the panels, in as many columns as the width allows; never room taken from an axes.
    The ``Legend``, or None without entries."""
    cell = next((a for a in fig.axes if a.get_label() == LEGEND_CELL), None)
    for old in [*fig.legends, cell.get_legend() if cell is not None else None]:
        if old is not None:
            old.remove()
    if not entries:
        return None
    size = text_pt("legend", font_scale)
    handles, labels = [h for h, _ in entries], [label for _, label in entries]
    style = {"fontsize": size, "frameon": False, "handlelength": 2.2, "handletextpad": 0.6, "columnspacing": 1.2}
    panels = sum(1 for a in fig.axes if a.get_label() != LEGEND_CELL)
    ncols = _cell_fits(entries, panels, int(fig.bbox.width), font_scale) if cell is not None else 0
    if ncols:
        return cell.legend(handles, labels, loc="center", ncols=ncols, borderaxespad=0.0, **style)  # type: ignore[union-attr]
    ncols = legend_columns(labels, int(fig.bbox.width), size, fig.dpi)
    return fig.legend(handles, labels, loc="outside lower center", ncols=ncols, borderaxespad=0.2, **style)


def legend_lines(entries: Sequence[tuple[Any, str]], width_px: int, font_scale: float = 1.0) -> int:
    """How many lines the shared legend of ``entries`` takes at ``width_px``."""
    if not entries:
        return 0
    ncols = legend_columns([label for _, label in entries], width_px, text_pt("legend", font_scale))
    return math.ceil(len(entries) / ncols)


def layout_height(panels: int, entries: Sequence[tuple[Any, str]], width_px: int, font_scale: float = 1.0) -> int:
    """Pixels a figure of ``panels`` panels and this shared legend needs at ``width_px`` (no legend row
    when the legend fits in the last row's empty cell)."""
    rows, _ = grid(panels, width_px, font_scale)
    lines = 0 if _cell_fits(entries, panels, width_px, font_scale) else legend_lines(entries, width_px, font_scale)
    return figure_height(rows, lines, font_scale)


def decorate(ax: Axes, panel: str, scale: str = "linear", bottom: bool = True, font_scale: float = 1.0) -> None:
    """Title, tick label sizes and y axis of a panel (``PANEL_SPECS``)."""
    spec = PANEL_SPECS[panel]
    ax.set_title(spec.title, fontsize=text_pt("title", font_scale))
    if bottom:
        ax.set_xlabel("step", fontsize=text_pt("label", font_scale))
    else:
        ax.tick_params(labelbottom=False)
    ax.tick_params(which="both", labelsize=text_pt("tick", font_scale))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.grid(alpha=0.3)
    if spec.log or (panel == "loss" and scale == "log"):
        log_axis(ax)
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    if spec.percent:
        # A percentage, never "1e-5" offset labels: the axis starts at 0.
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=None))
        ax.set_ylim(bottom=0.0)
    if spec.ylim is not None:
        ax.set_ylim(*spec.ylim)


class _LogTicks(LogLocator):
    """Two to five labelled ticks on a log axis: decades; else 1, 2 and 5 of each decade; else (a
    short range) evenly spaced round numbers."""

    def tick_values(self, vmin: float, vmax: float) -> Any:
        lo, hi = sorted((vmin, vmax))
        if not (lo > 0 and math.isfinite(hi)):
            self.set_params(subs=(1.0,))
            return super().tick_values(vmin, vmax)
        inside = lambda ticks: [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        for subs in ((1.0,), (1.0, 2.0, 5.0)):
            self.set_params(subs=subs)
            ticks = super().tick_values(vmin, vmax)
            if 2 <= len(inside(ticks)) <= 5:
                return ticks
        return MaxNLocator(nbins=3, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)


def log_axis(ax: Axes) -> None:
    """A log y axis with at least two labels in plain numbers (``0.2``), minor ticks unlabelled:
    matplotlib's default labels every minor tick of a short range (they overprint in a small panel) or
    just one tick of a range within a decade."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(_LogTicks(base=10, numticks=5))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def event_groups(events: Sequence[tuple[float, str]], xlim: tuple[float, float], axes_px: float,
                 font_px: float = text_pt("event") * DPI / 72) -> list[tuple[float, str]]:
    """Numbered event labels that never overprint: events closer than their labels' width merge into
    one label that cannot read as a range of steps (``3,4,5``; more than three: ``3 +4``, event 3 and the 4
    after it); ``(x, label)`` for the last ``MAX_EVENT_MARKS`` events inside ``xlim`` (an event at step inf,
    of an abandoned branch, never is)."""
    lo, hi = xlim
    per_step = axes_px / max(hi - lo, 1e-9)
    shown = [(n, s) for n, (s, _) in list(enumerate(events, start=1))[-MAX_EVENT_MARKS:] if lo <= s <= hi]
    width = lambda label: 0.7 * font_px * len(label) + 4
    groups: list[list[Any]] = []  # [x, first number, last number]
    for n, s in sorted(shown, key=lambda p: (p[1], p[0])):
        if groups:
            x0, first, _ = groups[-1]
            label = merged_label(first, n)
            if (s - x0) * per_step < width(label) / 2 + width(str(n)) / 2 + 3:
                groups[-1][2] = n
                continue
        groups.append([s, n, n])
    return [(x, merged_label(a, b)) for x, a, b in groups]


def merged_label(first: int, last: int) -> str:
    """The label of events ``first`` to ``last`` merged at one place: ``3``, ``3,4``, ``3,4,5``, ``3 +4``."""
    if last - first < 3:
        return ",".join(str(i) for i in range(first, last + 1))
    return f"{first} +{last - first}"


def mark_events(ax: Axes, events: Sequence[tuple[float, str]], labels: bool = True,
                axes_px: float | None = None, font_scale: float = 1.0, animated: bool = False) -> list[Any]:
    """A dotted vertical line at each event's step; with ``labels``, the numbers (see ``event_groups``)
    inside the top of the axes, clear of titles and legends. The artists added (``animated``: for a
    blitting figure)."""
    if not events:
        return []
    xlim = ax.get_xlim()
    if axes_px is None:
        fig = figure_of(ax)
        axes_px = fig.get_figwidth() * fig.dpi * ax.get_position().width * 0.9
    artists: list[Any] = []
    steps = sorted({s for s, _ in list(events)[-MAX_EVENT_MARKS:] if xlim[0] <= s <= xlim[1]})
    for s in steps:
        artists.append(ax.axvline(s, color=EVENT, lw=0.8, ls=":", zorder=1.5, label="_events", animated=animated))
    if labels:
        size = text_pt("event", font_scale)
        for x, label in event_groups(events, xlim, axes_px, size * DPI / 72):
            frac = (x - xlim[0]) / max(xlim[1] - xlim[0], 1e-9)
            ha = "left" if frac < 0.06 else "right" if frac > 0.94 else "center"
            artists.append(ax.annotate(label, (x, 1.0), xycoords=ax.get_xaxis_transform(), xytext=(0, -2),
                                       textcoords="offset points", ha=ha, va="top", fontsize=size,
                                       color=EVENT, annotation_clip=False, animated=animated))
    return artists


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


def _draw_panel(ax: Axes, panel: str, df: pd.DataFrame, styles: Styles, validation: Validation, max_points: int,
                scale: str, smoothing: float, ghost: Mapping[str, Series] | None) -> tuple[list[str], list[str]]:
    """The panel's lines on ``ax``; the columns and validation keys drawn (for the legend)."""
    series = series_from_frame(df, panel)
    log = PANEL_SPECS[panel].log or (panel == "loss" and scale == "log")
    for col, (xs, ys) in (ghost or {}).items():  # the abandoned branch first: under the live lines
        where = panel_of(col)
        if where is not None and where[0] == panel and xs:
            ax.plot(*thin(xs, ys, max_points), color=GHOST, lw=1.2, label="_ghost", zorder=1,
                    marker="o" if len(xs) == 1 else "")
    drawn: list[str] = []
    for col, (xs, ys) in series.items():
        if log:  # log axes: positive values only
            xs, ys = positive(xs, ys)
        style = styles.line(col) or {}
        marker = "o" if len(xs) == 1 else ""  # a single row draws a point, not empty axes
        if smoothing and panel == "loss" and len(ys) > 1:
            ax.plot(*thin(xs, ys, max_points), alpha=0.25, **{**style, "lw": 0.8, "label": "_raw"})
            ys = smooth(ys, smoothing)
        ax.plot(*thin(xs, ys, max_points), marker=marker, ms=4, **style)
        drawn.append(col)
    keys: list[str] = []
    if panel == "loss":
        for key, (xs, ys) in validation_series(validation).items():
            ax.plot(*thin(xs, ys, max_points), **styles.valid(key))
            keys.append(key)
        ys_all = [float(y) for ln in ax.lines for y in np.asarray(ln.get_ydata(), dtype=float)]
        if scale == "linear" and ys_all and min(ys_all) >= 0 and ax.get_ylim()[0] < 0:
            ax.set_ylim(bottom=0.0)  # a non-negative loss is never padded below 0 (nor squeezed onto it)
    if PANEL_SPECS[panel].percent:  # from 0 to a little above the largest share (not to 100%)
        ax.set_autoscaley_on(True)
        ax.relim()
        ax.autoscale_view(scalex=False)
        ax.set_ylim(bottom=0.0)
    if PANEL_SPECS[panel].ylim is None:
        pad_flat(ax)
    return drawn, keys


FLAT_DECADES = 0.3  # the shortest log range drawn: one point or a flat line gets distinct tick labels
FLAT_SHARE = 0.05  # a linear range under 2 x this share of the values' size is widened to it on each side


def pad_flat(ax: Axes) -> None:
    """Widen a y range too short to read (one point, a flat line, values equal but for rounding): autoscaling
    would magnify the rounding, with tick labels that all read the same. A log axis gets ``FLAT_DECADES``
    around its values; a linear range under ``FLAT_SHARE`` of their size gets that share each side (never
    below 0 for values that are not)."""
    ys = np.concatenate([np.asarray(ln.get_ydata(), dtype=float) for ln in ax.lines] or [np.zeros(0)])
    log = ax.get_yscale() == "log"
    ys = ys[np.isfinite(ys) & ((ys > 0) if log else True)]
    if not ys.size:
        return
    y0, y1 = float(ys.min()), float(ys.max())
    lo, hi = ax.get_ylim()
    if log:
        if lo > 0 and math.log10(hi) - math.log10(lo) < FLAT_DECADES:
            mid = (math.log10(y0) + math.log10(y1)) / 2
            ax.set_ylim(10 ** (mid - FLAT_DECADES / 2), 10 ** (mid + FLAT_DECADES / 2))
        return
    size = max(abs(y0), abs(y1))
    need = FLAT_SHARE * size if size > 0 else FLAT_SHARE
    if hi - lo < need:
        mid = (y0 + y1) / 2
        ax.set_ylim(max(mid - need, 0.0) if y0 >= 0 else mid - need, mid + need)


def _plot_panel(panel: str, history: HistoryLike, ax: Axes | None, validation: Validation = None, max_points: int = MAX_POINTS,
                scale: str = "linear", smoothing: float = 0.0, events: bool = True,
                ghost: Mapping[str, Series] | None = None, xlim: tuple[float, float] | None = None,
                width_px: int = 560) -> Figure:
    """One panel: in its own figure (legend under it; steps ``xlim``, else the history's own range) or
    on ``ax`` (legend inside the axes)."""
    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
    df = as_frame(history)
    styles = Styles(tasks_in(df.columns))
    marks = events_from_frame(df) if events else []
    own = ax is None
    if ax is None:
        cols = list(series_from_frame(df, panel))
        keys = list(validation_series(validation)) if panel == "loss" else []
        entries = Styles(tasks_in(df.columns)).legend(cols, keys, bool(ghost), EVENTS_LABEL if marks else None)
        fig = new_figure(width_px, layout_height(1, entries, width_px))
        ax = fig.add_subplot()
        decorate(ax, panel, scale)
        limits = xlim if xlim is not None else step_range(df, validation, ghost)
        if limits is not None:
            ax.set_xlim(*limits)
    fig = figure_of(ax)
    drawn, keys = _draw_panel(ax, panel, df, styles, validation, max_points, scale, smoothing, ghost)
    if events:
        mark_events(ax, marks)
    entries = styles.legend(drawn, keys, bool(ghost), EVENTS_LABEL if marks else None)
    if own:
        shared_legend(fig, entries)
    elif entries:
        ax.legend([h for h, _ in entries], [label for _, label in entries], fontsize=text_pt("legend"),
                  loc="best", framealpha=0.8)
    return fig


def plot_losses(history: HistoryLike, ax: Axes | None = None, validation: Validation = None, max_points: int = MAX_POINTS,
                scale: str = "linear", smoothing: float = 0.0, events: bool = True,
                ghost: Mapping[str, Series] | None = None, xlim: tuple[float, float] | None = None) -> Figure:
    """Normalized loss per task (colour) and per linked set (its dash) by step; validation points with
    a marker per linked set (circles: the task's).

    ``history``: ``trainer.history`` (or the trainer); ``validation``: evaluate events or the loop's
    validation records (see ``validation_series``); ``scale``: ``"linear"`` or ``"log"``;
    ``smoothing``: EMA factor in [0, 1) (raw curve kept faint); ``ghost``: ``column -> (steps, values)``
    drawn grey under the live lines (e.g. an abandoned branch); ``xlim``: the steps shown (default: the
    history's and the validation's range).
    """
    return _plot_panel("loss", history, ax, validation, max_points, scale, smoothing, events, ghost, xlim)


def plot_grad_norms(history: HistoryLike, ax: Axes | None = None, max_points: int = MAX_POINTS, events: bool = True,
                    xlim: tuple[float, float] | None = None) -> Figure:
    """Gradient norm per task (a line; after clipping: a wide faint band under it), log scale."""
    return _plot_panel("grad_norm", history, ax, None, max_points, events=events, xlim=xlim)


def plot_clip_fraction(history: HistoryLike, ax: Axes | None = None, max_points: int = MAX_POINTS,
                       events: bool = True, xlim: tuple[float, float] | None = None) -> Figure:
    """Share of gradient elements clipped, per task, in percent."""
    return _plot_panel("clip_fraction", history, ax, None, max_points, events=events, xlim=xlim)


def plot_history(history: HistoryLike, validation: Validation = None, max_points: int = MAX_POINTS, scale: str = "linear",
                 smoothing: float = 0.0, ghost: Mapping[str, Series] | None = None, width_px: int = WIDTH_PX,
                 height_px: int | None = None, font_scale: float = 1.0) -> Figure:
    """Every panel worth showing (``panels_for``) on one shared step axis, in a grid chosen from
    ``width_px`` (a notebook's width at 1280 px: shown 1:1), one legend under the panels."""
    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
    df = as_frame(history)
    series = series_from_frame(df)
    panels = panels_for(series, ghost)
    marks = events_from_frame(df)
    styles = Styles(tasks_in(df.columns))
    cols = [c for c in series if panel_of(c)[0] in panels]  # type: ignore[index]
    entries = Styles(tasks_in(df.columns)).legend(cols, validation_series(validation), bool(ghost),
                                                  EVENTS_LABEL if marks else None)
    fig = new_figure(width_px, height_px if height_px is not None
                     else layout_height(len(panels), entries, width_px, font_scale))
    axes = panel_axes(fig, panels, scale, font_scale=font_scale)
    limits = step_range(df, validation, ghost)
    if limits is not None:
        next(iter(axes.values())).set_xlim(*limits)  # shared by every panel
    top = set(list(axes)[:grid(len(panels), width_px, font_scale)[1]])
    drawn: list[str] = []
    keys: list[str] = []
    for panel, ax in axes.items():
        d, k = _draw_panel(ax, panel, df, styles, validation if panel == "loss" else None, max_points, scale,
                           smoothing, ghost)
        drawn += d
        keys += k
        mark_events(ax, marks, labels=panel in top, font_scale=font_scale)
    shared_legend(fig, styles.legend(drawn, keys, bool(ghost), EVENTS_LABEL if marks else None), font_scale)
    return fig


def history_figures(history: HistoryLike, validation: Validation = None) -> dict[str, Figure]:
    """The experiment folder's figures by name: losses, grad_norms, clip_fraction (only when something
    was clipped: a flat 0% says nothing) and history; all on the same step range. The validation points are
    those of the run the history kept (``kept_validation``): one per step, none past the curves."""
    df = as_frame(history)
    validation = kept_validation(validation)
    xlim = step_range(df, validation)
    figures = {"losses": plot_losses(df, validation=validation, xlim=xlim), "grad_norms": plot_grad_norms(df, xlim=xlim)}
    if "clip_fraction" in panels_for(series_from_frame(df, "clip_fraction")):
        figures["clip_fraction"] = plot_clip_fraction(df, xlim=xlim)
    figures["history"] = plot_history(df, validation)
    return figures


def figure_png(fig: Figure, dpi: float | None = None) -> bytes:
    """PNG bytes of an owned Figure (no pyplot, no GUI)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi="figure" if dpi is None else dpi)
    return buf.getvalue()


def figure_svg(fig: Figure) -> bytes:
    """SVG bytes of an owned Figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    return buf.getvalue()


def save_plots(history: HistoryLike, directory: str | Path, validation: Validation = None, dpi: float = DPI) -> list[Path]:
    """Write ``history_figures`` into ``directory`` as ``losses.png``, ``grad_norms.png``,
    ``clip_fraction.png`` (only when something was clipped) and ``history.png``; the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in history_figures(history, validation).items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------- runs side by side, noise scale
TASK_DASHES = ("-", "--", ":", "-.")
MODEL_DASHES = ((5, 2), (1.2, 1.6), (6, 1.5, 1.2, 1.5), (2.5, 1.2, 1.2, 1.2, 1.2, 1.2))  # noise scale per model


def _journal(run: RunLike) -> Journal | None:
    if isinstance(run, (str, Path)):
        return Journal.read_file(run) if (Path(run) / "journal.jsonl").is_file() else None
    journal = getattr(run, "journal", None)
    return journal if isinstance(journal, Journal) else None


def _legend_right(ax: Axes) -> None:
    """The legend outside the axes, to the right (the constrained layout makes room)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=text_pt("legend"), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, frameon=False, handlelength=1.8)


def _history(run: RunLike) -> pd.DataFrame:
    """A run's history: a trainer's, a DataFrame, or an experiment folder's history.csv."""
    if isinstance(run, (str, Path)):
        path = Path(run) / "history.csv"
        if not path.is_file():
            raise ValueError(f"plot_runs(): {run} holds no history.csv; give an experiment folder, a trainer or a "
                             "history DataFrame")
        return pd.read_csv(path)

    return as_frame(run)


def short_number(v: Any) -> str:
    """A knob's value as a person writes it: ``1e-3``, ``2.5e-4``, ``0.5``, ``16``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4):
        mantissa, exponent = f"{v:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{v:.3g}"


def change_in_words(entry: Mapping[str, Any]) -> str | None:
    """A journal's knob change in words, with the step from which it acts (``lr 1e-3 from step 31``); None for
    entries that set nothing a reader compares (a data position, a fork)."""
    kind, step = entry.get("kind"), int(entry.get("step", 0))
    at = f"from step {step + 1}"
    value = entry.get("value")
    if kind == "lr":
        return f"lr {short_number(value)} {at}"
    if kind == "weight":
        return f"{entry.get('task')}/{entry.get('linkedset')} weight {short_number(value)} {at}"
    if kind == "task_weight":
        return f"task {entry.get('task')} weight {short_number(value)} {at}"
    if kind == "clip":
        if value is None and entry.get("norm") is None and entry.get("percentile") is None:
            return f"clipping off {at}"
        parts = [f"{name} {short_number(entry[key])}" for key, name in (("value", "clip value"), ("norm", "clip norm"),
                                                                         ("percentile", "clip percentile"))
                 if entry.get(key) is not None]
        return f"{', '.join(parts)} {at}"
    if kind == "combine":
        method = entry.get("method")
        name = method.get("name", method.get("method", "custom")) if isinstance(method, Mapping) else method
        return f"combine {name} {at}"
    if kind == "minibatches_per_step":
        task = entry.get("task")
        return f"{'K' if task is None else f'{task}/K'} (minibatches per step) {value} {at}"
    if kind == "batch_size":
        return f"{entry.get('task')}/batch size {value} {at}"
    if kind == "reinitialize":
        return f"re-initialised at step {entry.get('from_step')}"
    if kind == "restore":
        return f"went back to step {entry.get('to_step')}"
    if kind == "resume":
        return f"resumed at step {entry.get('to_step')}"
    if kind in ("data_position", "fork"):
        return None
    return f"{kind} at step {step}"


def run_differences(journals: Mapping[str, Journal], per_run: int = 4) -> dict[str, list[str]]:
    """Run name -> what sets it apart in words (its knob changes after the past all the journals share), at most
    ``per_run`` (the latest) and a count of the rest."""
    lists = [j.entries for j in journals.values()]
    shared = 0
    if lists:
        shortest = min(len(e) for e in lists)
        while shared < shortest and all(e[shared] == lists[0][shared] for e in lists[1:]):
            shared += 1
    out: dict[str, list[str]] = {}
    for name, j in journals.items():
        said = [w for e in j.entries[shared:] if e["type"] == "change" and (w := change_in_words(e))]
        more = len(said) - per_run
        out[name] = said[-per_run:] if more <= 0 else [f"{more} earlier change(s)", *said[-per_run:]]
    return out


def parting_step(base: pd.DataFrame, other: pd.DataFrame, columns: Sequence[str]) -> float | None:
    """The last step ``other`` shares with ``base`` (same values of ``columns`` at every step up to it): a fork's
    shared past, drawn once; None when they share no step."""
    a = base.set_index(_steps(base))[list(c for c in columns if c in base.columns)]
    b = other.set_index(_steps(other))[list(c for c in columns if c in other.columns)]
    last = None
    for step in b.index:
        if step not in a.index or not a.columns.equals(b.columns):
            break
        x, y = a.loc[[step]].to_numpy(float)[0], b.loc[[step]].to_numpy(float)[0]
        if not np.allclose(x, y, rtol=0, atol=1e-12, equal_nan=True):
            break
        last = float(step)
    return last


def plot_runs(runs: Mapping[str, RunLike], panel: str = "loss", width_px: int = WIDTH_PX,
              height_px: int | None = None, differences: bool = True) -> Figure:
    """One panel (``loss``, ``grad_norm``, ... as in ``plot_history``) with every run on it: a colour per run,
    a dash per task; a fork's shared past is drawn once (in the first run's colour), each branch from where it
    parts. Under the axes, one legend and, for runs with journals (trainers, experiment folders), what sets each
    run apart in words (``lr 1e-3 from step 31``). Runs are trainers, experiment folders or history DataFrames.
    ``height_px`` (default: what the text under the axes needs) is grown where it would leave the axes too short
    to read beside that text.

    >>> fig = plot_runs({"main": trainer, "lower-lr": branch})  # doctest: +SKIP
    """
    if not runs:
        raise ValueError("plot_runs(): give at least one run, e.g. {'main': trainer, 'branch': trainer.fork('b')}")
    if panel not in PANEL_SPECS:
        raise ValueError(f"plot_runs(): panel must be one of {list(PANEL_SPECS)}, got {panel!r}")
    frames = {name: _history(run) for name, run in runs.items()}
    tasks = list(dict.fromkeys(t for df in frames.values() for t in tasks_in(df.columns)))
    journals = {name: j for name, run in runs.items() if (j := _journal(run)) is not None} if differences else {}
    said = run_differences(journals) if len(journals) > 1 or (journals and len(runs) == 1) else {}
    entries = [(Line2D([], [], color=PALETTE[i % len(PALETTE)], lw=2.2), name) for i, name in enumerate(frames)]
    if len(tasks) > 1:
        entries += [(Line2D([], [], color="#555555", lw=1.4, ls=TASK_DASHES[i % len(TASK_DASHES)]), f"task {t}")
                    for i, t in enumerate(tasks)]
    size = text_pt("legend")
    line_px = size * DPI / 72 * 1.55
    chars = max(int((width_px - 24) / (size * DPI / 72 * 0.56)), 30)
    text_lines: list[str] = []
    for name, changes in said.items():
        text_lines += textwrap.wrap(f"{name}: " + ("; ".join(changes) if changes else "no change of its own"),
                                    chars, subsequent_indent="    ")
    legend_h = legend_lines(entries, width_px) * line_px
    below = legend_h + len(text_lines) * line_px + 14
    axes_h = ROW_PX + 60  # the axes with their title, tick labels and axis label
    needed = int(axes_h + below + 30)
    height = needed if height_px is None else max(int(height_px), needed)  # too small a height: grown, never
    fig = new_figure(width_px, height)  # the axes squeezed under the text
    grid_spec = fig.add_gridspec(2, 1, height_ratios=[height - below - 30, below])
    ax = fig.add_subplot(grid_spec[0])
    cell = fig.add_subplot(grid_spec[1], label=LEGEND_CELL)
    cell.axis("off")
    base_name, base = next(iter(frames.items()))
    base_series = series_from_frame(base, panel)
    columns = list(base_series)
    for i, (name, df) in enumerate(frames.items()):
        color = PALETTE[i % len(PALETTE)]
        start = parting_step(base, df, columns) if name != base_name else None
        for col, (xs, ys) in series_from_frame(df, panel).items():
            parsed = parse_column(col)
            if parsed.linkedset or parsed.group or parsed.task not in tasks:  # per-linked-set and per-model
                continue  # columns: too many lines
            if start is not None:
                keep = [k for k, x in enumerate(xs) if x >= start]
                xs, ys = [xs[k] for k in keep], [ys[k] for k in keep]
            elif name != base_name and xs and col in base_series:  # a branch whose history starts after the fork:
                bx, by = base_series[col]  # joined to the first run's line where they part
                before = [k for k, x in enumerate(bx) if x < xs[0]]
                if before:
                    xs, ys = [bx[before[-1]], *xs], [by[before[-1]], *ys]
            xs, ys = thin(xs, ys)
            ax.plot(xs, ys, color=color, ls=TASK_DASHES[tasks.index(parsed.task) % len(TASK_DASHES)], lw=1.4,
                    marker="o" if len(xs) == 1 else "", ms=4, label=f"{name}: {parsed.task}")
    ax.set_xlabel("step", fontsize=text_pt("label"))
    ax.set_title(f"{PANEL_SPECS[panel].title} of {len(frames)} run(s)", fontsize=text_pt("title"))
    ax.tick_params(which="both", labelsize=text_pt("tick"))
    ax.grid(alpha=0.3)
    if PANEL_SPECS[panel].log:
        log_axis(ax)
    cell.legend([h for h, _ in entries], [label for _, label in entries], loc="upper center",
                bbox_to_anchor=(0.5, 1.0), ncols=legend_columns([label for _, label in entries], width_px, size),
                fontsize=size, frameon=False, handlelength=2.2, borderaxespad=0.0)
    for k, text in enumerate(text_lines):
        cell.annotate(text, (0.0, 1.0), xycoords="axes fraction", xytext=(4, -(legend_h + 6 + k * line_px)),
                      textcoords="offset pixels", va="top", ha="left", fontsize=size, color=INK)
    return fig


def plot_noise_scale(history: HistoryLike, ax: Axes | None = None, models: bool = True) -> Figure:
    """``gns/<task>`` (solid) and ``gns/<task>/<model>`` (thin, a dash per model) over the steps, log scale: the
    batch size (in normalizer units) beyond which a bigger batch stops paying off. Every line its own colour
    (task) and dash (model)."""

    df = as_frame(history)
    if ax is None:
        fig = new_figure(560, 260)
        ax = fig.add_subplot()
    fig = figure_of(ax)
    cols = {str(c): parsed for c in df.columns if (parsed := parse_column(str(c))).kind == NOISE}
    colors = task_colors(sorted({parsed.task for parsed in cols.values()}))
    steps = pd.to_numeric(df["step"], errors="coerce") if "step" in df else pd.Series(range(1, len(df) + 1))
    drawn = 0
    models_seen: dict[str, int] = {}  # a dash per model: every (task, model) line its own colour and dash
    for col, parsed in cols.items():
        task, model = parsed.task, parsed.group
        if model and not models:
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        keep = values.notna() & (values > 0)
        if not keep.any():
            continue
        dash: dict[str, Any] = {} if not model else {"dashes": MODEL_DASHES[models_seen.setdefault(model, len(models_seen))
                                                             % len(MODEL_DASHES)]}
        ax.plot(steps[keep].tolist(), values[keep].tolist(), color=colors[task], lw=1.1 if model else 1.8,
                label=f"{task} [{model}]" if model else task, **dash)
        drawn += 1
    ax.set_title("gradient noise scale B_simple (EMA)", fontsize=text_pt("title"))
    ax.set_xlabel("step", fontsize=text_pt("label"))
    ax.tick_params(which="both", labelsize=text_pt("tick"))
    ax.grid(alpha=0.3)
    if drawn:
        log_axis(ax)
        _legend_right(ax)
    else:
        ax.text(0.5, 0.5, "no noise scale yet: Trainer(noise_scale=True) and two or more minibatches per step",
                transform=ax.transAxes, ha="center", va="center", fontsize=text_pt("label"))
    return fig


__all__: Sequence[str] = ["plot_noise_scale", "plot_runs"]
