"""Plots of a trainer's history: helpers that return a matplotlib ``Figure`` (and accept ``ax=``),
usable headless (the experiment folder's PNGs are drawn here), and the ``LivePlot`` the dashboard
redraws. Needs matplotlib (``pip install "mtlab[notebook]"``); the core never imports this module.

Owned ``Figure`` objects only (never pyplot), so nothing depends on a GUI backend::

    fig = plot_losses(trainer.history, scale="log", smoothing=0.8)
    fig.savefig("losses.png")
    save_plots(trainer.history, "runs/exp1")   # losses.png, grad_norms.png, clip_fraction.png, history.png

Every figure gives a task the same colour (``task_colors``: the tasks' order, tab10), in every
panel, live or saved; linked sets share their task's colour with their own dash pattern. Legends
sit outside the axes. Changes of a weight or of the learning rate found in the history are marked
with numbered triangles at the top of each panel (``events_from_frame`` lists them).
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

MAX_POINTS = 2000
LIVE_POINTS = 400  # per line in the live plot: a blitted redraw stays ~40 ms at 144 dpi
DPI = 144  # sharp when a browser on a high-DPI screen shows the PNG at half its pixel size
PANELS = ("loss", "grad_norm", "clip_fraction")
TITLES = {"loss": "normalized loss", "grad_norm": "gradient norm (dashed: clipped)",
          "clip_fraction": "elements clipped"}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
SET_DASHES = ((4, 2), (1, 1.5), (5, 1.5, 1, 1.5), (2, 2), (6, 1))
GHOST = "#b0b0b0"
MAX_EVENT_MARKS = 30

Series = tuple[Sequence[float], Sequence[float]]


def panel_of(column: str) -> tuple[str, str, dict[str, Any]] | None:
    """Which panel a history column goes to, its legend label and line style; None if not plotted.

    ``"a/loss"`` -> loss panel, label ``"a"``; ``"a/clean/loss"`` -> ``"a/clean"`` (thin, dashed);
    ``"a/grad_norm_clipped"`` -> gradient panel, dashed.
    """
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
        if where is not None:
            tasks.append(where[1].split(" ")[0].split("/")[0])
    return list(dict.fromkeys(tasks))


def _style(label: str, base: dict[str, Any], colors: Mapping[str, str], set_index: dict[str, int]) -> dict[str, Any]:
    """The task's colour; a linked set gets its own dash pattern (same colour as its task)."""
    task, _, rest = label.split(" ")[0].partition("/")
    style = dict(base)
    style["color"] = colors.get(task, PALETTE[len(colors) % len(PALETTE)])
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


def _axes(ax: Axes | None, figsize: tuple[float, float] = (6.2, 3.2)) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    fig = Figure(figsize=figsize, dpi=DPI)
    # Fixed margins (layout engines are slow); the right margin holds the legend.
    fig.subplots_adjust(left=0.11, right=0.72, bottom=0.15, top=0.9)
    return fig, fig.add_subplot()


