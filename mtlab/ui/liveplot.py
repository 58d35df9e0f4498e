"""The dashboard's live figure: ``LivePlot`` draws the panels of ``mtlab.plots`` (one per quantity,
shared step axis, a grid chosen from the width, one shared legend under the panels, event numbers that
never overprint) and updates its lines in place, blitting over a cached background, into PNG bytes of
exactly the width the dashboard shows. ``font_scale`` (or ``presentation=True``) enlarges every text
for a projector; the panels and the figure's height follow."""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from ..training.plotparts import (
    MAX_EVENT_MARKS,
    constrained_layout,
    figure_svg,
    layout_height,
    log_axis,
    mark_events,
    new_figure,
    panel_axes,
    shared_legend,
)
from ..training.plotseries import Series, panel_of, panels_for, positive, smooth, thin
from ..training.plotstyle import DPI, GHOST, PANEL_SPECS, Styles, grid

LIVE_POINTS = 400  # per line in the live plot: a blitted redraw stays ~40 ms
PRESENTATION_SCALE = 1.35  # font scale of presentation mode (a projector, 150 % zoom)
EVENTS_LABEL = "n: event n of the log"
BRANCH_STYLE: dict[str, Any] = {"lw": 1.1, "marker": "x", "ms": 4.5, "mew": 1.2, "zorder": 2.5}  # a fork's lines
RELAYOUT_S = 20.0  # s: the layout is redone at least this often (tick labels change width as limits move)


def _padded(lo: float, hi: float, log: bool, headroom: float = 0.35) -> tuple[float, float]:
    """Limits around [lo, hi] with headroom, so that most redraws keep them (and blit)."""
    if log:
        llo, lhi = math.log10(lo), math.log10(hi)
        span = max(lhi - llo, 0.2)
        return 10 ** (llo - headroom * span), 10 ** (lhi + headroom * span)
    span = hi - lo if hi > lo else max(abs(hi), 1e-3)
    return lo - headroom * span, hi + headroom * span


