"""Continuing a schedule from the dashboard: "run N more steps" whatever the schedule's state.

The schedule's own rules go on: its lr keeps decaying at the same rate per step (the decay over the
longer stage is raised so that ``lr_at`` gives the same value at every step already planned), its
validation keeps running, and a validation stop is cleared (tries back to 0, the best kept), so that
``num_tries`` worse validations stop the continued run again. Nothing here needs code from the user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.trainer import Trainer
    from ..training.schedule import Schedule


def _grow_last_stage(schedule: Schedule, trainer: Trainer, end: int) -> str:
    """Make the last stage reach step ``end``, keeping the lr decay per step; the note, or ``""``."""
    if not schedule.last_stage or end <= schedule.stage_end:
        return ""
    old_steps, old_total = schedule.stage_steps, schedule.num_steps
    new_steps = old_steps + (end - schedule.stage_end)
    decay = schedule.learning_rate_decay ** (new_steps / old_steps)
    if decay <= 0.0:  # the per-step decay underflows over so many steps: hold the lr reached instead
        decay = 1.0
        schedule.initial_learning_rate = schedule.lr_at(trainer.step_count) / schedule.lr_scale
        schedule.stage_start = trainer.step_count
    schedule.learning_rate_decay = decay
    schedule.num_steps = old_total + (new_steps - old_steps)
    if schedule.stages:
        stage = schedule.stages[-1]
        stage["num_steps"] = new_steps
        if "learning_rate_decay" in stage:  # apply_stage() would put the old decay back
            stage["learning_rate_decay"] = decay
        if "initial_learning_rate" in stage:
            stage["initial_learning_rate"] = schedule.initial_learning_rate
    return f"schedule extended: {old_total} -> {schedule.num_steps} steps (lr decay continues)"


def schedule_over(schedule: Schedule, trainer: Trainer) -> bool:
    """The schedule has nothing left to run: validation stopped it, or its last stage is done."""
    return schedule.last_stage and (schedule.stopped is not None or trainer.step_count >= schedule.stage_end)


def continue_schedule(schedule: Schedule, trainer: Trainer, steps: int) -> str:
    """Prepare ``schedule`` for ``steps`` more steps from the trainer's step (``0``: until stopped, one
    more stage length at a time, see ``extend_before_end``). Returns what changed (``""``: nothing)."""
    notes = []
    if schedule.stopped is not None and schedule.last_stage:
        notes.append(f"validation stop ({schedule.stopped}) cleared, tries back to 0")
        schedule.stopped = None
        schedule.tries = 0
        schedule.task_tries = {k: 0 for k in schedule.task_tries}
    if steps > 0:
        note = _grow_last_stage(schedule, trainer, trainer.step_count + steps)
    elif schedule.last_stage and trainer.step_count >= schedule.stage_end:
        note = _grow_last_stage(schedule, trainer, trainer.step_count + max(schedule.stage_steps, 1))
    else:
        note = ""
    if note:
        notes.append(note)
    return "; ".join(notes)


def extend_before_end(schedule: Schedule, trainer: Trainer) -> str:
    """Called between steps of a run "until stopped": before the last planned step, make room for one
    more stage length, so that the loop does not end at the schedule's end."""
    if schedule.last_stage and schedule.stopped is None and trainer.step_count + 1 >= schedule.stage_end:
        return _grow_last_stage(schedule, trainer, trainer.step_count + max(schedule.stage_steps, 1))
    return ""


def schedule_text(schedule: Schedule | None, trainer: Trainer) -> str:
    """``schedule: step 154 of 251 · lr 1.2e-03 · stopped by validation (num_tries)`` (``""`` without one)."""
    if schedule is None:
        return ""
    text = f"schedule: step {trainer.step_count} of {schedule.num_steps} &middot; lr {trainer.lr:.3g}"
    if schedule.stages:
        text += f" &middot; stage {schedule.stage + 1}/{len(schedule.stages)}"
    if schedule.stopped is not None:
        text += f" &middot; validation stopped it ({schedule.stopped}); run continues it"
    elif trainer.step_count >= schedule.num_steps:
        text += " &middot; done; run continues it (lr decay goes on)"
    return text
