"""Several runs or branches on shared axes with their knob differences listed beside the curves, and the
gradient noise scale panel. Re-exported by ``mtlab.plots``::

    fig = plot_runs({"main": trainer, "low-lr": branch})           # loss of each run, differences listed
    fig = plot_noise_scale(trainer.history)                        # B_simple per task (and per model)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .plotstyle import PALETTE, task_colors, text_pt

# mtlab.plots re-exports this module's functions: its helpers are imported where used (no import cycle)

from ..core.journal import Journal, knob_differences

TASK_DASHES = ("-", "--", ":", "-.")


def _journal(run: Any) -> Journal | None:
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


def _history(run: Any) -> pd.DataFrame:
    """A run's history: a trainer's, a DataFrame, or an experiment folder's history.csv."""
    if isinstance(run, (str, Path)):
        path = Path(run) / "history.csv"
        if not path.is_file():
            raise ValueError(f"plot_runs(): {run} holds no history.csv; give an experiment folder, a trainer or a "
                             "history DataFrame")
        return pd.read_csv(path)
    from .plots import as_frame

    return as_frame(run)


def plot_runs(runs: Mapping[str, Any], panel: str = "loss", width_px: int = 830,
              height_px: int | None = None, differences: bool = True) -> Figure:
    """One panel (``loss``, ``grad_norm``, ... as in ``plot_history``) with every run on it: a colour per run,
    a dash per task. Runs are trainers or experiment folders (their journals give the knob differences, listed
    at the right) or history DataFrames."""
    from .plots import log_axis, new_figure, series_from_frame, tasks_in, thin

    if not runs:
        raise ValueError("plot_runs(): give at least one run, e.g. {'main': trainer, 'branch': trainer.fork('b')}")
    fig = new_figure(width_px, height_px)
    ax = fig.add_subplot()
    frames = {name: _history(run) for name, run in runs.items()}
    tasks = sorted({t for df in frames.values() for t in tasks_in(df.columns)})
    for i, (name, df) in enumerate(frames.items()):
        color = PALETTE[i % len(PALETTE)]
        for col, (xs, ys) in series_from_frame(df, panel).items():
            task = col.split("/", 1)[0]
            if col.count("/") > 1 or task not in tasks:  # per-linked-set and per-model columns: too many lines
                continue
            xs, ys = thin(xs, ys)
            ax.plot(xs, ys, color=color, ls=TASK_DASHES[tasks.index(task) % len(TASK_DASHES)], lw=1.3,
                    label=f"{name}: {task}")
    ax.set_xlabel("step", fontsize=text_pt("label"))
    ax.set_title(f"{panel} of {len(frames)} run(s)", fontsize=text_pt("title"))
    ax.tick_params(which="both", labelsize=text_pt("tick"))
    ax.grid(alpha=0.3)
    if panel == "grad_norm":
        log_axis(ax)
    _legend_right(ax)
    journals = {name: j for name, run in runs.items() if (j := _journal(run)) is not None}
    if differences and journals:
        lines = []
        for name, changes in knob_differences(journals).items():
            lines.append(f"{name}:")
            lines.extend(f"  {c}" for c in changes[-6:])
            if not changes:
                lines.append("  (no change of its own)")
        ax.text(1.01, 0.0, "\n".join(lines), transform=ax.transAxes, fontsize=text_pt("legend"), va="bottom", ha="left",
                family="monospace")
    return fig


def plot_noise_scale(history: Any, ax: Axes | None = None, models: bool = True) -> Figure:
    """``gns/<task>`` (solid) and ``gns/<task>/<model>`` (thin, dashed) over the steps, log scale: the
    batch size (in normalizer units) beyond which a bigger batch stops paying off."""
    from .plots import as_frame, log_axis, new_figure

    df = as_frame(history)
    if ax is None:
        fig = new_figure(560, 260)
        ax = fig.add_subplot()
    fig = ax.figure
    cols = [c for c in df.columns if str(c).startswith("gns/")]
    colors = task_colors(sorted({c.split("/")[1] for c in cols}))
    steps = pd.to_numeric(df["step"], errors="coerce") if "step" in df else pd.Series(range(1, len(df) + 1))
    drawn = 0
    for col in cols:
        parts = col.split("/")
        if len(parts) > 2 and not models:
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        keep = values.notna() & (values > 0)
        if not keep.any():
            continue
        ax.plot(steps[keep].tolist(), values[keep].tolist(), color=colors[parts[1]], lw=1.5 if len(parts) == 2 else 0.9,
                ls="-" if len(parts) == 2 else "--", label=parts[1] if len(parts) == 2 else f"{parts[1]}/{parts[2]}")
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
