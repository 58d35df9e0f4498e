"""Plots of a trainer's history: helpers that return a matplotlib ``Figure`` (and accept ``ax=``),
usable headless (the experiment folder's PNGs are drawn here), and the ``LivePlot`` the dashboard
redraws. Needs matplotlib (``pip install "mtlab[notebook]"``); the core never imports this module.

Owned ``Figure`` objects only (never pyplot), so nothing depends on a GUI backend::

    fig = plot_losses(trainer.history, scale="log", smoothing=0.8)
    fig.savefig("losses.png")
    save_plots(trainer.history, "runs/exp1")   # losses.png, grad_norms.png, clip_fraction.png, history.png

Every figure gives a task the same colour (``task_colors``: the tasks' order, tab10), in every
panel, live or saved; linked sets share their task's colour with their own dash pattern. One panel per
quantity (``panels_for``: the clipped share only when something was clipped, combine weights and task
cosines when a method recorded them) on a shared step axis; legends sit outside the axes, laid out so
that no two texts overlap; figures are sized in pixels of a notebook's width (shown 1:1). Changes of a
weight or of the learning rate found in the history are dotted lines with numbers that merge rather
than overprint (``events_from_frame`` lists them). The dashboard's live figure is
``mtlab.ui.liveplot.LivePlot``, drawn with these helpers.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter

MAX_POINTS = 2000
DPI = 100  # figures are sized in pixels of the notebook's width at this dpi: shown 1:1, never downscaled
WIDTH_PX = 830  # a notebook output's width in JupyterLab and Voila at 1280 px
PANELS = ("loss", "grad_norm", "clip_fraction", "combine", "cosine")
TITLES = {"loss": "normalized loss", "grad_norm": "gradient norm (dashed: clipped)",
          "clip_fraction": "elements clipped", "combine": "combine weights", "cosine": "task cosine"}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
SET_DASHES = ((4, 2), (1, 1.5), (5, 1.5, 1, 1.5), (2, 2), (6, 1))
GHOST = "#c4c4c4"
EVENT = "#666666"
MAX_EVENT_MARKS = 30
FONT = 8  # points: 11 px at DPI 100

Series = tuple[Sequence[float], Sequence[float]]


def panel_of(column: str) -> tuple[str, str, dict[str, Any]] | None:
    """Which panel a history column goes to, its legend label and line style; None if not plotted.

    ``"a/loss"`` -> loss panel, label ``"a"``; ``"a/clean/loss"`` -> ``"a/clean"`` (thin, dashed);
    ``"a/grad_norm_clipped"`` -> gradient panel, dashed; ``"direction_norm"`` -> gradient panel, black;
    ``"combine/<group>/a"`` -> combine weights; ``"cos/<model>/a,b"`` -> task cosines.
    """
    if column.startswith("combine/"):
        group, _, task = column[len("combine/"):].rpartition("/")
        return ("combine", f"{task} [{group}]" if group else task, {"lw": 1.5})
    if column.startswith("cos/"):
        model, _, pair = column[len("cos/"):].rpartition("/")
        return ("cosine", f"{pair.replace(',', '~')} [{model}]" if model else pair.replace(",", "~"),
                {"lw": 1.2, "pair": True})
    if column == "direction_norm" or column.startswith("direction_norm/"):
        rest = column[len("direction_norm/"):] if "/" in column else ""
        return ("grad_norm", f"direction{' [' + rest + ']' if rest else ''}", {"lw": 1.0, "color": "#222222"})
    if column.endswith("/loss"):
        label = column[: -len("/loss")]
        return ("loss", label, {"lw": 1.8} if "/" not in label else {"lw": 1.0, "ls": "--"})
    if column.endswith("/grad_norm"):
        return ("grad_norm", column[: -len("/grad_norm")], {"lw": 1.5})
    if column.endswith("/grad_norm_clipped"):
        return ("grad_norm", column[: -len("/grad_norm_clipped")] + " (clipped)", {"lw": 1.0, "ls": "--"})
    if column.endswith("/clip_fraction"):
        return ("clip_fraction", column[: -len("/clip_fraction")], {"lw": 1.5})
    return None


def task_colors(tasks: Iterable[str]) -> dict[str, str]:
    """One colour per task, by the tasks' order (the same order gives the same colours everywhere)."""
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(dict.fromkeys(tasks))}


