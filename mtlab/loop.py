"""The one training loop: schedule, learning-rate decay, validation with rollback, progress, Ctrl-C.

The CLI, the dashboard's background run, the separation runner and the data-parallel worker all train
through :func:`run`; it is the only place that handles Ctrl-C.

>>> exp = mtlab.from_recipe("recipes/demo.toml")
>>> mtlab.run(exp, steps=50, expdir="exp/demo")   # resumable at any point

As the original multi-task trainer, but correct:

- ``num_steps = ceil(num_epochs x utterances / (batch_size x numbatches_to_aggregate))``, taking the MAX over
  every task and linked set, so each linked set is seen at least ``num_epochs`` times (the original took the
  floor of ``int(num_epochs) x utterances / (batch_size x numbatches_to_aggregate)`` for one linked set per task,
  the last its loop reached, and the minimum over tasks). A recipe's ``num_steps`` overrides it.
- Before each step ``trainer.lr = initial_learning_rate x lr_scale x learning_rate_decay^(step / num_steps)``;
  ``valid_adapt`` halves ``lr_scale``, which persists (also across ``go_back``).
- Every ``valid_frequency`` steps: ``trainer.evaluate`` on every linked set with held-out data. A task's value
  is the linked-set-weighted mean of its sets' Σloss/Σnorm (equal to the pooled Σloss/Σnorm when the sets
  have the same norm, as clean/noisy versions of one corpus do); the validation loss is Σ_t task_weight_t x
  value_t. Better: it becomes the best (in-memory snapshot, ``best.pt``), ``reset_tries`` zeroes the tries.
  Worse: ``tries`` counts up; at ``num_tries`` training stops (back at the best state with ``go_back`` or
  ``best_model_final``; ``num_tries=None`` never stops on tries); otherwise ``go_back`` restores the best
  snapshot (weights, optimizer, step, RNG, history) and ``valid_adapt`` halves the learning rate. The data
  do not go back (``go_back_data="continue"``): the next step draws the minibatches that follow those already
  drawn, so a go_back never replays the same steps (``"rewind"`` replays them, the data positions restored too).
  Those positions wait in ``schedule.resume_streams`` (saved with it) until the next step, so right after a
  go_back the trainer holds exactly the best state, as ``best.pt`` does.
- The original's stopping rules, each a setting (imported Nabu-MSSS recipes turn them on): ``best_model_final``
  (a validation stop restores the best state: the final model is the best validated one),
  ``validate_at_step_0`` (validate the untrained model), ``relative_improvement_threshold`` (after
  ``relative_improvement_after_step`` steps, a worse validation stops training when the summed
  |relative improvement| ``(previous - current) / previous`` of the last ``relative_improvement_window``
  (default ``num_tries``) validations is under it; the original: 0.004 after step 1000) and
  ``per_task_validation`` (the original's under ``acc_steps``: a best value and a tries count per task, judged
  on each task's value; a worse task counts its tries and stops training when it runs out; the best state is
  the last one where no task was worse).
- ``stages`` (the original's ``segment_lengths`` curriculum): each stage trains on its own view of the data
  (utterances cut into ``segment_length``-frame segments, or ``"full"``) with its own settings and
  ``num_steps`` (from its own number of segments), its own lr decay, validation state and a fresh optimizer
  state, starting from the model the previous stage ended with (after a validation stop with
  ``best_model_final``, its best). Validation also reads the stage's view (segments in a segment stage).
- Ctrl-C (during any call of the step: minibatch, normalize, clip or apply) finishes the step in flight,
  then stops; a second Ctrl-C abandons the step at once, discarding its partial accumulation and data draws
  (never in the middle of ``apply``: a hard stop waits until the parameters are consistent). Either way
  the trainer is consistent and, with ``expdir``, ``final.pt`` is written (it always is, also when
  training ends normally or on an error).
- Listeners (``trainer.add_callback``) hear ``run_start``, ``step`` (with the history row),
  ``validation`` (with the record) and ``run_end`` (with the reason).
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from . import expdir as expdir_
from .errors import ConfigError
from .report import say
from .sampling import SegmentedExamples
from .task import check_count, check_positive
from .trainer import Trainer

SETTINGS = ("num_steps", "initial_learning_rate", "learning_rate_decay", "valid_frequency", "valid_batches",
            "valid_adapt", "go_back", "num_tries", "reset_tries", "best_model_final", "validate_at_step_0",
            "relative_improvement_threshold", "relative_improvement_after_step", "relative_improvement_window",
            "per_task_validation", "go_back_data")
STATE_FIELDS = ("lr_scale", "tries", "best", "best_step", "validation", "skipped", "stopped", "last_stop", "stages",
                "stage", "stage_start", "stage_first", "task_best", "task_tries", "resume_streams")
# Settings a stage may set: the schedule's own, and the trainer's (applied to the trainer and its tasks).
STAGE_SCHEDULE_KEYS = ("initial_learning_rate", "learning_rate_decay", "valid_frequency", "valid_batches",
                       "valid_adapt", "go_back", "num_tries", "reset_tries")
STAGE_TRAINER_KEYS = ("batch_size", "numbatches_to_aggregate", "numbuckets", "clip_grad_value", "normalize_gradients")
STAGE_KEYS = ("segment_length", "num_steps", "num_epochs", *STAGE_SCHEDULE_KEYS, *STAGE_TRAINER_KEYS)
GO_BACK_DATA = ("continue", "rewind")


@dataclass
class Schedule:
    """Settings and state of the loop around ``Trainer.step`` (all plain values; see the module doc)."""

    num_steps: int  # steps in the whole run (with stages: their sum, updated when a stage ends early)
    initial_learning_rate: float = 1e-3  # lr at step 0
    learning_rate_decay: float = 1.0  # lr factor reached at num_steps
    valid_frequency: int = 0  # validate every this many steps (0: never)
    valid_batches: int = 0  # minibatches per validated linked set (0: all)
    valid_adapt: bool = False  # halve lr_scale after a worse validation
    go_back: bool = False  # restore the best state after a worse validation
    num_tries: int | None = 3  # worse validations before stopping (None: never stop on tries)
    reset_tries: bool = True  # a better validation zeroes tries
    best_model_final: bool = False  # a validation stop restores the best state (the original's rule)
    validate_at_step_0: bool = False  # validate the untrained model (each stage's first step; the original's)
    relative_improvement_threshold: float = 0.0  # stop when Σ|rel. improvement| of the window is under it (0: off)
    relative_improvement_after_step: int = 1000  # ... only after this many steps of the stage
    relative_improvement_window: int = 0  # validations summed (0: num_tries, as the original)
    per_task_validation: bool = False  # best value and tries per task (the original's under acc_steps)
    go_back_data: str = "continue"  # after a go_back: "continue" the data streams, or "rewind" them too
    lr_scale: float = 1.0
    tries: int = 0
    best: float | None = None
    best_step: int | None = None
    best_state: dict[str, Any] | None = field(default=None, repr=False)
    validation: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    stopped: str | None = None  # "num_tries" or "relative_improvement" once validation has ended the stage
    last_stop: str | None = None  # why the last run() returned: done, num_tries, relative_improvement, steps, ...
    stages: list[dict[str, Any]] = field(default_factory=list)  # segment_length, num_steps and settings each
    stage: int = 0  # the stage being trained
    stage_start: int = 0  # step at which it began
    stage_first: int = 0  # index in ``validation`` of its first record
    task_best: dict[str, float] = field(default_factory=dict)  # per_task_validation: best value per task
    task_tries: dict[str, int] = field(default_factory=dict)  # per_task_validation: tries per task
    resume_streams: dict[str, Any] | None = field(default=None, repr=False)  # data positions to continue from

    def __post_init__(self) -> None:
        tries_ok = self.num_tries is None or (isinstance(self.num_tries, int) and not isinstance(self.num_tries, bool)
                                              and self.num_tries >= 1)
        checks = {"num_steps": self.num_steps >= 1, "valid_frequency": self.valid_frequency >= 0,
                  "valid_batches": self.valid_batches >= 0, "num_tries": tries_ok,
                  "initial_learning_rate": self.initial_learning_rate > 0, "learning_rate_decay": self.learning_rate_decay > 0,
                  "relative_improvement_threshold": self.relative_improvement_threshold >= 0,
                  "relative_improvement_after_step": self.relative_improvement_after_step >= 0,
                  "relative_improvement_window": self.relative_improvement_window >= 0,
                  "go_back_data": self.go_back_data in GO_BACK_DATA}
        for key, ok in checks.items():
            if not ok:
                raise ConfigError(f"Schedule: {key} = {getattr(self, key)!r} is out of range; see Schedule's field comments")
        if self.relative_improvement_threshold > 0 and not self.window:
            raise ConfigError("Schedule: the relative-improvement stop sums the last num_tries validations, but "
                              "num_tries is None; set relative_improvement_window (or num_tries)")
        for i, stage in enumerate(self.stages):
            check_stage(stage, f"Schedule: stages[{i}]")
            if not isinstance(stage.get("num_steps"), int) or stage["num_steps"] < 1:
                raise ConfigError(f"Schedule: stages[{i}] needs num_steps >= 1 (Schedule.for_trainer derives it from "
                                  "num_epochs and the stage's data)")
            if (self.relative_improvement_threshold > 0 and not self.relative_improvement_window
                    and stage.get("num_tries", self.num_tries) in (None, "none")):
                raise ConfigError(f"Schedule: stages[{i}] has num_tries none, but the relative-improvement stop sums "
                                  "the last num_tries validations; set relative_improvement_window")

    @property
    def window(self) -> int:
        """Validations whose relative improvements the relative-improvement stop sums."""
        return self.relative_improvement_window or (self.num_tries or 0)

    @property
    def stage_steps(self) -> int:
        """Steps of the current stage (``num_steps`` without stages)."""
        return int(self.stages[self.stage]["num_steps"]) if self.stages else self.num_steps

    @property
    def stage_end(self) -> int:
        return self.stage_start + self.stage_steps

    @property
    def last_stage(self) -> bool:
        return not self.stages or self.stage >= len(self.stages) - 1

    def lr_at(self, step: int) -> float:
        """``initial_learning_rate x lr_scale x learning_rate_decay^(step / num_steps)`` (step and num_steps of
        the current stage)."""
        return self.initial_learning_rate * self.lr_scale * \
            self.learning_rate_decay ** ((step - self.stage_start) / self.stage_steps)

    @property
    def finished(self) -> bool:
        """Validation has ended training (in the last stage)."""
        return self.stopped is not None and self.last_stage

    @property
    def keeps_best(self) -> bool:
        """Whether a checkpoint must carry the best state (it is restored later)."""
        return self.go_back or self.best_model_final

    @staticmethod
    def steps_from_epochs(trainer: Trainer, num_epochs: float, batch_size: int | None = None,
                          numbatches_to_aggregate: int | None = None, segment_length: int | str | None = None) -> int:
        """``ceil(num_epochs x utterances / (batch_size x numbatches_to_aggregate))``, max over linked sets
        (by default the tasks' batch sizes and the trainer's aggregation; ``segment_length`` counts segments)."""
        steps = 1
        k = numbatches_to_aggregate or trainer.numbatches_to_aggregate
        for task in trainer.tasks.values():
            for ls in task.linkedsets.values():
                if ls.examples is not None:
                    n = len(stage_view(ls.examples, segment_length)) if segment_length is not None else len(ls.examples)
                    steps = max(steps, math.ceil(num_epochs * n / ((batch_size or task.batch_size) * k)))
        return steps

    @classmethod
    def for_trainer(cls, trainer: Trainer, settings: Mapping[str, Any]) -> "Schedule":
        """The schedule of recipe ``settings`` (see ``mtlab.recipe.TRAINER_KEYS``) for ``trainer``. With
        ``stages`` each stage's ``num_steps`` is derived from its own data and settings, and the first stage's
        data view and settings are applied to the trainer."""
        keys = [k for k in SETTINGS if k != "num_steps"]
        # A setting a stage leaves out is the [trainer] one (not the previous stage's): fill every stage in.
        base: dict[str, Any] = {k: settings.get(k, cls.__dataclass_fields__[k].default) for k in STAGE_SCHEDULE_KEYS}
        base.update(numbatches_to_aggregate=settings.get("numbatches_to_aggregate", trainer.numbatches_to_aggregate),
                    clip_grad_value=settings.get("clip_grad_value", trainer.clip_grad_value),
                    normalize_gradients=settings.get("normalize_gradients", trainer.normalize_gradients))
        given_stages = [dict(s) for s in settings.get("stages") or []]
        for key in ("batch_size", "numbuckets"):
            if any(key in s for s in given_stages) and not all(key in s for s in given_stages):
                values = {getattr(t, key) for t in trainer.tasks.values()}
                if len(values) > 1:
                    raise ConfigError(f"[trainer] stages: some stages set {key} and others do not, and the tasks have "
                                      f"different ones ({sorted(values)}); give {key} in every stage")
                (value,) = values
                for s in given_stages:
                    s.setdefault(key, value)
        stages = []
        for i, given in enumerate(given_stages):
            check_stage(given, f"[trainer] stages[{i}]")
            stage = {**base, **given}
            if not stage.get("num_steps"):
                stage["num_steps"] = cls.steps_from_epochs(
                    trainer, stage.get("num_epochs", settings.get("num_epochs", 1.0)), stage.get("batch_size"),
                    stage.get("numbatches_to_aggregate"), stage["segment_length"])
            stages.append(stage)
        if stages:
            num_steps = sum(s["num_steps"] for s in stages)
        else:
            num_steps = settings.get("num_steps") or cls.steps_from_epochs(trainer, settings.get("num_epochs", 1.0))
        schedule = cls(num_steps=int(num_steps), stages=stages, **{k: settings[k] for k in keys if k in settings})
        if stages:
            schedule.apply_stage(trainer)
        return schedule

    # ------------------------------------------------------------------ stages
    def apply_stage(self, trainer: Trainer) -> None:
        """Put the current stage's settings and data views in place (idempotent; stream positions kept
        where the data and batch size stay the same)."""
        if not self.stages:
            return
        stage = self.stages[self.stage]
        for key in STAGE_SCHEDULE_KEYS:
            if key in stage:
                setattr(self, key, None if key == "num_tries" and stage[key] == "none" else stage[key])
        if "numbatches_to_aggregate" in stage:
            trainer.numbatches_to_aggregate = stage["numbatches_to_aggregate"]
        if "normalize_gradients" in stage:
            trainer.normalize_gradients = bool(stage["normalize_gradients"])
        if "clip_grad_value" in stage or "normalize_gradients" in stage:
            clip = stage.get("clip_grad_value", trainer.clip_grad_value)
            trainer.clip_grad_value = None if clip is False else clip  # rebuilds the chain (normalize too)
        for tname, task in trainer.tasks.items():
            task.batch_size = stage.get("batch_size", task.batch_size)
            task.numbuckets = stage.get("numbuckets", task.numbuckets)
            for sname, ls in task.linkedsets.items():
                if ls.examples is not None:
                    ls.examples = stage_view(ls.examples, stage["segment_length"])
                if ls.valid is not None:
                    ls.valid = stage_view(ls.valid, stage["segment_length"])
                stream = trainer.streams.get((tname, sname))
                if stream is not None and (stream.source is not ls.examples or stream.batch_size != task.batch_size
                                           or stream.numbuckets != task.numbuckets):
                    del trainer.streams[(tname, sname)]  # built for other data: the next draw starts afresh

    def next_stage(self, trainer: Trainer, progress: bool = False) -> None:
        """End the current stage and begin the next: its data and settings, a fresh optimizer state and
        validation state, from the model the trainer holds now (as the original's next stage, initialized
        with the previous stage's final model)."""
        if self.last_stage:
            raise ConfigError("next_stage(): this is the last stage")
        ended = self.stages[self.stage]["segment_length"]
        self.num_steps -= self.stage_end - trainer.step_count  # a stage stopped early leaves its steps unused
        self.stage += 1
        self.stage_start = trainer.step_count
        self.stage_first = len(self.validation)
        self.lr_scale, self.tries, self.best, self.best_step, self.best_state = 1.0, 0, None, None, None
        self.stopped, self.task_best, self.task_tries, self.resume_streams = None, {}, {}, None
        trainer.reset()
        optimizers = [trainer.optimizer] if trainer.optimizer is not None else list(trainer.task_optimizers.values())
        for opt in optimizers:
            opt.state.clear()  # the original builds a new trainer (and Adam) per stage
        trainer.streams.clear()
        self.apply_stage(trainer)
        stage = self.stages[self.stage]
        say(f"step {trainer.step_count}: segment length {ended} done; stage {self.stage + 1}/{len(self.stages)} "
            f"(segment length {stage['segment_length']}, {stage['num_steps']} steps) begins", progress)

    def state_dict(self, include_best: bool = True) -> dict[str, Any]:
        """Settings and state as plain containers (the best snapshot only with ``include_best``)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in (*SETTINGS, *STATE_FIELDS)}
        out["validation"] = [dict(r) for r in self.validation]
        out["skipped"] = list(self.skipped)
        out["stages"] = [dict(s) for s in self.stages]
        out["task_best"], out["task_tries"] = dict(self.task_best), dict(self.task_tries)
        if include_best and self.best_state is not None:
            out["best_state"] = self.best_state
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any], trainer: Trainer | None = None) -> "Schedule":
        """Inverse of ``state_dict``; a checkpoint taken at the best step serves as its own best state."""
        known = set(cls.__dataclass_fields__)
        schedule = cls(**{k: v for k, v in state.items() if k in known and k != "best_state"})
        schedule.validation = [dict(r) for r in schedule.validation]
        schedule.best_state = state.get("best_state")
        if schedule.best_state is None and trainer is not None and schedule.best_step == trainer.step_count:
            schedule.best_state = trainer.snapshot()
        return schedule


def check_stage(stage: Any, where: str) -> None:
    """A stage table: ``segment_length`` (frames, or ``"full"``) and settings from ``STAGE_KEYS``."""
    if not isinstance(stage, Mapping):
        raise ConfigError(f"{where} must be a table with segment_length and the stage's settings, got {stage!r}")
    for key in stage:
        if key not in STAGE_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; a stage sets {', '.join(STAGE_KEYS)}")
    seg = stage.get("segment_length")
    if not (seg == "full" or (isinstance(seg, int) and not isinstance(seg, bool) and seg >= 1)):
        raise ConfigError(f"{where}: segment_length = {seg!r}: give a positive number of frames or \"full\"")
    for key in ("batch_size", "numbatches_to_aggregate", "numbuckets"):
        if key in stage:
            check_count(stage[key], f"{where} {key}", "a positive integer")
    for key in ("initial_learning_rate", "learning_rate_decay"):
        if key in stage:
            check_positive(stage[key], f"{where} {key}")


def stage_view(source: Any, segment_length: int | str) -> Any:
    """``source`` (or the data a ``SegmentedExamples`` was cut from) as a stage reads it: whole for
    ``"full"``, else cut into segments (the same view object when it is already cut that way)."""
    if isinstance(source, SegmentedExamples):
        if source.segment_length == segment_length:
            return source
        source = source.source
    return source if segment_length == "full" else SegmentedExamples(source, int(segment_length))


# ---------------------------------------------------------------------------------- validation
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
            loss_sum, norm = trainer.evaluate(tname, sname, num_batches=nb, totals=True)
            record[f"{tname}/{sname}"] = loss_sum / norm if norm else float("nan")
            pooled.append((ls.weight, loss_sum, norm))
        if not pooled:
            continue
        found = True
        # Σ w·loss / Σ w·norm over the linked sets, as training weighs them (unweighted if all are 0).
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
        schedule.best_state = trainer.snapshot()
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
            trainer.restore(schedule.best_state)
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
    trainer.events.emit("validation", {"step": record["step"], "record": dict(record)})
    limit = "none" if schedule.num_tries is None else schedule.num_tries
    say(f"validation at step {record['step']}: {parts} -> {record['action']} (tries {schedule.tries}/{limit})",
        progress)


def _validate_and_decide(trainer: Trainer, schedule: Schedule, path: Path | None, progress: bool,
                         recipe: Mapping[str, Any] | None, act: bool = True) -> None:
    record = validate(trainer, schedule)
    if record is not None:
        _decide(trainer, schedule, record, path, act=act, progress=progress, recipe=recipe)


# ---------------------------------------------------------------------------------- the loop
class _Sigint:
    """First Ctrl-C: stop after the step in flight. Second: abandon that step at once (KeyboardInterrupt),
    except inside ``apply``'s parameter update, where it waits until the update is complete."""

    def __init__(self, trainer: Trainer, progress: bool) -> None:
        self.trainer = trainer
        self.progress = progress
        self.requested = False
        self.abortable = False
        self.pending = False
        self._previous: Any = None

    def __enter__(self) -> "_Sigint":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self.trainer.add_callback(self._after_call)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and self.abortable:
            if self.trainer.atomic:
                self.pending = True  # raised by _after_call once apply() has finished
                return
            raise KeyboardInterrupt("mtlab: second Ctrl-C, the step in flight was abandoned")
        self.requested = True
        say("Ctrl-C: stopping after this step (press again to abandon the step)", self.progress)

    def _after_call(self, event: str, info: dict[str, Any]) -> None:
        if self.pending and not self.trainer.atomic:
            self.pending = False
            raise KeyboardInterrupt("mtlab: second Ctrl-C, stopped after the step's update")

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self.trainer.remove_callback(self._after_call)


def _guarded_step(trainer: Trainer, guard: _Sigint) -> None:
    """``trainer.step()``, or, if it raises before applying, nothing at all (accumulation, data
    positions and RNG state as before the call)."""
    before = trainer.step_count
    streams = {key: stream.state_dict() for key, stream in trainer.streams.items()}
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(trainer.device) if trainer.device.type == "cuda" else None
    guard.abortable = True
    try:
        trainer.step()
    except BaseException:
        guard.abortable = False
        if trainer.step_count == before:
            trainer.reset()
            for key in list(trainer.streams):
                if key in streams:
                    trainer.streams[key].load_state_dict(streams[key])
                else:
                    del trainer.streams[key]  # first used in this step: it starts afresh next time
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, trainer.device)
        raise
    finally:
        guard.abortable = False


