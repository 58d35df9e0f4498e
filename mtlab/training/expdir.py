"""The experiment folder a scheduled run writes.

========================  =============================================================
``recipe.toml``           copy of the recipe file (when the run started from a file)
``recipe.json``           the resolved recipe the checkpoints carry (with feature stats)
``stats/*.json``          feature mean/std of each linked set's training split
``best.pt``/``final.pt``  checkpoints (best validation; end of every run, also on Ctrl-C)
``history.csv``           one row per step (losses, gradient norms, lr, skipped)
``validation.csv``        one row per validation (values, action taken, tries)
``*.png``                 the dashboard's figures (``mtlab.plots``): losses.png (training and validation),
                          grad_norms.png, clip_fraction.png (only when something was clipped) and
                          history.png (every panel), all on one step range
``summary.json/.txt``     steps, stop reason, time per step, first/last losses, best validation
========================  =============================================================
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..base.report import say
from ..core.columns import task_column
from ..core.trainer import Trainer

# ``schedule`` below is a mtlab.Schedule (duck-typed here: the loop imports this module, not the reverse).
Schedule = Any


def prepare(trainer: Trainer, path: Path, recipe: Mapping[str, Any] | None = None) -> None:
    """Create ``path`` and write the recipe (copy and resolved JSON) and the feature stats."""
    if trainer.parallel.rank != 0:  # data parallel: rank 0 writes the experiment folder
        return
    path.mkdir(parents=True, exist_ok=True)
    if recipe is None:
        return
    source = Path(str(recipe.get("source", "")))
    if source.suffix == ".toml" and source.is_file() and not (path / "recipe.toml").exists():
        (path / "recipe.toml").write_text(copy_header(source) + source.read_text())
    (path / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
    stats = recipe.get("stats") or {}
    if stats:
        (path / "stats").mkdir(exist_ok=True)
        for key, value in stats.items():
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_")
            (path / "stats" / f"{name}.json").write_text(json.dumps(value, indent=1) + "\n")


COPY_MARK = "# mtlab-copy:"  # the line of an experiment's recipe.toml that says where it came from and what it held


def copy_header(source: Path) -> str:
    """The comment at the top of an experiment's ``recipe.toml``: where it came from, how to move the data, and
    (``COPY_MARK``) the folder its relative paths are read from and a hash of the text below it, by which
    ``mtlab resume``, ``evaluate`` and ``replay`` tell an edited copy."""
    import hashlib

    folder = source.resolve().parent
    digest = hashlib.sha1(source.read_text().encode()).hexdigest()
    return (f"# The recipe of this experiment, copied from {source.resolve()}. Data moved? Edit its data locations\n"
            "# here (root, feature_inputs, ivec lists, dynamic_mix noise): `mtlab resume`, `mtlab evaluate` and\n"
            "# `mtlab replay` read them, check that the data are the same, and refuse any other change.\n"
            f"# Relative paths are read from {folder}.\n"
            f"{COPY_MARK} sha1={digest} base={folder}\n")


CHECKPOINTS = ("final.pt", "latest.pt", "best.pt")  # any of them: the folder holds a run
RUN_FILES = (*CHECKPOINTS, "journal.jsonl", ".journal.jsonl.tmp", "history.csv", "validation.csv", "summary.json",
             "summary.txt", "skipped.jsonl", "recipe.json", "recipe.toml", "losses.png", "grad_norms.png",
             "clip_fraction.png", "history.png")  # what a run writes into its experiment folder


def held_run(path: str | Path) -> list[str]:
    """The checkpoints in ``path`` that make it a folder holding a run (empty: a new folder, or one whose run
    saved nothing yet). One rule for every command: ``train``, ``demo`` and ``replay --expdir`` refuse such a
    folder, ``resume`` needs one."""
    path = Path(path)
    return [name for name in CHECKPOINTS if (path / name).is_file()]


def remove_run(path: str | Path) -> None:
    """Remove the files a run wrote into ``path`` (its checkpoints, tables, journal, plots and stats)."""
    path = Path(path)
    for name in RUN_FILES:
        (path / name).unlink(missing_ok=True)
    shutil.rmtree(path / "stats", ignore_errors=True)


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def summary(trainer: Trainer, schedule: Schedule, wall_s: float, steps_run: int,
            recipe: Mapping[str, Any] | None = None, start_step: int | None = None) -> dict[str, Any]:
    """Host-side facts about the run: steps, stop reason, speed, first/last losses, best validation."""
    rows = trainer.log.rows()
    tasks = list(trainer.tasks)
    first = {t: _mean([r.get(task_column(t, "loss"), math.nan) for r in rows[:5]]) for t in tasks}
    last = {t: _mean([r.get(task_column(t, "loss"), math.nan) for r in rows[-5:]]) for t in tasks}
    recipe = recipe or {}
    return {
        "recipe": recipe.get("name", recipe.get("source")), "step": trainer.step_count,
        "num_steps": schedule.num_steps, "steps_run": steps_run, "start_step": start_step, "stop": schedule.last_stop,
        "finished": schedule.finished or trainer.step_count >= schedule.num_steps,
        "wall_s": round(wall_s, 3), "s_per_step": round(wall_s / steps_run, 4) if steps_run else None,
        "train_loss_first5": first, "train_loss_last5": last,
        "best_validation": schedule.best, "best_step": schedule.best_step, "validations": len(schedule.validation),
        "lr_scale": schedule.lr_scale, "skipped_steps": list(schedule.skipped), "device": str(trainer.device),
        "why": why_stopped(schedule, trainer.step_count),
    }


def why_stopped(schedule: Schedule, step: int) -> str:
    """Why the last run returned, in words for someone who has not read the loop."""
    stop, n = schedule.last_stop, schedule.num_steps
    best = (f"; the best validated model (step {schedule.best_step}) is in best.pt"
            if schedule.best_step is not None else "")
    if stop == "num_tries":
        return (f"early stopping: the validation loss did not improve {schedule.num_tries} times in a row "
                f"(the recipe's num_tries = {schedule.num_tries}), so training ended at step {step} of {n}; "
                f"this is expected once the model stops improving on held-out data{best}")
    if stop == "relative_improvement":
        return (f"early stopping: the validation loss improved by less than relative_improvement_threshold = "
                f"{schedule.relative_improvement_threshold} over the last validations, so training ended at "
                f"step {step} of {n}; this is expected once the model stops improving{best}")
    return {"done": f"all {n} steps of the schedule are done{best}",
            "steps": f"the --steps asked for are done (step {step} of {n}); `mtlab resume` continues",
            "interrupted": f"interrupted by {getattr(schedule, 'stop_signal', None) or 'Ctrl-C'} at step {step} of {n}; "
                           "final.pt holds that step exactly; `mtlab resume` continues",
            "stopped": f"stopped from outside the loop at step {step} of {n}",
            "error": f"an error stopped it at step {step} of {n} (shown above); final.pt holds the state"}.get(
        str(stop), str(stop))


def _text(s: dict[str, Any]) -> str:
    run, start = s["steps_run"], s.get("start_step")
    undone = start + run - s["step"] if start is not None else 0  # steps a go_back returned from
    if not run:
        this = "no step run this time"
    elif undone > 0:
        this = (f"{run} run this time, {undone} undone by going back to the best validated state, so it moved "
                f"{s['step'] - start:+d}")
    else:
        this = f"{run} run this time"
    pace = f"{s['s_per_step']} s/step" if s["s_per_step"] is not None else "no step run"
    lines = [f"recipe        {s['recipe']}",
             f"steps         {s['step']} / {s['num_steps']} ({this}; stop: {s['stop']})",
             f"time          {s['wall_s']:.1f} s ({pace}) on {s['device']}"]
    for t, v in s["train_loss_first5"].items():
        end = s["train_loss_last5"].get(t)
        fmt = (lambda x: "n/a" if x is None else f"{x:.4f}")
        lines.append(f"loss {t:<8} {fmt(v)} (first 5 steps) -> {fmt(end)} (last 5 steps)")
    if s["best_validation"] is not None:
        lines.append(f"validation    best {s['best_validation']:.4f} at step {s['best_step']} ({s['validations']} validations)")
    if s["skipped_steps"]:
        lines.append(f"skipped       {len(s['skipped_steps'])} non-finite steps: {s['skipped_steps'][:20]}")
    lines += [f"note          {note}" for note in s.get("notes", [])]
    if s.get("why"):
        lines.append(f"why stopped   {s['why']}")
    return "\n".join(lines) + "\n"


def _plot(trainer: Trainer, schedule: Schedule, path: Path) -> list[str]:
    """The history's figures (``mtlab.plots.save_plots``: the dashboard's, as PNGs), with the validations."""
    try:
        from .plots import save_plots
    except ImportError:
        return ["plots skipped: matplotlib is not installed (pip install 'mtlab[notebook]')"]
    if trainer.history.empty:
        return []
    save_plots(trainer.history, path, validation=schedule.validation, dpi=100)
    return []


def finish(trainer: Trainer, schedule: Schedule, path: Path, wall_s: float, steps_run: int,
           save: Callable[[Path], Any], recipe: Mapping[str, Any] | None = None,
           start_step: int | None = None) -> dict[str, Any]:
    """Write ``final.pt`` first with ``save`` (so it exists whatever fails later), then the tables, plots
    and summary."""
    import pandas as pd

    if trainer.parallel.rank != 0:  # data parallel: rank 0 writes the experiment folder
        return summary(trainer, schedule, wall_s, steps_run, recipe, start_step)
    path.mkdir(parents=True, exist_ok=True)
    save(path / "final.pt")
    trainer.history.to_csv(path / "history.csv", index=False)
    trainer.journal.write(path / "journal.jsonl")  # every knob change and call: `mtlab replay` reruns it
    skipped = trainer.streams.skipped()  # examples a linked set's on_bad_data = "skip" left out
    if skipped:
        (path / "skipped.jsonl").write_text("".join(json.dumps(r) + "\n" for r in skipped))
    pd.DataFrame(schedule.validation).to_csv(path / "validation.csv", index=False)
    notes = _plot(trainer, schedule, path)
    for note in notes:
        say(note)
    s = {**summary(trainer, schedule, wall_s, steps_run, recipe, start_step), "notes": notes}  # summary.txt says them too
    (path / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    (path / "summary.txt").write_text(_text(s))
    return s