def tasks_in(columns: Iterable[str]) -> list[str]:
    """Task names in history order: every row has ``<task>/weight`` for every task, so the order
    (hence the colours) does not depend on which tasks trained first."""
    cols = [str(c) for c in columns]
    tasks = [c[: -len("/weight")] for c in cols if c.endswith("/weight") and c.count("/") == 1]
    for c in cols:  # histories without weight columns: the order of first appearance
        where = panel_of(c)
        if where is not None and where[0] in ("loss", "grad_norm", "clip_fraction") \
                and not c.startswith("direction_norm"):
            tasks.append(where[1].split(" ")[0].split("/")[0])
    return list(dict.fromkeys(tasks))


def line_style(label: str, base: dict[str, Any], colors: Mapping[str, str], set_index: dict[str, int]) -> dict[str, Any]:
    """The task's colour; a linked set gets its own dash pattern (same colour as its task); a task pair
    (cosines) a colour of its own."""
    style = dict(base)
    if style.pop("pair", False):
        i = set_index.setdefault("pair:" + label, len([k for k in set_index if k.startswith("pair:")]))
        style["color"] = PALETTE[(len(colors) + i) % len(PALETTE)]
        return style
    task, _, rest = label.split(" ")[0].partition("/")
    style.setdefault("color", colors.get(task, PALETTE[len(colors) % len(PALETTE)]))
    if rest and style.get("ls") == "--":
        i = set_index.setdefault(label, len([k for k in set_index if k.startswith(task + "/")]))
        style.pop("ls")
        style["dashes"] = SET_DASHES[i % len(SET_DASHES)]
    return style


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


def as_frame(history: Any) -> pd.DataFrame:
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


def validation_series(validation: Any) -> dict[str, Series]:
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
            items = [(f"{r['task']}/{r['linkedset']}", r["loss"])]
        else:
            skip = {"step", "loss", "lr", "lr_scale", "tries", "best", "action"}
            items = [(k, v) for k, v in r.items() if k not in skip and isinstance(v, (int, float))]
        for key, value in items:
            if isinstance(value, (int, float)) and math.isfinite(value):
                points.setdefault(str(key), {})[r["step"]] = float(value)
    return {k: (list(v), list(v.values())) for k, v in points.items()}


def events_from_frame(df: pd.DataFrame) -> list[tuple[float, str]]:
    """``(step, "what changed")`` for each row where the lr or a weight differs from the row before."""
    cols = [c for c in df.columns if c == "lr" or str(c).endswith("/weight")]
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


def grid(n: int) -> tuple[int, int]:
    """Rows and columns for ``n`` panels: one row up to 3, else 2 rows."""
    cols = n if n <= 3 else (2 if n == 4 else 3)
    return math.ceil(n / cols), cols


def new_figure(width_px: int = WIDTH_PX, height_px: int | None = None, dpi: int = DPI) -> Figure:
    """A Figure of exactly ``width_px`` x ``height_px`` pixels at ``dpi``, laid out by constrained layout
    (legends outside the axes get their room; nothing overlaps)."""
    height_px = height_px if height_px is not None else int(width_px * 0.42)
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, layout="constrained")
    fig.get_layout_engine().set(w_pad=3 / 72, h_pad=3 / 72, wspace=0.03, hspace=0.04)  # the live plot's PADS
    return fig


def panel_axes(fig: Figure, panels: Sequence[str], scale: str = "linear") -> dict[str, Axes]:
    """One axes per panel on a shared step axis; x tick labels and "step" only where no panel is below."""
    rows, cols = grid(len(panels))
    out: dict[str, Axes] = {}
    first: Axes | None = None
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1, sharex=first)
        first = first or ax
        _decorate(ax, panel, scale, bottom=i + cols >= len(panels))
        out[panel] = ax
    return out


def _axes(ax: Axes | None, width_px: int = 560, height_px: int = 260) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    fig = new_figure(width_px, height_px)
    return fig, fig.add_subplot()


def legend_outside(ax: Axes, handles: Sequence[Any] | None = None) -> None:
    """The legend outside the axes, to the right: it never covers a curve (the layout makes room)."""
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, [h.get_label() for h in handles], fontsize=FONT - 1, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False, handlelength=1.8)


def _decorate(ax: Axes, panel: str, scale: str = "linear", bottom: bool = True) -> None:
    ax.set_title(TITLES[panel], fontsize=FONT + 1)
    if bottom:
        ax.set_xlabel("step", fontsize=FONT)
    else:
        ax.tick_params(labelbottom=False)
    ax.tick_params(which="both", labelsize=FONT - 1)
    ax.grid(alpha=0.3)
    if panel == "grad_norm" or (panel == "loss" and scale == "log"):
        log_axis(ax)
    if panel == "clip_fraction":
        # A percentage, never "1e-5" offset labels: the axis starts at 0.
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=None))
        ax.set_ylim(bottom=0.0)
    if panel == "cosine":
        ax.set_ylim(-1.05, 1.05)