class LivePlot:
    """The dashboard's figure: one panel per quantity (``panels_for``) on a shared step axis, lines
    updated in place (``set_data``), rendered to PNG bytes of exactly ``width_px`` pixels.

    ``update(series, validation, ...)`` takes ``column -> (steps, values)`` (history column names) and
    validation points ``name -> (steps, losses)``; each line keeps at most ``max_points`` points.
    ``set_xrange((lo, hi))`` zooms to a step range (None: follow the run); ``set_marker(step)`` draws the
    read-out step. Cheap redraws: limits keep headroom and change only when the data leave them; while
    they hold, only the data lines are drawn over a cached background (``full_draws``, ``fast_draws``).
    """

    def __init__(self, tasks: Sequence[str], width_px: int = 720, height_px: int | None = None, dpi: int = DPI,
                 max_points: int = LIVE_POINTS, font_scale: float = 1.0, presentation: bool = False,
                 pixel_ratio: float = 1.0) -> None:
        if font_scale <= 0:
            raise ValueError(f"font_scale must be > 0 (1: the dashboard's, {PRESENTATION_SCALE}: presentation), "
                             f"got {font_scale!r}")
        self.width_px = int(width_px)
        self.fixed_height = height_px  # None: the height follows the panels and the legend
        self.max_height: int | None = None  # the most it grows to (presentation mode: a screen's share)
        if not pixel_ratio > 0:
            raise ValueError(f"pixel_ratio must be > 0 (PNG pixels per layout pixel), got {pixel_ratio!r}")
        self.layout_dpi = dpi  # the layout is in pixels at this dpi; the PNG has pixel_ratio times as many
        self.figure = new_figure(self.width_px, height_px if height_px is not None else int(width_px * 0.5), dpi)
        self.figure.set_dpi(dpi * pixel_ratio)
        self.canvas = FigureCanvasAgg(self.figure)
        self.max_points = max_points
        self.tasks = list(tasks)
        self.font_scale = PRESENTATION_SCALE if presentation and font_scale == 1.0 else float(font_scale)
        self.styles = Styles(self.tasks)
        self.colors = self.styles.colors
        self.scale = "linear"
        self.smoothing = 0.0
        self.xrange: tuple[float, float] | None = None
        self.marker: float | None = None
        self.full_draws = 0
        self.fast_draws = 0
        self.min_full_interval = 4.0  # s: limits *shrink* (zoom in on data that use little of them) at most this
        # often; they grow at once, at any redraw, whenever a drawn point falls outside them
        self.refits = 0  # how often the limits moved (each costs a full draw and a layout)
        self.panels: tuple[str, ...] = ()
        self._build(("loss", "grad_norm"))

    @property
    def presentation(self) -> bool:
        return self.font_scale > 1.0

    def set_font_scale(self, font_scale: float = 1.0) -> None:
        """Every text ``font_scale`` times the dashboard's (presentation mode: ``PRESENTATION_SCALE``);
        the panels are laid out again (fewer columns when the text needs them)."""
        if font_scale <= 0:
            raise ValueError(f"font_scale must be > 0, got {font_scale!r}")
        if float(font_scale) != self.font_scale:
            self.font_scale = float(font_scale)
            self._build(self.panels)
            self.set_marker(self.marker)

    @property
    def pixel_ratio(self) -> float:
        """PNG pixels per layout pixel: the figure is laid out at ``width_px`` and drawn this many times finer
        (sharp where the browser shows it larger than ``width_px``)."""
        return self.figure.dpi / self.layout_dpi

    def set_size(self, width_px: int, font_scale: float = 1.0, pixel_ratio: float = 1.0,
                 max_height_px: int | None = None) -> None:
        """Lay the figure out again at ``width_px`` (and at most ``max_height_px`` high: the panels share it)
        with text ``font_scale`` times the dashboard's, drawn ``pixel_ratio`` times finer (presentation mode on
        or off)."""
        if font_scale <= 0 or not pixel_ratio > 0:
            raise ValueError(f"font_scale and pixel_ratio must be > 0, got {font_scale!r}, {pixel_ratio!r}")
        self.width_px, self.font_scale, self.max_height = int(width_px), float(font_scale), max_height_px
        self.figure.set_dpi(self.layout_dpi * pixel_ratio)
        self._build(self.panels)
        self.set_marker(self.marker)

    def set_presentation(self, on: bool = True) -> None:
        """Presentation mode: larger text (``PRESENTATION_SCALE``), on or off."""
        self.set_font_scale(PRESENTATION_SCALE if on else 1.0)

    def _build(self, panels: tuple[str, ...]) -> None:
        """(Re)make the axes for ``panels`` (when a panel appears: the first clipped element, a method)."""
        self.figure.clear()
        self.panels = panels
        self.cols = grid(len(panels), self.width_px, self.font_scale)[1]
        self.axes: dict[str, Axes] = panel_axes(self.figure, panels, self.scale, self.cols, self.font_scale)
        self.lines: dict[str, Line2D] = {}
        self._event_artists: list[Any] = []
        self._events_key: tuple[tuple[float, str], ...] | None = None
        self._events: list[tuple[float, str]] = []
        self.legend_key: tuple[tuple[str, ...], tuple[str, ...], bool, bool, str | None] | None = None
        self.legend: Legend | None = None
        self._resize(layout_height(len(panels), [], self.width_px, self.font_scale))
        self._background: object | None = None  # the canvas's copy of the drawn background (for blitting)
        self._stale = True  # the background must be drawn again
        self._last_full = -1e9
        self._laid_out = False
        self._relayout, self._last_layout = True, -1e9
        self.figure.set_layout_engine(constrained_layout())
        self._markers = {p: ax.axvline(0, color="#000000", lw=0.9, ls=(0, (1, 1)), animated=True, visible=False,
                                       label="_marker") for p, ax in self.axes.items()}

    def _resize(self, height_px: int) -> None:
        """The figure's height (unless fixed): more rows of panels or of legend make it taller."""
        height_px = self.fixed_height if self.fixed_height is not None else height_px
        if self.max_height is not None:
            height_px = min(height_px, self.max_height)
        if abs(self.figure.get_figheight() * self.layout_dpi - height_px) > 0.5:
            self.figure.set_size_inches(self.width_px / self.layout_dpi, height_px / self.layout_dpi)
            self._stale = self._relayout = True
            self._background = None

    def _line(self, key: str, panel: str, style: dict[str, Any]) -> Line2D:
        line = self.lines.get(key)
        if line is None:
            line, = self.axes[panel].plot([], [], animated=True, **style)
            self.lines[key] = line
            self._stale = True
        return line

    def set_scale(self, scale: str) -> None:
        """``"linear"`` or ``"log"`` for the loss panel."""
        if scale not in ("linear", "log"):
            raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
        self.scale = scale
        if scale == "log":
            log_axis(self.axes["loss"])
        else:
            self.axes["loss"].set_yscale("linear")
            self.axes["loss"].yaxis.set_major_locator(MaxNLocator(nbins=4))
        self._stale = self._relayout = True

    def set_xrange(self, xrange: tuple[float, float] | None) -> None:
        """Show only steps ``lo..hi`` (every panel; the y limits follow what is shown); None: everything."""
        self.xrange = None if xrange is None else (float(xrange[0]), float(max(xrange[1], xrange[0] + 1)))
        self._stale = self._relayout = True

    def set_marker(self, step: float | None) -> None:
        """A dotted line at the read-out step in every panel (None: none)."""
        self.marker = step
        for line in self._markers.values():
            line.set_visible(step is not None)
            if step is not None:
                line.set_xdata([step, step])

    def update(self, series: Mapping[str, Series], validation: Mapping[str, Series] | None = None,
               step: int | None = None, events: Sequence[tuple[float, str]] = (),
               ghost: Mapping[str, Series] | None = None, branch: Mapping[str, Series] | None = None,
               branch_name: str | None = None) -> None:
        """New data for every line; ``events`` are marked; ``ghost`` lines (an abandoned branch) are drawn
        grey, under the live ones; ``branch`` lines (a fork, ``branch_name``: its own part) in the task's colour
        with x marks. ``step`` is the step the data reach (the dashboard's label says it)."""
        panels = panels_for(series, ghost)
        if panels != self.panels:
            self._build(panels)
            self.set_marker(self.marker)
        wanted: set[str] = set()
        for col, (xs, ys) in series.items():
            where = panel_of(col)
            if where is None or where[0] not in self.axes:
                continue
            panel = where[0]
            if PANEL_SPECS[panel].log or (panel == "loss" and self.scale == "log"):
                xs, ys = positive(xs, ys)
            style = self.styles.line(col) or {}
            if panel == "loss" and self.smoothing and len(ys) > 1:
                self._line(f"raw:{col}", panel, {**style, "lw": 0.8, "alpha": 0.25, "label": "_raw"}).set_data(
                    *thin(xs, ys, self.max_points))
                wanted.add(f"raw:{col}")
                ys = smooth(ys, self.smoothing)
            line = self._line(col, panel, style)
            line.set_data(*thin(xs, ys, self.max_points))
            line.set_marker("o" if len(xs) == 1 else "")  # a single row draws a point
            line.set_markersize(4)
            wanted.add(col)
        for key, (xs, ys) in (validation or {}).items():
            self._line(f"valid:{key}", "loss", self.styles.valid(key)).set_data(*thin(xs, ys, self.max_points))
            wanted.add(f"valid:{key}")
        for col, (xs, ys) in (ghost or {}).items():
            where = panel_of(col)
            if where is None or where[0] not in self.axes:
                continue
            line = self._line(f"ghost:{col}", where[0], {"color": GHOST, "lw": 1.2, "zorder": 1, "label": "_ghost"})
            line.set_data(*thin(xs, ys, self.max_points))
            line.set_marker("o" if len(xs) == 1 else "")
            wanted.add(f"ghost:{col}")
        for col, (xs, ys) in (branch or {}).items():
            where, look = panel_of(col), self.styles.line(col)
            if where is None or where[0] not in self.axes or look is None:
                continue
            if PANEL_SPECS[where[0]].log or (where[0] == "loss" and self.scale == "log"):
                xs, ys = positive(xs, ys)
            line = self._line(f"branch:{col}", where[0], {**BRANCH_STYLE, "color": look["color"], "label": "_branch"})
            shown_xs, shown_ys = thin(xs, ys, self.max_points)
            line.set_data(shown_xs, shown_ys)
            line.set_markevery(max(1, len(shown_xs) // 12))
            wanted.add(f"branch:{col}")
        for key, line in self.lines.items():
            if key not in wanted:
                line.set_data([], [])
        cols = tuple(k for k in self.lines if k in wanted and not k.startswith(("raw:", "ghost:", "valid:", "branch:")))
        shown_branch = branch_name if any(k.startswith("branch:") for k in wanted) else None
        legend_key = (cols, tuple(k[len("valid:"):] for k in self.lines if k in wanted and k.startswith("valid:")),
                      any(k.startswith("ghost:") for k in wanted), bool(events), shown_branch)
        if legend_key != self.legend_key:  # rebuilding the legend and the layout is slow: only on change
            self.legend_key = legend_key
            shown, valid_keys, ghosted, marked, forked = legend_key
            entries = self.styles.legend(shown, valid_keys, ghosted, EVENTS_LABEL if marked else None)
            if forked:
                entries.append((Line2D([], [], color="#555555", **{k: v for k, v in BRANCH_STYLE.items()
                                                                   if k != "zorder"}), f"{forked} (fork)"))
            self._resize(layout_height(len(self.panels), entries, self.width_px, self.font_scale))
            self.legend = shared_legend(self.figure, entries, self.font_scale)
            self._stale = self._relayout = True
        self._events = list(events)
        self._fit(shrink=self._stale or time.monotonic() - self._last_full >= self.min_full_interval)
        if self._stale or tuple(self._events[-MAX_EVENT_MARKS:]) != self._events_key:
            self._mark()  # animated: a new event (a knob moved) is drawn over the cached background

    def _mark(self) -> None:
        """Event marks for the current limits (labels in the top row only: they never meet a title),
        animated like the data lines (drawn over the cached background)."""
        self._events_key = tuple(self._events[-MAX_EVENT_MARKS:])
        for artist in self._event_artists:
            artist.remove()
        self._event_artists = []
        for i, ax in enumerate(self.axes.values()):
            px = ax.get_window_extent().width * 0.95 if self._laid_out else None
            self._event_artists += mark_events(ax, self._events, labels=i < self.cols, axes_px=px,
                                               font_scale=self.font_scale, animated=True)

    def _fit(self, shrink: bool = True) -> None:
        """Shared x limits (the zoom, or the data with headroom); y limits per panel from what is shown.
        Checked at every update (a few array comparisons): the limits move at once when a drawn point falls
        outside them, so no point ever runs off a panel; with ``shrink`` also when the data use less than a
        third of them. Moved limits change the tick labels' widths: the layout is done again."""
        data = {}
        for p, ax in self.axes.items():
            pts = [(np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)) for ln in ax.lines
                   if ln.get_animated() and ln.get_label() not in ("_marker", "_events") and np.size(ln.get_xdata())]
            data[p] = (np.concatenate([x for x, _ in pts]), np.concatenate([y for _, y in pts])) if pts else \
                (np.empty(0), np.empty(0))
        xs_all = np.concatenate([x for x, _ in data.values()])
        if not xs_all.size:
            return
        first = next(iter(self.axes.values()))
        x0, x1 = float(xs_all.min()), float(xs_all.max())
        if self.xrange is not None:
            lo, hi = self.xrange
            if first.get_xlim() != (lo, hi):
                first.set_xlim(lo, hi)
                self._moved()
        else:
            cx0, cx1 = first.get_xlim()
            if self._stale or x0 < cx0 or x1 > cx1 or (shrink and 0 < (x1 - x0) < (cx1 - cx0) / 3):
                span = max(x1 - x0, 1.0)
                first.set_xlim(x0 - 0.02 * span - 0.5, x1 + max(0.15 * span, 5.0))
                self._moved()
        shown = first.get_xlim()
        for panel, ax in self.axes.items():
            log = ax.get_yscale() == "log"
            xs, ys = data[panel]
            ys = ys[(xs >= shown[0]) & (xs <= shown[1]) & np.isfinite(ys) & ((ys > 0) if log else True)]
            if not ys.size or PANEL_SPECS[panel].ylim is not None:
                continue
            y0, y1 = float(ys.min()), float(ys.max())
            if PANEL_SPECS[panel].percent or panel == "combine":
                y0 = min(y0, 0.0)
            cy0, cy1 = ax.get_ylim()
            if log:
                used = (math.log10(y1) - math.log10(y0)) / max(math.log10(cy1) - math.log10(max(cy0, 1e-300)), 1e-12)
            else:
                used = (y1 - y0) / max(cy1 - cy0, 1e-300)
            if self._stale or y0 < cy0 or y1 > cy1 or (shrink and 0 < used < 1 / 3):
                lo, hi = _padded(y0, y1, log, 0.08 if self.xrange is not None else 0.3)
                if not log and y0 >= 0:
                    lo = max(lo, 0.0)  # a non-negative quantity is never padded below 0
                if PANEL_SPECS[panel].percent:
                    hi = max(hi, 1e-4)
                ax.set_ylim(lo, hi)
                self._moved()

    def _moved(self) -> None:
        """Limits moved: a full draw, and a new layout (tick labels of another width could be cut)."""
        if not self._stale:
            self.refits += 1
        self._stale = self._relayout = True

    def clear(self) -> None:
        for line in self.lines.values():
            line.set_data([], [])

    def _render(self) -> None:
        """Draw into the canvas: everything when stale (and cache the background), else blit."""
        if self._stale or self._background is None:
            relayout = self._relayout or time.monotonic() - self._last_layout > RELAYOUT_S
            if relayout:  # the layout engine costs as much as the drawing: only when the structure changed
                self.figure.set_layout_engine(constrained_layout())
            self.canvas.draw()  # animated artists (data lines, markers) are left out
            if relayout:
                self.figure.set_layout_engine("none")  # keep the positions just computed
                self._relayout, self._last_layout = False, time.monotonic()
            if not self._laid_out:  # the first layout gives the axes' real widths: place the labels again
                self._laid_out = True
                self._mark()
            self._background = self.canvas.copy_from_bbox(self.figure.bbox)
            self._stale = False
            self._last_full = time.monotonic()
            self.full_draws += 1
        else:
            self.canvas.restore_region(self._background)
            self.fast_draws += 1
        for ax in self.axes.values():
            artists = sorted((a for a in (*ax.lines, *ax.texts) if a.get_animated() and a.get_visible()),
                             key=lambda a: a.get_zorder())  # event lines and the ghost under the live lines
            for line in artists:
                ax.draw_artist(line)

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