def _legend(ax: Axes) -> None:
    """The legend outside the axes, to the right: it never covers a curve."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  frameon=False)


def _decorate(ax: Axes, panel: str, scale: str = "linear") -> None:
    ax.set_title(TITLES[panel], fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    ax.grid(alpha=0.3)
    if panel == "grad_norm" or (panel == "loss" and scale == "log"):
        ax.set_yscale("log")
    if panel == "clip_fraction":
        # A percentage, never "1e-5" offset labels: the axis starts at 0.
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=None))
        ax.set_ylim(bottom=0.0)


def _mark_events(ax: Axes, events: Sequence[tuple[float, str]]) -> list[Any]:
    """Numbered triangles at the top of the axes at each event's step (the last MAX_EVENT_MARKS);
    the artists added."""
    shown = list(enumerate(events, start=1))[-MAX_EVENT_MARKS:]
    if not shown:
        return []
    marks, = ax.plot([s for _, (s, _) in shown], [1.0] * len(shown), "v", ms=5, color="#444444", clip_on=False,
                     transform=ax.get_xaxis_transform(), label="_events")
    artists: list[Any] = [marks]
    for n, (s, _) in shown:
        artists.append(ax.annotate(str(n), (s, 1.0), xycoords=ax.get_xaxis_transform(), xytext=(0, 3),
                                   textcoords="offset points", ha="center", fontsize=6, color="#444444"))
    return artists


def _plot_panel(panel: str, history: Any, ax: Axes | None, validation: Any = None, max_points: int = MAX_POINTS,
                scale: str = "linear", smoothing: float = 0.0, events: bool = True,
                ghost: Mapping[str, Series] | None = None, colors: Mapping[str, str] | None = None) -> Figure:
    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
    fig, ax = _axes(ax)
    df = as_frame(history)
    series = series_from_frame(df, panel)
    colors = dict(colors) if colors is not None else task_colors(tasks_in(df.columns))
    set_index: dict[str, int] = {}
    _decorate(ax, panel, scale)
    for col, (xs, ys) in (ghost or {}).items():
        where = panel_of(col)
        if where is not None and where[0] == panel and xs:
            ax.plot(*thin(xs, ys, max_points), color=GHOST, lw=1.0, label="_ghost", marker="o" if len(xs) == 1 else "")
    for col, (xs, ys) in series.items():
        _, label, base = panel_of(col)  # type: ignore[misc]
        if panel == "grad_norm" or (panel == "loss" and scale == "log"):  # log axes: positive values only
            pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        style = _style(label, base, colors, set_index)
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
    if events:
        _mark_events(ax, events_from_frame(df))
    _legend(ax)
    return fig


def plot_losses(history: Any, ax: Axes | None = None, validation: Any = None, max_points: int = MAX_POINTS,
                scale: str = "linear", smoothing: float = 0.0, events: bool = True,
                ghost: Mapping[str, Series] | None = None) -> Figure:
    """Normalized loss per task (solid) and per linked set (dashed) by step; validation points as circles.

    ``history``: ``trainer.history`` (or the trainer); ``validation``: evaluate events or the loop's
    validation records (see ``validation_series``); ``scale``: ``"linear"`` or ``"log"``;
    ``smoothing``: EMA factor in [0, 1) (raw curve kept faint); ``ghost``: ``column -> (steps, values)``
    drawn grey (e.g. an abandoned branch).
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
                 smoothing: float = 0.0, ghost: Mapping[str, Series] | None = None) -> Figure:
    """The three panels side by side in one Figure (legends to the right of each panel)."""
    fig = Figure(figsize=(15.0, 3.4), dpi=DPI)
    fig.subplots_adjust(left=0.04, right=0.92, bottom=0.15, top=0.88, wspace=0.55)
    axes = fig.subplots(1, 3)
    plot_losses(history, axes[0], validation, max_points, scale, smoothing, ghost=ghost)
    plot_grad_norms(history, axes[1], max_points)
    plot_clip_fraction(history, axes[2], max_points)
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


def _padded(lo: float, hi: float, log: bool) -> tuple[float, float]:
    """Limits around [lo, hi] with headroom, so that most redraws keep them (and blit)."""
    if log:
        llo, lhi = math.log10(lo), math.log10(hi)
        span = max(lhi - llo, 0.2)
        return 10 ** (llo - 0.35 * span), 10 ** (lhi + 0.35 * span)
    span = hi - lo if hi > lo else max(abs(hi), 1e-3)
    return lo - 0.35 * span, hi + 0.35 * span


