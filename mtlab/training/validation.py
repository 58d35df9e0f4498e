"""Validation during a run and what the schedule decides from it: better (a new best state, ``best.pt``),
worse (a try; go back, halve the lr, or stop), and the original's stopping rules."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from ..base.report import say
from ..core.events import Event, ValidationInfo
from ..core.columns import set_key
from ..core.trainer import Trainer
from .checkpoint import save_checkpoint
from .schedule import Schedule

def validate(trainer: Trainer, schedule: Schedule) -> dict[str, Any] | None:
    """Evaluate every linked set with held-out data; the record (None when nothing has held-out data)."""
    record: dict[str, Any] = {"step": trainer.step_count}
    total = 0.0
    found = False
    nb = schedule.valid_batches or None
    for tname, task in trainer.tasks.items():
        pooled: list[tuple[float, float, float]] = []
        for sname, ls in task.linkedsets.items():
            if ls.valid is None:
                continue
            loss_sum, normalizer = trainer.evaluate_totals(tname, sname, num_batches=nb)
            record[set_key(tname, sname)] = loss_sum / normalizer if normalizer else float("nan")
            pooled.append((ls.weight, loss_sum, normalizer))
        if not pooled:
            continue
        found = True
        # Σ w·loss / Σ w·normalizer over the linked sets, as training weighs them (unweighted if all are 0).
        if sum(w for w, _, _ in pooled) == 0:
            pooled = [(1.0, l, n) for _, l, n in pooled]
        den = sum(w * n for w, _, n in pooled)
        task_value = sum(w * l for w, l, _ in pooled) / den if den else float("nan")
        record[tname] = task_value
        total += task.weight * task_value
    if not found:
        return None
    record.update(loss=total, lr=trainer.lr, lr_scale=schedule.lr_scale)
    return record


def _relative_stop(schedule: Schedule, key: str, value: float, local_step: int) -> bool:
    """The original's rule: after ``relative_improvement_after_step`` steps of the stage, the summed
    |(previous - current) / previous| over the last ``window`` validations of the stage is under the threshold
    (the first validation's improvement counts as 1: the original starts from a huge previous value, and a
    stage with fewer validations than the window never stops this way)."""
    if (schedule.relative_improvement_threshold <= 0 or not schedule.window
            or local_step <= schedule.relative_improvement_after_step):
        return False
    values = [r[key] for r in schedule.validation[schedule.stage_first:] if key in r] + [value]
    if len(values) < schedule.window:
        return False
    rel = [1.0] + [(p - c) / p if p != 0 else math.inf for p, c in zip(values, values[1:])]
    total = sum(abs(r) for r in rel[-schedule.window:])
    return total < schedule.relative_improvement_threshold  # NaN never stops


def _decide(trainer: Trainer, schedule: Schedule, record: dict[str, Any], expdir: Path | None,
            act: bool = True, progress: bool = False, recipe: Mapping[str, Any] | None = None) -> None:
    loss = record["loss"]
    local_step = trainer.step_count - schedule.stage_start
    stop: str | None = None
    if schedule.per_task_validation:
        # The original's per-task judgement (acc_steps): each task against its own best, with its own tries.
        worse = []
        for name in [t for t in trainer.tasks if t in record]:
            value, best = record[name], schedule.task_best.get(name)
            if math.isfinite(value) and (best is None or value < best):
                schedule.task_best[name] = value
                if schedule.reset_tries:
                    schedule.task_tries[name] = 0
                continue
            worse.append(name)
            if act:
                schedule.task_tries[name] = schedule.task_tries.get(name, 0) + 1
                if schedule.num_tries is not None and schedule.task_tries[name] >= schedule.num_tries:
                    stop = stop or "num_tries"
                if _relative_stop(schedule, name, value, local_step):
                    stop = stop or "relative_improvement"
        better = not worse
        schedule.tries = max(schedule.task_tries.values(), default=0)
        record["task_tries"] = " ".join(f"{t}={n}" for t, n in schedule.task_tries.items())
        if worse:
            record["worse_tasks"] = " ".join(worse)
    else:
        better = math.isfinite(loss) and (schedule.best is None or loss < schedule.best)
        if not better and act:
            schedule.tries += 1
            if schedule.num_tries is not None and schedule.tries >= schedule.num_tries:
                stop = "num_tries"
            elif _relative_stop(schedule, "loss", loss, local_step):
                stop = "relative_improvement"
    actions: list[str] = []
    if better:
        schedule.best, schedule.best_step = loss, trainer.step_count
        schedule.best_state = trainer.state_dict()
        if schedule.reset_tries:
            schedule.tries = 0
        actions.append("better")
    elif act:
        actions.append("worse")
        if stop is not None:
            schedule.stopped = stop
            actions.append("stop" if stop == "num_tries" else f"stop_{stop}")
        if (schedule.go_back or (stop is not None and schedule.best_model_final)) and schedule.best_state is not None:
            positions = trainer.streams.state_dict()
            trainer.load_state_dict(schedule.best_state)
            actions.append(f"go_back_to_{schedule.best_step}")
            if schedule.go_back_data == "continue" and stop is None:
                # Applied before the next step: the restored state stays exactly the best one (best.pt), and
                # training goes on with the data that follow those already drawn (no replay).
                schedule.resume_streams = positions
        if schedule.valid_adapt and not schedule.stopped:
            schedule.lr_scale *= 0.5
            actions.append("halve_lr")
    else:
        actions.append("worse")
    record.update(tries=schedule.tries, best=schedule.best, action="+".join(actions))
    if schedule.stages:
        record["segment_length"] = str(schedule.stages[schedule.stage]["segment_length"])
    schedule.validation.append(record)
    if better and expdir is not None:
        save_checkpoint(trainer, schedule, expdir / "best.pt", include_best=False, recipe=recipe)
    parts = " ".join(f"{k}={v:.4g}" for k, v in record.items() if "/" not in k and isinstance(v, float)
                     and k not in ("lr", "lr_scale", "best"))
    trainer.events.emit(Event.VALIDATION, ValidationInfo(step=record["step"], record=dict(record)))
    limit = "none" if schedule.num_tries is None else schedule.num_tries
    say(f"validation at step {record['step']}: {parts} -> {record['action']} (tries {schedule.tries}/{limit})",
        progress)


def validate_and_decide(trainer: Trainer, schedule: Schedule, path: Path | None, progress: bool,
                         recipe: Mapping[str, Any] | None, act: bool = True) -> None:
    """Validate now and, with ``act``, take the schedule's decision on the result (tries, lr halving,
    going back to the best state, stopping)."""
    record = validate(trainer, schedule)
    if record is not None:
        with trainer.journal.source("validation"):  # a go-back made by the rule is journaled as the rule's
            _decide(trainer, schedule, record, path, act=act, progress=progress, recipe=recipe)