def _note_skipped(trainer: Trainer, schedule: Schedule, progress: bool = False) -> None:
    seen = set(schedule.skipped)
    for row in trainer.log.rows():
        step = int(row["step"])
        if row.get("skipped") and step not in seen:
            seen.add(step)
            schedule.skipped.append(step)
            say(f"step {step} skipped: non-finite loss or gradient (nonfinite='skip'); parameters untouched", progress)


def _postfix(trainer: Trainer) -> dict[str, str]:
    rows = trainer.log.rows()
    if not rows:
        return {}
    return {k.split("/")[0]: f"{v:.4g}" for k, v in rows[-1].items()
            if k.endswith("/loss") and k.count("/") == 1 and isinstance(v, float)}


def _target(target: Any) -> tuple[Trainer, Any, Mapping[str, Any] | None]:
    """(trainer, schedule, recipe) of a Trainer or of an experiment (anything with .trainer and .schedule)."""
    if isinstance(target, Trainer):
        return target, None, None
    trainer = getattr(target, "trainer", None)
    if not isinstance(trainer, Trainer):
        raise ConfigError(f"run(): expected a mtlab.Trainer or an experiment from mtlab.from_recipe(), "
                          f"got {type(target).__name__}")
    return trainer, getattr(target, "schedule", None), getattr(target, "recipe", None)