class LivePlot:
    """Three panels whose lines are updated in place (``set_data``), rendered to PNG bytes.

    ``update(series, validation, ...)`` takes ``column -> (steps, values)`` (history column names)
    and validation points ``name -> (steps, losses)``; each line keeps at most ``max_points``
    points. Colours come from ``task_colors(tasks)``, as in the saved figures.

    Cheap redraws: axis limits keep headroom and change only when the data leave them (or fill
    less than a third of them); while they hold, only the data lines and the "as of step" label
    are drawn over a cached background (blitting), and the PNG is encoded at low compression.
    ``full_draws`` and ``fast_draws`` count both kinds.
    """

    def __init__(self, tasks: Sequence[str], figsize: tuple[float, float] = (10.5, 2.7), dpi: int = DPI,
                 max_points: int = LIVE_POINTS) -> None:
        self.figure = Figure(figsize=figsize, dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        self.figure.subplots_adjust(left=0.045, right=0.9, bottom=0.17, top=0.84, wspace=0.62)
        axes = self.figure.subplots(1, 3)
        self.axes: dict[str, Axes] = dict(zip(PANELS, axes))
        self.lines: dict[str, Line2D] = {}
        self.max_points = max_points
        self.colors = task_colors(tasks)
        self.scale = "linear"
        self.smoothing = 0.0
        self.full_draws = 0
        self.fast_draws = 0
        self._set_index: dict[str, int] = {}
        self._event_artists: list[Any] = []
        self._events_key: Any = None
        self._legend_keys: dict[str, Any] = {}
        self._background: Any = None
        self._stale = True  # the background must be drawn again
        self._last_full = -1e9  # when it was drawn last (monotonic seconds)
        self.min_full_interval = 4.0  # limits move at most this often; in between, lines may leave the view
        for panel, ax in self.axes.items():
            _decorate(ax, panel)
        self.as_of = self.figure.text(0.995, 0.97, "", ha="right", va="top", fontsize=8, color="#333333",
                                      animated=True)

    def _line(self, key: str, panel: str, label: str, style: dict[str, Any]) -> Line2D:
        line = self.lines.get(key)
        if line is None:
            line, = self.axes[panel].plot([], [], label=label, animated=True, **style)
            self.lines[key] = line
            self._stale = True
        return line

    def set_scale(self, scale: str) -> None:
        """``"linear"`` or ``"log"`` for the loss panel."""
        if scale not in ("linear", "log"):
            raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
        self.scale = scale
        self.axes["loss"].set_yscale(scale)
        self._stale = True

    def update(self, series: Mapping[str, Series], validation: Mapping[str, Series] | None = None,
               step: int | None = None, events: Sequence[tuple[float, str]] = (),
               ghost: Mapping[str, Series] | None = None) -> None:
        """New data for every line; ``step`` sets the "as of step N" label; ``events`` are marked;
        ``ghost`` lines (an abandoned branch) are drawn grey."""
        wanted: set[str] = set()
        for col, (xs, ys) in series.items():
            where = panel_of(col)
            if where is None:
                continue
            panel, label, base = where
            if panel == "grad_norm" or (panel == "loss" and self.scale == "log"):
                pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
                xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            raw_key = f"raw:{col}"
            if panel == "loss" and self.smoothing and len(ys) > 1:
                style = _style(label, base, self.colors, self._set_index)
                self._line(raw_key, panel, "_raw", {**style, "lw": 0.8, "alpha": 0.25}).set_data(
                    *thin(xs, ys, self.max_points))
                wanted.add(raw_key)
                ys = smooth(ys, self.smoothing)
            line = self._line(col, panel, label, _style(label, base, self.colors, self._set_index))
            line.set_data(*thin(xs, ys, self.max_points))
            line.set_marker("o" if len(xs) == 1 else "")  # a single row draws a point
            line.set_markersize(4)
            wanted.add(col)
        for key, (xs, ys) in (validation or {}).items():
            color = self.colors.get(key.split("/")[0], "#000000")
            style = {"ls": "none", "marker": "o" if "/" not in key else "s", "ms": 5, "mfc": "white", "mec": color,
                     "mew": 1.4}
            self._line(f"valid:{key}", "loss", f"{key} (valid)", style).set_data(*thin(xs, ys, self.max_points))
            wanted.add(f"valid:{key}")
        for col, (xs, ys) in (ghost or {}).items():
            where = panel_of(col)
            if where is None:
                continue
            key = f"ghost:{col}"
            line = self._line(key, where[0], "_ghost", {"color": GHOST, "lw": 1.0, "zorder": 0.5})
            line.set_data(*thin(xs, ys, self.max_points))
            line.set_marker("o" if len(xs) == 1 else "")
            wanted.add(key)
        for key, line in self.lines.items():
            if key not in wanted:
                line.set_data([], [])
        events_key = tuple(events[-MAX_EVENT_MARKS:])
        if events_key != self._events_key:
            self._events_key = events_key
            for artist in self._event_artists:
                artist.remove()
            self._event_artists = []
            for ax in self.axes.values():
                self._event_artists += _mark_events(ax, events)
            self._stale = True
        refit = self._stale or time.monotonic() - self._last_full >= self.min_full_interval
        for panel, ax in self.axes.items():
            keys = tuple(k for k in self.lines if k in wanted and not k.startswith(("raw:", "ghost:"))
                         and self.lines[k].axes is ax)
            if self._legend_keys.get(panel) != keys:  # rebuilding legends is slow: only on change
                self._legend_keys[panel] = keys
                handles = [self.lines[k] for k in keys]
                if handles:
                    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left",
                              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
                self._stale = True
                refit = True
            if refit or self._stale:
                self._fit(panel, ax)
        self.as_of.set_text("" if step is None else f"as of step {step}")

    def _fit(self, panel: str, ax: Axes) -> None:
        """Move the limits only when the data leave them or use less than a third of them."""
        xs_all: list[float] = []
        ys_all: list[float] = []
        for line in ax.lines:
            if line.get_label() == "_events":
                continue
            xs_all += list(line.get_xdata())
            ys_all += list(line.get_ydata())
        if not xs_all:
            return
        log = ax.get_yscale() == "log"
        pairs = [(x, y) for x, y in zip(xs_all, ys_all) if math.isfinite(y) and (y > 0 or not log)]
        if not pairs:
            return
        x0, x1 = min(p[0] for p in pairs), max(p[0] for p in pairs)
        y0, y1 = min(p[1] for p in pairs), max(p[1] for p in pairs)
        cx0, cx1 = ax.get_xlim()
        if self._stale or x0 < cx0 or x1 > cx1 or 0 < (x1 - x0) < (cx1 - cx0) / 3:
            span = max(x1 - x0, 1.0)
            ax.set_xlim(x0 - 0.02 * span - 0.5, x1 + max(0.5 * span, 50.0))
            self._stale = True
        if panel == "clip_fraction":
            y0 = 0.0
        cy0, cy1 = ax.get_ylim()
        if log:
            used = (math.log10(y1) - math.log10(y0)) / max(math.log10(cy1) - math.log10(max(cy0, 1e-300)), 1e-12)
        else:
            used = (y1 - y0) / max(cy1 - cy0, 1e-300)
        if self._stale or y0 < cy0 or y1 > cy1 or 0 < used < 1 / 3:
            lo, hi = _padded(y0, y1, log)
            if panel == "clip_fraction":
                lo, hi = 0.0, max(hi, 1e-4)
            ax.set_ylim(lo, hi)
            self._stale = True

    def clear(self) -> None:
        for line in self.lines.values():
            line.set_data([], [])

    def _render(self) -> None:
        """Draw into the canvas: everything when stale (and cache the background), else blit."""
        if self._stale or self._background is None:
            self.canvas.draw()  # animated artists (data lines, the label) are left out
            self._background = self.canvas.copy_from_bbox(self.figure.bbox)
            self._stale = False
            self._last_full = time.monotonic()
            self.full_draws += 1
        else:
            self.canvas.restore_region(self._background)
            self.fast_draws += 1
        for ax in self.axes.values():
            for line in ax.lines:
                if line.get_animated():
                    ax.draw_artist(line)
        self.figure.draw_artist(self.as_of)

    def png(self) -> bytes:
        """The figure as PNG bytes (low compression: encoding time matters more than size here)."""
        from PIL import Image

        self._render()
        buf = io.BytesIO()
        Image.frombuffer("RGBA", self.canvas.get_width_height(), self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1) \
            .save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def svg(self) -> bytes:
        return figure_svg(self.figure)
