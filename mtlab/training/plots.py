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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..core.columns import NOISE, parse_column
# The names of the figure parts, the series and the run plots, re-exported: mtlab.plots is the one place a
# notebook reaches them from (mtlab.plots.PALETTE, mtlab.plots.plot_runs, ...).
from .plotparts import (  # noqa: F401
    EVENTS_LABEL,
    FLAT_DECADES,
    FLAT_SHARE,
    LEGEND_CELL,
    MAX_EVENT_MARKS,
    WIDTH_PX,
    constrained_layout,
    decorate,
    event_groups,
    figure_of,
    figure_png,
    figure_svg,
    layout_height,
    legend_lines,
    legend_right,
    log_axis,
    mark_events,
    merged_label,
    new_figure,
    pad_flat,
    panel_axes,
    shared_legend,
)
from .plotseries import (  # noqa: F401
    GO_BACK,
    HasFrame,
    HasHistory,
    HistoryLike,
    MAX_POINTS,
    PANELS,
    Series,
    TITLES,
    Validation,
    as_frame,
    events_from_frame,
    kept_validation,
    panel_of,
    panels_for,
    positive,
    series_from_frame,
    smooth,
    step_range,
    steps_of,
    tasks_in,
    thin,
    validation_series,
)
from .plotstyle import (  # noqa: F401
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
from .runplots import (  # noqa: F401
    RunLike,
    TASK_DASHES,
    change_in_words,
    parting_step,
    plot_runs,
    run_differences,
    short_number,
)


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
                 height_px: int | None = None, font_scale: float = 1.0,
                 events: Sequence[tuple[float, str]] | None = None) -> Figure:
    """Every panel worth showing (``panels_for``) on one shared step axis, in a grid chosen from
    ``width_px`` (a notebook's width at 1280 px: shown 1:1), one legend under the panels. ``events``: the
    ``(step, text)`` marks to draw, numbered in that order (a dashboard's); default: the knob changes the
    history's columns show."""
    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
    df = as_frame(history)
    series = series_from_frame(df)
    panels = panels_for(series, ghost)
    marks = events_from_frame(df) if events is None else list(events)
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
MODEL_DASHES = ((5, 2), (1.2, 1.6), (6, 1.5, 1.2, 1.5), (2.5, 1.2, 1.2, 1.2, 1.2, 1.2))  # noise scale per model


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
        legend_right(ax)
    else:
        ax.text(0.5, 0.5, "no noise scale yet: Trainer(noise_scale=True) and two or more minibatches per step",
                transform=ax.transAxes, ha="center", va="center", fontsize=text_pt("label"))
    return fig


__all__: Sequence[str] = ["history_figures", "plot_clip_fraction", "plot_grad_norms", "plot_history", "plot_losses",
                          "plot_noise_scale", "save_plots"]
