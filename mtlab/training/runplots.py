"""Several runs side by side (``plot_runs``): one panel with a colour per run and a dash per task, a fork's
shared past drawn once, and under the axes what sets each run apart, in words read from the runs' journals
(``run_differences``, ``change_in_words``: ``lr 1e-3 from step 31``). Runs are trainers, experiment folders or
history DataFrames.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..core.columns import parse_column
from ..core.journal import Journal
from ..core.knobs import change_words, fmt
from .plotparts import LEGEND_CELL, WIDTH_PX, legend_lines, log_axis, new_figure
from .plotseries import HistoryLike, as_frame, series_from_frame, steps_of, tasks_in, thin
from .plotstyle import (
    DPI,
    INK,
    PALETTE,
    PANEL_SPECS,
    ROW_PX,
    legend_columns,
    text_pt,
)

# ---------------------------------------------------------------------------------- runs side by side, noise scale
TASK_DASHES = ("-", "--", ":", "-.")
RunLike: TypeAlias = HistoryLike | str | Path  # a run of plot_runs: a trainer, a history, an experiment folder


def _journal(run: RunLike) -> Journal | None:
    if isinstance(run, (str, Path)):
        return Journal.read_file(run) if (Path(run) / "journal.jsonl").is_file() else None
    journal = getattr(run, "journal", None)
    return journal if isinstance(journal, Journal) else None


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
    """A knob's value as a person writes it: ``1e-3``, ``2.5e-4``, ``0.5``, ``16`` (``mtlab.core.knobs.fmt``)."""
    return fmt(v)


def change_in_words(entry: Mapping[str, Any]) -> str | None:
    """A journal's knob change in words, with the step from which it acts (``lr -> 1e-3 from step 31``); None for
    entries that set nothing a reader compares (a data position, a fork)."""
    words = change_words(entry)
    if words is None:
        return None
    kind = entry.get("kind")
    if kind in ("reinitialize", "restore", "resume"):
        return words
    return f"{words} from step {int(entry.get('step', 0)) + 1}"


def _flat(table: Any, path: str = "") -> dict[str, Any]:
    """A recipe's settings as ``{"trainer.initial_learning_rate": 0.01, ...}``."""
    if not isinstance(table, Mapping):
        return {path: table}
    out: dict[str, Any] = {}
    for key, value in table.items():
        out.update(_flat(value, f"{path}.{key}" if path else str(key)))
    return out


def recipe_differences(recipes: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Run name -> the recipe settings where it differs from the other runs (``initial_learning_rate = 0.02``):
    what sets experiment folders apart, rather than what each one's schedule did step by step."""
    kept = ("trainer", "models", "tasks")
    flat = {name: _flat({k: v for k, v in r.items() if k in kept}) for name, r in recipes.items()}
    keys = list(dict.fromkeys(k for f in flat.values() for k in f))
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat.values()}) > 1]
    return {name: [f"{k.removeprefix('trainer.')} = {fmt(f[k]) if isinstance(f.get(k), float) else f.get(k)}"
                   for k in differ if k in f] for name, f in flat.items()}


def run_differences(journals: Mapping[str, Journal], per_run: int = 4,
                    recipes: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, list[str]]:
    """Run name -> what sets it apart in words: the recipe settings where it differs from the others (experiment
    folders), then its knob changes after the past all the journals share, at most ``per_run`` (the latest) and a
    count of the rest. The schedule's own changes (the learning rate's decay at every step, a stage) are the
    recipe's doing, said by its settings, not step by step."""
    lists = [j.entries for j in journals.values()]
    shared = 0
    if lists:
        shortest = min(len(e) for e in lists)
        while shared < shortest and all(e[shared] == lists[0][shared] for e in lists[1:]):
            shared += 1
    settings = recipe_differences(recipes) if recipes and len(recipes) > 1 else {}
    out: dict[str, list[str]] = {}
    for name, j in journals.items():
        said = [w for e in j.entries[shared:] if e["type"] == "change" and e.get("source") != "schedule"
                and (w := change_in_words(e))]
        more = len(said) - per_run
        own = settings.get(name, [])
        out[name] = own + (said[-per_run:] if more <= 0 else [f"{more} earlier change(s)", *said[-per_run:]])
    return out


def _recipe(run: RunLike) -> Mapping[str, Any] | None:
    """An experiment folder's recipe (``recipe.json``), else None."""
    import json

    if isinstance(run, (str, Path)) and (Path(run) / "recipe.json").is_file():
        recipe = json.loads((Path(run) / "recipe.json").read_text())
        return recipe if isinstance(recipe, Mapping) else None
    return None


def parting_step(base: pd.DataFrame, other: pd.DataFrame, columns: Sequence[str]) -> float | None:
    """The last step ``other`` shares with ``base`` (same values of ``columns`` at every step up to it): a fork's
    shared past, drawn once; None when they share no step."""
    a = base.set_index(steps_of(base))[list(c for c in columns if c in base.columns)]
    b = other.set_index(steps_of(other))[list(c for c in columns if c in other.columns)]
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
    recipes = {name: r for name, run in runs.items() if (r := _recipe(run)) is not None} if differences else {}
    said = (run_differences(journals, recipes=recipes) if len(journals) > 1 or (journals and len(runs) == 1)
            else {})
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


__all__: Sequence[str] = ["change_in_words", "plot_runs", "run_differences", "short_number"]
