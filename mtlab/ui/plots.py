"""Plots of a trainer's history: helpers that return a matplotlib ``Figure`` (and accept ``ax=``),
usable headless, and the ``LivePlot`` the dashboard redraws.

Owned ``Figure`` objects only (never pyplot), so nothing depends on a GUI backend::

    fig = plot_losses(trainer.history)
    fig.savefig("losses.png")
    save_plots(trainer.history, "runs/exp1")   # losses.png, grad_norms.png, clip_fraction.png
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

MAX_POINTS = 2000
PANELS = ("loss", "grad_norm", "clip_fraction")
TITLES = {"loss": "normalized loss", "grad_norm": "gradient norm (dashed: clipped)", "clip_fraction": "fraction clipped"}

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


def thin(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``max_points`` evenly spaced points (first and last kept)."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    stride = (n - 1) / (max_points - 1)
    idx = [round(i * stride) for i in range(max_points)]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def as_frame(history: Any) -> pd.DataFrame:
    """A history DataFrame from a DataFrame, a ``Trainer`` or a ``History``."""
    if isinstance(history, pd.DataFrame):
        return history
    if hasattr(history, "history") and isinstance(history.history, pd.DataFrame):
        return history.history
    if hasattr(history, "frame"):
        return history.frame()
    raise TypeError(f"expected a history DataFrame, a Trainer or a History, got {type(history).__name__}")


def series_from_frame(df: pd.DataFrame, panel: str | None = None) -> dict[str, Series]:
    """Plotted columns of ``df`` (optionally one panel's) as ``column -> (steps, values)``, NaNs dropped."""
    out: dict[str, Series] = {}
    steps = df["step"] if "step" in df.columns else pd.Series(range(1, len(df) + 1), index=df.index)
    for col in df.columns:
        where = panel_of(str(col))
        if where is None or (panel is not None and where[0] != panel):
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        keep = values.notna()
        out[str(col)] = (steps[keep].tolist(), values[keep].tolist())
    return out


def validation_series(validation: Any) -> dict[str, Series]:
    """``"task/linkedset" -> (steps, losses)`` from evaluate events (dicts) or a DataFrame of them."""
    if validation is None:
        return {}
    records: Iterable[Mapping[str, Any]]
    records = validation.to_dict("records") if isinstance(validation, pd.DataFrame) else validation
    out: dict[str, tuple[list[float], list[float]]] = {}
    for r in records:
        xs, ys = out.setdefault(f"{r['task']}/{r['linkedset']}", ([], []))
        xs.append(r["step"])
        ys.append(r["loss"])
    return dict(out)


def _axes(ax: Axes | None, figsize: tuple[float, float] = (5.0, 3.2)) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    fig = Figure(figsize=figsize)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.15, top=0.9)  # fixed margins: layout engines are slow
    return fig, fig.add_subplot()


def _plot_panel(panel: str, history: Any, ax: Axes | None, validation: Any = None,
                max_points: int = MAX_POINTS) -> Figure:
    fig, ax = _axes(ax)
    series = series_from_frame(as_frame(history), panel)
    colors: dict[str, Any] = {}
    for col, (xs, ys) in series.items():
        _, label, style = panel_of(col)  # type: ignore[misc]
        base = label.split(" ")[0]
        line, = ax.plot(*thin(xs, ys, max_points), label=label, color=colors.get(base), **style)
        colors.setdefault(base, line.get_color())
    if panel == "loss":
        for key, (xs, ys) in validation_series(validation).items():
            ax.plot(*thin(xs, ys, max_points), "o", ms=4, label=f"{key} (valid)", color=colors.get(key))
    _decorate(ax, panel, bool(series))
    return fig


