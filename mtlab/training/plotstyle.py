"""How mtlab's figures tell series apart and where panels and the legend go (used by ``plots`` and
the dashboard's ``LivePlot``; needs matplotlib, the core never imports it).

Series: colour = task (the tasks' order, tab10); dash pattern = linked set (by name: ``clean`` looks
the same in every task); validation points: a marker per linked set (circle: the task); the gradient norm after clipping a
wide faint band under the line; each combined direction its own dash, in black; task pairs their own
colours. One shared legend row under the panels explains each colour, dash and marker once, so no legend
ever takes room from an axes. Panels: a grid chosen from the width (columns of at least
``MIN_PANEL_PX``), rows of ``ROW_PX``; the figure grows with the rows and the legend's lines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.textpath import TextToPath

from ..core.columns import COMBINE, COSINE, DIRECTION, parse_column, set_key, split_key

DPI = 100  # figures are sized in pixels of the notebook's width at this dpi: shown 1:1, never downscaled
TEXT_PT = {"title": 8.5, "label": 8.0, "tick": 7.5, "legend": 7.5, "event": 7.5}  # 7.5 pt = 10.4 px at DPI 100
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
SET_DASHES = ((5, 2), (1.2, 1.6), (6, 1.5, 1.2, 1.5), (2.5, 1.2, 1.2, 1.2, 1.2, 1.2))  # linked set 1, 2, 3, 4
SET_MARKERS = ("s", "^", "D", "v", "P")  # validation points of linked set 1, 2, ...; "o": the task's own
DIRECTION_DASHES = (None, (4, 1.5), (1, 1.2), (4, 1.2, 1, 1.2))  # combined directions (None: solid)
GHOST = "#c4c4c4"
EVENT = "#666666"
INK = "#222222"
CLIPPED: dict[str, Any] = {"lw": 4.0, "alpha": 0.3, "solid_capstyle": "butt"}  # after clipping: a wide band under the line
MIN_PANEL_PX = 290  # a column: axes >= 200 px plus tick labels and spacing
ROW_PX = 162  # a row: axes >= 110 px plus title, tick labels and spacing (two rows and the legend fit one screen at 1280x800)


@dataclass(frozen=True)
class PanelSpec:
    """One panel: its title and how its y axis reads."""

    name: str
    title: str
    log: bool = False  # log y axis (positive values only)
    percent: bool = False  # a share in [0, 1] shown in percent, from 0
    ylim: tuple[float, float] | None = None  # fixed y limits


PANEL_SPECS: dict[str, PanelSpec] = {s.name: s for s in (
    PanelSpec("loss", "normalized loss"),
    PanelSpec("grad_norm", "gradient norm", log=True),  # the legend says what the wide band is
    PanelSpec("clip_fraction", "elements clipped", percent=True),
    PanelSpec("combine", "combine weights"),
    PanelSpec("cosine", "task cosine", ylim=(-1.05, 1.05)),
)}


def text_pt(kind: str, scale: float = 1.0) -> float:
    """Font size in points of a kind of text (``TEXT_PT``) at a font scale (presentation mode: larger)."""
    return TEXT_PT[kind] * scale


def task_colors(tasks: Iterable[str]) -> dict[str, str]:
    """One colour per task, by the tasks' order (the same order gives the same colours everywhere)."""
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(dict.fromkeys(tasks))}