class _FewLogTicks(LogLocator):
    """Decades; 1, 2 and 5 of each decade only when the range spans under 1.5 decades (few labels either way)."""

    def tick_values(self, vmin: float, vmax: float) -> Any:
        lo, hi = sorted((vmin, vmax))
        short = lo > 0 and math.log10(hi / lo) < 1.5
        self.set_params(subs=(1.0, 2.0, 5.0) if short else (1.0,))
        return super().tick_values(vmin, vmax)


def log_axis(ax: Axes) -> None:
    """A log y axis labelled at 1, 2 and 5 of each decade in plain numbers (``0.2``), minor ticks unlabelled:
    matplotlib's default labels every minor tick of a short range, and they overprint in a small panel."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(_FewLogTicks(base=10, numticks=5))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def event_groups(events: Sequence[tuple[float, str]], xlim: tuple[float, float], axes_px: float,
                 font_px: float = (FONT - 1) * DPI / 72) -> list[tuple[float, str]]:
    """Numbered event labels that never overprint: events closer than their labels' width merge into
    one label (``3-5``); ``(x, label)`` for the last ``MAX_EVENT_MARKS`` events inside ``xlim``."""
    lo, hi = xlim
    per_step = axes_px / max(hi - lo, 1e-9)
    shown = [(n, s) for n, (s, _) in list(enumerate(events, start=1))[-MAX_EVENT_MARKS:] if lo <= s <= hi]
    width = lambda label: 0.7 * font_px * len(label) + 4
    groups: list[list[Any]] = []  # [x, first number, last number]
    for n, s in sorted(shown, key=lambda p: (p[1], p[0])):
        if groups:
            x0, first, _ = groups[-1]
            label = f"{first}-{n}"
            if (s - x0) * per_step < width(label) / 2 + width(str(n)) / 2 + 3:
                groups[-1][2] = n
                continue
        groups.append([s, n, n])
    return [(x, str(a) if a == b else f"{a}-{b}") for x, a, b in groups]


def mark_events(ax: Axes, events: Sequence[tuple[float, str]], labels: bool = True,
                 axes_px: float | None = None) -> list[Any]:
    """A dotted vertical line at each event's step; with ``labels``, the numbers (see ``event_groups``)
    inside the top of the axes, clear of titles and legends. The artists added."""
    if not events:
        return []
    xlim = ax.get_xlim()
    if axes_px is None:
        fig = ax.figure
        axes_px = fig.get_figwidth() * fig.dpi * ax.get_position().width * 0.9
    artists: list[Any] = []
    steps = sorted({s for s, _ in list(events)[-MAX_EVENT_MARKS:] if xlim[0] <= s <= xlim[1]})
    for s in steps:
        artists.append(ax.axvline(s, color=EVENT, lw=0.8, ls=":", zorder=1.5, label="_events"))
    if labels:
        for x, label in event_groups(events, xlim, axes_px):
            frac = (x - xlim[0]) / max(xlim[1] - xlim[0], 1e-9)
            ha = "left" if frac < 0.06 else "right" if frac > 0.94 else "center"
            artists.append(ax.annotate(label, (x, 1.0), xycoords=ax.get_xaxis_transform(), xytext=(0, -2),
                                       textcoords="offset points", ha=ha, va="top", fontsize=FONT - 1,
                                       color=EVENT, annotation_clip=False))
    return artists


def positive(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """The points whose y is above 0 (what a log axis can show)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _plot_panel(panel: str, history: Any, ax: Axes | None, validation: Any = None, max_points: int = MAX_POINTS,
                scale: str = "linear", smoothing: float = 0.0, events: bool = True,
                ghost: Mapping[str, Series] | None = None, colors: Mapping[str, str] | None = None,
                labels: bool = True) -> Figure:
    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
    own = ax is None
    fig, ax = _axes(ax)
    if own:
        _decorate(ax, panel, scale)
    df = as_frame(history)
    series = series_from_frame(df, panel)
    colors = dict(colors) if colors is not None else task_colors(tasks_in(df.columns))
    set_index: dict[str, int] = {}
    log = panel == "grad_norm" or (panel == "loss" and scale == "log")
    for col, (xs, ys) in (ghost or {}).items():  # the abandoned branch first: under the live lines
        where = panel_of(col)
        if where is not None and where[0] == panel and xs:
            ax.plot(*thin(xs, ys, max_points), color=GHOST, lw=1.2, label="_ghost", zorder=1,
                    marker="o" if len(xs) == 1 else "")
    for col, (xs, ys) in series.items():
        _, label, base = panel_of(col)  # type: ignore[misc]
        if log:  # log axes: positive values only
            xs, ys = positive(xs, ys)
        style = line_style(label, base, colors, set_index)
        marker = "o" if len(xs) == 1 else ""  # a single row draws a point, not empty axes
        if smoothing and panel == "loss" and len(ys) > 1:
            ax.plot(*thin(xs, ys, max_points), alpha=0.25, label="_raw", **{**style, "lw": 0.8})
            ys = smooth(ys, smoothing)
        ax.plot(*thin(xs, ys, max_points), label=label, marker=marker, ms=4, **style)
    if panel == "loss":
        for key, (xs, ys) in validation_series(validation).items():
            color = colors.get(key.split("/")[0], "#000000")
            ax.plot(*thin(xs, ys, max_points), ls="none", marker="o" if "/" not in key else "s", ms=5,
                    mfc="white", mec=color, mew=1.4, label=f"{key} (valid)")
        ys_all = [y for ln in ax.lines for y in ln.get_ydata()]
        if scale == "linear" and ys_all and min(ys_all) >= 0:
            ax.set_ylim(bottom=0.0)  # a non-negative loss is never padded below 0
    if events:
        mark_events(ax, events_from_frame(df), labels=labels)
    legend_outside(ax)
    return fig


