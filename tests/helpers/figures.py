"""What a person reads on a figure, measured from matplotlib's renderer: axes and text sizes, texts cut or over
each other, points outside their panel, raw dicts or reprs in a text (the dashboard's and ``plot_runs``' figures)."""

from __future__ import annotations

import re

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mtlab import plots

PLOT_WIDTH = 620  # mtlab.ui.controls.PLOT_WIDTH: the Image widget shows the PNG at exactly this width


MIN_AXES = (200, 110)  # px


MIN_TEXT_PX = 10.0


def readability(fig: Figure) -> list[str]:
    """What a reader could not read: axes under ``MIN_AXES``, text under ``MIN_TEXT_PX``, a text or the
    legend outside the figure, two texts over each other, a legend over an axes."""
    bad = []
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox
    panels = [ax for ax in fig.axes if ax.get_label() != plots.LEGEND_CELL]
    for ax in panels:
        box = ax.get_window_extent(renderer)
        if box.width < MIN_AXES[0] or box.height < MIN_AXES[1]:
            bad.append(f"axes {ax.get_title()!r}: {box.width:.0f}x{box.height:.0f} px")
    texts = all_texts(fig)
    for t in texts:
        px = t.get_fontsize() * fig.dpi / 72
        if px < MIN_TEXT_PX:
            bad.append(f"text {t.get_text()!r}: {px:.1f} px")
        b = t.get_window_extent(renderer)
        if b.x0 < page.x0 - 0.5 or b.y0 < page.y0 - 0.5 or b.x1 > page.x1 + 0.5 or b.y1 > page.y1 + 0.5:
            bad.append(f"text {t.get_text()!r} cut at the figure's edge: {b}")
    bad += [f"texts over each other: {a!r} / {b!r}" for a, b in overlaps(fig)]
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]:
        box = legend.get_window_extent(renderer)
        if box.x0 < page.x0 - 0.5 or box.y0 < page.y0 - 0.5 or box.x1 > page.x1 + 0.5 or box.y1 > page.y1 + 0.5:
            bad.append(f"legend cut at the figure's edge: {box}")
        for ax in panels:
            a = ax.get_window_extent(renderer)
            if min(box.x1, a.x1) - max(box.x0, a.x0) > 0.5 and min(box.y1, a.y1) - max(box.y0, a.y0) > 0.5:
                bad.append(f"legend over the axes {ax.get_title()!r}")
    return bad


def all_texts(fig: Figure) -> list:
    """Every text the renderer draws: titles, axis labels, tick labels in view, legends, annotations."""
    texts = list(fig.texts)
    for legend in fig.legends:
        texts += legend.get_texts()
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
                  ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text(), *ax.texts]
        for axis in (ax.xaxis, ax.yaxis) if ax.axison else ():  # an axes turned off draws no ticks
            for tick in axis._update_ticks():  # the ticks drawn (inside the view), not every located one
                texts += [tick.label1, tick.label2]
        legend = ax.get_legend()
        if legend is not None:
            texts += legend.get_texts()
    return [t for t in texts if t.get_visible() and t.get_text().strip() and t.figure is not None]


def drawn_texts(fig: Figure) -> list:
    """``(text, box in px)`` of every text drawn."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in all_texts(fig)]


def overlaps(fig: Figure) -> list[tuple[str, str]]:
    boxes = drawn_texts(fig)
    found = []
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            w = min(a.x1, b.x1) - max(a.x0, b.x0)
            h = min(a.y1, b.y1) - max(a.y0, b.y0)
            if w > 0.5 and h > 0.5:
                found.append((ta, tb))
    return found


RAW = re.compile(r"[{}<>]|\w+=[\[{(']|Phase\.|\bNone\b")  # a dict, a repr, an enum, a keyword dump


def outside(fig: Figure) -> list[str]:
    """Every drawn point inside an axes' x limits but outside its y limits (or x beyond a finite last step)."""
    bad = []
    for ax in fig.axes:
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        for line in ax.lines:
            if line.get_label() in ("_marker", "_events") or not line.get_visible():
                continue
            xs = np.asarray(line.get_xdata(), float)
            ys = np.asarray(line.get_ydata(), float)
            keep = (xs >= x0) & (xs <= x1) & np.isfinite(ys)
            if ax.get_yscale() == "log":
                keep &= ys > 0
            out = keep & ((ys < y0 - 1e-12 * abs(y0)) | (ys > y1 + 1e-12 * abs(y1)))
            if out.any():
                bad.append(f"{ax.get_title()!r} {line.get_label()!r}: {int(out.sum())} point(s) outside y {y0:.3g}..{y1:.3g}"
                           f", e.g. step {xs[out][0]:g} value {ys[out][0]:.3g}")
    return bad


def raw_texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in all_texts(fig) if RAW.search(t.get_text())]