def grid(n: int, width_px: int = 830, scale: float = 1.0) -> tuple[int, int]:
    """Rows and columns for ``n`` panels in ``width_px``: as many columns of ``MIN_PANEL_PX`` as fit (at
    most 3), fewer when there are fewer panels."""
    cols = max(1, min(n, 3, int(width_px // MIN_PANEL_PX)))
    return max(1, math.ceil(n / cols)), cols


def text_width_px(text: str, size_pt: float, dpi: float = DPI) -> float:
    """Width in pixels of ``text`` drawn at ``size_pt`` (matplotlib's own font metrics)."""
    w, _, _ = TextToPath().get_text_width_height_descent(text, FontProperties(size=size_pt), ismath=False)
    return w * dpi / 72


def legend_columns(labels: Sequence[str], width_px: int, size_pt: float, dpi: float = DPI) -> int:
    """The most legend columns that fit in ``width_px``: matplotlib fills columns top to bottom, each as
    wide as its widest entry (handle, padding and gap included)."""
    if not labels:
        return 1
    em = size_pt * dpi / 72
    widths = [text_width_px(s, size_pt, dpi) + em * (2.2 + 0.6) for s in labels]
    for ncols in range(len(labels), 1, -1):
        per = math.ceil(len(labels) / ncols)
        cols = [widths[i:i + per] for i in range(0, len(widths), per)]
        if len(cols) == ncols and sum(max(c) for c in cols) + em * 1.2 * (ncols - 1) + 2 * em <= width_px:
            return ncols
    return 1


def figure_height(rows: int, legend_lines: int, scale: float = 1.0) -> int:
    """Pixels for ``rows`` rows of panels and a legend of ``legend_lines`` lines under them."""
    line = text_pt("legend", scale) * DPI / 72 * 1.55
    return int(rows * (ROW_PX + 30 * (scale - 1.0)) + 34 * scale + (legend_lines * line + 8 if legend_lines else 0))


class Styles:
    """Every series' look, from history column names and validation keys (see the module docstring).

    ``line(column)``: plot keywords for a history column (``None``: not plotted); ``valid(key)``: for
    validation points (``"task"`` or ``"task/set"``); ``legend(...)``: the shared legend's handles.
    """

    def __init__(self, tasks: Iterable[str]) -> None:
        self.colors = task_colors(tasks)
        self.sets: list[str] = []  # linked set names in order of first appearance: a name has one dash everywhere
        self.directions: list[str] = []
        self.groups: list[str] = []
        self.pairs: list[str] = []

    def color(self, task: str) -> str:
        if task not in self.colors:
            self.colors[task] = PALETTE[len(self.colors) % len(PALETTE)]
        return self.colors[task]

    def set_index(self, task: str, name: str) -> int:
        """A linked set's place among the names seen (sets named alike share a dash and a marker)."""
        return self._index(self.sets, name)

    def _index(self, names: list[str], name: str) -> int:
        if name not in names:
            names.append(name)
        return names.index(name)

    def line(self, column: str) -> dict[str, Any] | None:
        """Keywords for ``Axes.plot`` (colour, width, dashes, label) of a history column."""
        c = parse_column(column)
        if c.kind == COMBINE and c.group:
            g = self._index(self.groups, c.group)
            style: dict[str, Any] = {"color": self.color(c.task), "lw": 1.6, "label": f"{c.task}, {c.group}"}
            if g:
                style["dashes"] = SET_DASHES[(g - 1) % len(SET_DASHES)]
            return style
        if c.kind == COSINE and not c.task:
            pair = f"cos {'/'.join(c.pair)}"  # the cosine of two tasks' gradients
            label = f"{pair}, {c.group}" if c.group else pair
            i = self._index(self.pairs, label)
            color = PALETTE[(len(self.colors) + i) % len(PALETTE)]
            style = {"color": color, "lw": 1.4, "label": label}
            if (len(self.colors) + i) // len(PALETTE):  # colours repeat: a dash tells them apart
                style["dashes"] = SET_DASHES[((len(self.colors) + i) // len(PALETTE) - 1) % len(SET_DASHES)]
            return style
        if c.kind == DIRECTION and not c.task:
            label = f"update, {c.group}" if c.group else "update"  # the norm of the combined update direction
            d = DIRECTION_DASHES[self._index(self.directions, label) % len(DIRECTION_DASHES)]
            return {"color": INK, "lw": 1.2, "label": label, **({"dashes": d} if d else {})}
        if not c.task:
            return None
        if c.kind == "loss":
            if not c.linkedset:
                return {"color": self.color(c.task), "lw": 1.9, "label": c.task}
            i = self.set_index(c.task, c.linkedset)
            return {"color": self.color(c.task), "lw": 1.2, "dashes": SET_DASHES[i % len(SET_DASHES)],
                    "label": set_key(c.task, c.linkedset)}
        if c.kind in ("grad_norm", "clip_fraction") and not c.linkedset:
            return {"color": self.color(c.task), "lw": 1.5, "label": c.task}
        if c.kind == "grad_norm_clipped" and not c.linkedset:
            return {"color": self.color(c.task), **CLIPPED, "label": f"{c.task} (clipped)"}
        return None

    def valid(self, key: str) -> dict[str, Any]:
        """Keywords for validation points ``key`` (``"task"``: circles; ``"task/set"``: the set's marker)."""
        task, name = split_key(key)
        marker = SET_MARKERS[self.set_index(task, name) % len(SET_MARKERS)] if name else "o"
        return {"ls": "none", "marker": marker, "ms": 5.5, "mfc": "white", "mec": self.color(task), "mew": 1.5,
                "zorder": 3, "label": f"{key} (valid)"}

    def legend(self, columns: Iterable[str], valid_keys: Iterable[str] = (), ghost: bool = False,
               events: str | None = None) -> list[tuple[Any, str]]:
        """``(handle, label)`` of the shared legend for the series drawn: each task's colour once, each
        linked set's dash and validation marker once (grey), then the lines that have a look of their own."""
        columns, valid_keys = list(columns), list(valid_keys)
        for c in columns:
            self.line(c)  # every index assigned before the legend is read
        for k in valid_keys:
            self.valid(k)
        tasks: list[str] = []
        set_idx: set[int] = set()
        own: list[tuple[Any, str]] = []
        clipped = False
        for c in columns:
            style = self.line(c)
            if style is None:
                continue
            label = style.pop("label")
            parsed = parse_column(c)
            if parsed.kind in (COSINE, DIRECTION) and not parsed.task:
                own.append((Line2D([], [], **style), label))
            elif parsed.kind == COMBINE and parsed.group:
                tasks.append(parsed.task)
                g = self.groups.index(parsed.group)
                if len(self.groups) > 1:
                    kw: dict[str, Any] = {"dashes": SET_DASHES[(g - 1) % len(SET_DASHES)]} if g else {}
                    entry = (Line2D([], [], color="#777777", lw=1.6, **kw), f"weights, {self.groups[g]}")
                    if entry[1] not in [e[1] for e in own]:
                        own.append(entry)
            else:
                tasks.append(parsed.task)
                clipped |= parsed.kind == "grad_norm_clipped"
                if parsed.linkedset:
                    set_idx.add(self.set_index(parsed.task, parsed.linkedset))
        out = [(Line2D([], [], color=self.colors[t], lw=2.2), t) for t in self.colors if t in {*tasks, *(
            split_key(k)[0] for k in valid_keys)}]
        for i in sorted(set_idx):
            out.append((Line2D([], [], color="#555555", lw=1.2, dashes=SET_DASHES[i % len(SET_DASHES)]),
                        self._set_names(i)))
        marks = sorted({self.set_index(*split_key(k)) if split_key(k)[1] else -1 for k in valid_keys})
        for i in marks:
            marker = "o" if i < 0 else SET_MARKERS[i % len(SET_MARKERS)]
            out.append((Line2D([], [], ls="none", marker=marker, ms=5.5, mfc="white", mec="#555555", mew=1.5),
                        "valid" if i < 0 else f"valid {self._set_names(i)}"))
        if clipped:
            out.append((Line2D([], [], color="#555555", **CLIPPED), "after clipping"))
        out += own
        if ghost:
            out.append((Line2D([], [], color=GHOST, lw=1.6), "earlier branch"))
        if events:
            out.append((Line2D([], [], color=EVENT, lw=1.0, ls=":"), events))
        return out

    def _set_names(self, i: int) -> str:
        """The ``i``-th linked set name (looks repeat only past ``len(SET_DASHES)`` names)."""
        return self.sets[i]