def plot_losses(history: Any, ax: Axes | None = None, validation: Any = None, max_points: int = MAX_POINTS,
                scale: str = "linear", smoothing: float = 0.0, events: bool = True,
                ghost: Mapping[str, Series] | None = None) -> Figure:
    """Normalized loss per task (solid) and per linked set (dashed) by step; validation points as circles.

    ``history``: ``trainer.history`` (or the trainer); ``validation``: evaluate events or the loop's
    validation records (see ``validation_series``); ``scale``: ``"linear"`` or ``"log"``;
    ``smoothing``: EMA factor in [0, 1) (raw curve kept faint); ``ghost``: ``column -> (steps, values)``
    drawn grey under the live lines (e.g. an abandoned branch).
    """
    return _plot_panel("loss", history, ax, validation, max_points, scale, smoothing, events, ghost)


def plot_grad_norms(history: Any, ax: Axes | None = None, max_points: int = MAX_POINTS, events: bool = True) -> Figure:
    """Gradient norm per task before (solid) and after clipping (dashed), log scale."""
    return _plot_panel("grad_norm", history, ax, None, max_points, events=events)


def plot_clip_fraction(history: Any, ax: Axes | None = None, max_points: int = MAX_POINTS,
                       events: bool = True) -> Figure:
    """Share of gradient elements clipped, per task, in percent."""
    return _plot_panel("clip_fraction", history, ax, None, max_points, events=events)


def plot_history(history: Any, validation: Any = None, max_points: int = MAX_POINTS, scale: str = "linear",
                 smoothing: float = 0.0, ghost: Mapping[str, Series] | None = None, width_px: int = WIDTH_PX,
                 height_px: int | None = None) -> Figure:
    """Every panel worth showing (``panels_for``) on one shared step axis, sized to ``width_px`` (a
    notebook's width at 1280 px: shown 1:1); legends to the right of each panel."""
    df = as_frame(history)
    series = series_from_frame(df)
    panels = panels_for(series, ghost)
    rows, _ = grid(len(panels))
    fig = new_figure(width_px, height_px if height_px is not None else (300 if rows == 1 else 480))
    axes = panel_axes(fig, panels, scale)
    xs = [x for xs_, _ in (*series.values(), *(ghost or {}).values()) for x in xs_]
    if xs:
        lo, hi = min(xs), max(xs)
        pad = max(0.02 * (hi - lo), 0.5)
        next(iter(axes.values())).set_xlim(lo - pad, hi + pad)  # shared by every panel
    colors = task_colors(tasks_in(df.columns))
    top = set(list(axes)[:grid(len(panels))[1]])
    for panel, ax in axes.items():
        _plot_panel(panel, df, ax, validation if panel == "loss" else None, max_points, scale, smoothing,
                    ghost=ghost, colors=colors, labels=panel in top)
    return fig


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


def save_plots(history: Any, directory: str | Path, validation: Any = None, dpi: float = DPI) -> list[Path]:
    """Write ``losses.png``, ``grad_norms.png``, ``clip_fraction.png`` and ``history.png`` into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    figures = {"losses": plot_losses(history, validation=validation), "grad_norms": plot_grad_norms(history),
               "clip_fraction": plot_clip_fraction(history), "history": plot_history(history, validation)}
    paths = []
    for name, fig in figures.items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    return paths