def _decorate(ax: Axes, panel: str, has_data: bool) -> None:
    ax.set_title(TITLES[panel], fontsize=10)
    ax.set_xlabel("step", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if panel == "grad_norm" and has_data:
        ax.set_yscale("log")
    if has_data:
        ax.legend(fontsize=7, loc="best")


def plot_losses(history: Any, ax: Axes | None = None, validation: Any = None, max_points: int = MAX_POINTS) -> Figure:
    """Normalized loss per task (solid) and per linked set (dashed) by step; validation points as dots.

    ``history``: ``trainer.history`` (or the trainer); ``validation``: dicts with step, task,
    linkedset and loss (e.g. collected from "evaluate" events) or a DataFrame of them.
    """
    return _plot_panel("loss", history, ax, validation, max_points)


def plot_grad_norms(history: Any, ax: Axes | None = None, max_points: int = MAX_POINTS) -> Figure:
    """Gradient norm per task before (solid) and after clipping (dashed), log scale."""
    return _plot_panel("grad_norm", history, ax, None, max_points)


def plot_clip_fraction(history: Any, ax: Axes | None = None, max_points: int = MAX_POINTS) -> Figure:
    """Fraction of gradient elements clipped, per task."""
    return _plot_panel("clip_fraction", history, ax, None, max_points)


def plot_history(history: Any, validation: Any = None, max_points: int = MAX_POINTS) -> Figure:
    """The three panels side by side in one Figure."""
    fig = Figure(figsize=(13.0, 3.4))
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.9, wspace=0.22)
    axes = fig.subplots(1, 3)
    plot_losses(history, axes[0], validation, max_points)
    plot_grad_norms(history, axes[1], max_points)
    plot_clip_fraction(history, axes[2], max_points)
    return fig


def figure_png(fig: Figure, dpi: float | None = None) -> bytes:
    """PNG bytes of an owned Figure (no pyplot, no GUI)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi="figure" if dpi is None else dpi)
    return buf.getvalue()


def save_plots(history: Any, directory: str | Path, validation: Any = None, dpi: float = 100) -> list[Path]:
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


class LivePlot:
    """Three panels whose lines are updated in place (``set_data``), rendered to PNG bytes.

    ``update(series, validation)`` takes ``column -> (steps, values)`` (history column names) and
    ``"task/linkedset" -> (steps, losses)``; each line keeps at most ``max_points`` points.
    """

    def __init__(self, figsize: tuple[float, float] = (12.0, 3.0), dpi: int = 72, max_points: int = MAX_POINTS) -> None:
        self.figure = Figure(figsize=figsize, dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        self.figure.subplots_adjust(left=0.05, right=0.99, bottom=0.16, top=0.88, wspace=0.22)
        axes = self.figure.subplots(1, 3)
        self.axes: dict[str, Axes] = dict(zip(PANELS, axes))
        self.lines: dict[str, Line2D] = {}
        self.max_points = max_points
        self._colors: dict[str, Any] = {}
        for panel, ax in self.axes.items():
            _decorate(ax, panel, False)

    def _line(self, key: str, panel: str, label: str, style: dict[str, Any]) -> Line2D:
        line = self.lines.get(key)
        if line is None:
            base = label.split(" ")[0]
            line, = self.axes[panel].plot([], [], label=label, color=self._colors.get(base), **style)
            self._colors.setdefault(base, line.get_color())
            self.lines[key] = line
            if panel == "grad_norm":
                self.axes[panel].set_yscale("log")
            self.axes[panel].legend(fontsize=7, loc="upper right")
        return line

    def update(self, series: Mapping[str, Series], validation: Mapping[str, Series] | None = None) -> None:
        for col, (xs, ys) in series.items():
            where = panel_of(col)
            if where is None:
                continue
            panel, label, style = where
            if panel == "grad_norm":
                xs, ys = zip(*[(x, y) for x, y in zip(xs, ys) if y > 0]) if any(y > 0 for y in ys) else ((), ())
            self._line(col, panel, label, style).set_data(*thin(xs, ys, self.max_points))
        for key, (xs, ys) in (validation or {}).items():
            style = {"ls": "none", "marker": "o", "ms": 4}
            self._line(f"valid:{key}", "loss", f"{key} (valid)", style).set_data(*thin(xs, ys, self.max_points))
        for ax in self.axes.values():
            if ax.lines:
                ax.relim()
                ax.autoscale_view()

    def clear(self) -> None:
        for line in self.lines.values():
            line.set_data([], [])

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.canvas.print_png(buf)
        return buf.getvalue()