def _note_bad_data(trainer: Trainer, progress: bool) -> None:
    """Announce examples a linked set's ``on_bad_data = "skip"`` left out during the step (``skipped.jsonl`` in the
    experiment folder lists them all)."""
    fresh = trainer.streams.new_skipped()
    if fresh:
        for record in fresh:
            record["step"] = trainer.step_count
        say(f"step {trainer.step_count}: left out {len(fresh)} bad example(s), first {fresh[0]['reason']}", progress)
        trainer.events.emit("data_skipped", {"step": trainer.step_count, "examples": fresh})


def run(target: Any, schedule: Schedule | None = None, steps: int | None = None, progress: bool = True,
        expdir: str | Path | None = None, between_steps: Callable[[], bool] | None = None,
        recipe: Mapping[str, Any] | None = None) -> Schedule:
    """Train until ``schedule.num_steps`` (or ``steps`` more steps, validation stops it, Ctrl-C, or
    ``between_steps()`` returns True).

    ``target`` is a Trainer or an experiment (``mtlab.from_recipe``). Without a schedule, ``steps`` more
    steps run at the trainer's current learning rate. ``between_steps`` is called in the loop's thread
    before each step; it may block (pause), run queued commands, and returns True to stop. Returns the
    schedule; ``schedule.last_stop`` says why it returned. With ``expdir`` the experiment folder gets the
    recipe, feature stats, ``best.pt``, ``final.pt``, ``history.csv``, ``validation.csv``, plots and a summary.
    """
    from tqdm.auto import tqdm

    trainer, own_schedule, own_recipe = _target(target)
    schedule = schedule if schedule is not None else own_schedule
    recipe = recipe if recipe is not None else own_recipe
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 0):
        raise ConfigError(f"run(): steps must be a non-negative integer (steps to run now), got {steps!r}")
    follow_lr = schedule is None  # no schedule: the trainer's own lr, which a slider may move during the run
    if schedule is None:
        if steps is None and between_steps is None:
            raise ConfigError("run(): no schedule; pass steps=N, schedule=Schedule(num_steps=...), or an experiment "
                              "from mtlab.from_recipe()")
        # No schedule: the trainer's lr, until ``steps`` more steps or until between_steps() says stop.
        total = trainer.step_count + steps if steps is not None else 2**62
        schedule = Schedule(num_steps=max(1, total), initial_learning_rate=trainer.lr)
        if target is not trainer:
            target.schedule = schedule
    path = Path(expdir) if expdir is not None else None
    if path is not None:
        expdir_.prepare(trainer, path, recipe)
    done, reason, error = 0, "done", None
    start = time.monotonic()
    tty = sys.stderr.isatty()
    bar = tqdm(total=schedule.num_steps, initial=min(trainer.step_count, schedule.num_steps), disable=not progress,
               desc="train", unit="step", dynamic_ncols=True, mininterval=0.1 if tty else 30.0)
    shown = 0.0
    schedule.apply_stage(trainer)
    trainer.events.emit("run_start", {"step": trainer.step_count, "num_steps": schedule.num_steps})
    with _Sigint(trainer, progress) as guard:
        try:
            while True:
                over = schedule.stopped is not None or trainer.step_count >= schedule.stage_end
                if over and schedule.last_stage:
                    reason = schedule.stopped or "done"
                    break
                if steps is not None and done >= steps:
                    reason = "steps"
                    break
                if guard.requested or (between_steps is not None and between_steps()):
                    reason = "interrupted" if guard.requested else "stopped"
                    break
                if over:
                    schedule.next_stage(trainer, progress)
                    bar.total = schedule.num_steps
                    continue
                if (schedule.validate_at_step_0 and schedule.valid_frequency
                        and trainer.step_count == schedule.stage_start
                        and not any(r["step"] == trainer.step_count for r in schedule.validation[schedule.stage_first:])):
                    _validate_and_decide(trainer, schedule, path, progress, recipe)  # the untrained model
                    if schedule.stopped:
                        continue
                if schedule.resume_streams is not None:  # after a go_back: continue the data, do not replay it
                    trainer.streams.load_state_dict(schedule.resume_streams, trainer.tasks)
                    schedule.resume_streams = None
                if not follow_lr:
                    trainer.lr = schedule.lr_at(trainer.step_count)
                _guarded_step(trainer, guard)
                done += 1
                _note_bad_data(trainer, progress)
                trainer.events.emit("step", {"step": trainer.step_count, "row": trainer.log.last()})
                local = trainer.step_count - schedule.stage_start
                if schedule.valid_frequency and local % schedule.valid_frequency == 0:
                    _validate_and_decide(trainer, schedule, path, progress, recipe)
                    _note_skipped(trainer, schedule, progress)
                if progress and time.monotonic() - shown > (1.0 if tty else 30.0):
                    shown = time.monotonic()  # reading the history is a device sync: at most once a second
                    bar.set_postfix(_postfix(trainer), refresh=False)
                    _note_skipped(trainer, schedule, progress)
                bar.n = min(trainer.step_count, schedule.num_steps)
                bar.refresh() if tty else bar.update(0)
            if (reason == "done" and schedule.valid_frequency and not schedule.stopped
                    and (not schedule.validation or schedule.validation[-1]["step"] != trainer.step_count)):
                _validate_and_decide(trainer, schedule, path, progress, recipe, act=False)  # a last look, no rollback
        except KeyboardInterrupt:
            reason = "interrupted"
        except BaseException as exc:  # noqa: BLE001 (saved below, then re-raised)
            reason, error = "error", exc
        finally:
            bar.close()
    schedule.last_stop = reason
    _note_skipped(trainer, schedule, progress)
    if reason == "interrupted":
        say(f"interrupted at step {trainer.step_count}; the trainer is consistent and can continue", progress)
    if path is not None:
        expdir_.finish(trainer, schedule, path, wall_s=time.monotonic() - start, steps_run=done, recipe=recipe,
                       save=lambda p: save_checkpoint(trainer, schedule, p, recipe=recipe))
    trainer.events.emit("run_end", {"reason": reason, "step": trainer.step_count, "steps_run": done})
    if error is not None:
        raise error
    return schedule


def save_checkpoint(trainer: Trainer, schedule: Schedule | None, path: str | Path, include_best: bool = True,
                    recipe: Mapping[str, Any] | None = None) -> Path | None:
    """Atomic checkpoint of the trainer state plus its recipe and schedule (``mtlab.recipe.load`` reads it).
    Data parallel: rank 0 writes it (every rank holds the same state); other ranks return None."""
    extra: dict[str, Any] = {}
    if recipe is not None:
        extra["recipe"] = dict(recipe)
    if schedule is not None:
        extra["schedule"] = schedule.state_dict(include_best=include_best and schedule.keeps_best)
    return trainer.save(path, extra=extra)
