"""The parts every mtlab figure is made of: figures sized in pixels of a notebook's width (shown 1:1, every
text at least 10 px), the grid of panels with their titles and ticks (``panel_axes``, ``decorate``; log axes that
always show two labels), the one shared legend under the panels, the dotted event marks whose numbers merge
rather than overprint (``mark_events``), flat ranges padded so that no two tick labels read the same
(``pad_flat``), and a figure as PNG or SVG bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.legend import Legend
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, PercentFormatter

from .plotstyle import (
    DPI,
    EVENT,
    PANEL_SPECS,
    ROW_PX,
    figure_height,
    grid,
    legend_columns,
    text_pt,
)

WIDTH_PX = 830  # a notebook output's width in JupyterLab and Voila at 1280 px
MAX_EVENT_MARKS = 30
LEGEND_CELL = "legend cell"  # the label of the hidden axes in a grid's empty cells that may hold the legend
EVENTS_LABEL = "n: weight/lr change n"  # the dotted event lines' legend entry in saved figures


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
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True, min_n_ticks=1))  # whole steps, even for one
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


def legend_right(ax: Axes) -> None:
    """The legend outside the axes, to the right (the constrained layout makes room)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=text_pt("legend"), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, frameon=False, handlelength=1.8)
