"""The schedule around ``Trainer.step``: its settings (lr decay, validation, tries, stopping rules), its state
(saved in checkpoints) and the stages of a segment-length curriculum. :mod:`mtlab.training.loop` documents how
a run uses them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

from ..base.errors import ConfigError
from ..base.report import say
from ..core.trainer import Trainer
from ..tasks.sources import HeadExamples, SegmentedExamples, trainset_fraction
from ..tasks.task import check_count, check_positive

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
    stop_signal: str | None = None  # what interrupted the last run(): Ctrl-C, SIGTERM or SIGUSR1 (None: no signal)
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
        """The step at which the current stage ends."""
        return self.stage_start + self.stage_steps

    @property
    def last_stage(self) -> bool:
        """Whether the current stage is the last (or the schedule has no stages)."""
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
    def for_trainer(cls, trainer: Trainer, settings: Mapping[str, Any]) -> Schedule:
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
        validation state, from the model the trainer holds now. The original's next stage starts from the
        previous stage's saved model, which exists only after a validation stop; a stage that ran to its
        ``num_steps`` left none, so the next began from fresh weights. mtlab always carries the model over
        (README, "Differences from Nabu-MSSS")."""
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
    def from_state(cls, state: Mapping[str, Any], trainer: Trainer | None = None) -> Schedule:
        """Inverse of ``state_dict``; a checkpoint taken at the best step serves as its own best state."""
        known = set(cls.__dataclass_fields__)
        schedule = cls(**{k: v for k, v in state.items() if k in known and k != "best_state"})
        schedule.validation = [dict(r) for r in schedule.validation]
        schedule.best_state = state.get("best_state")
        if schedule.best_state is None and trainer is not None and schedule.best_step == trainer.step_count:
            schedule.best_state = trainer.state_dict()
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
    ``"full"``, else cut into segments (the same view object when it is already cut that way). A
    ``trainset_frac`` head keeps its fraction of the stage's view: the first segments, as the original's
    task trainer lists one entry per segment and keeps the head of that list."""
    if isinstance(source, HeadExamples) and source.frac is not None:
        inner = stage_view(source.source, segment_length)
        return source if inner is source.source else trainset_fraction(inner, source.frac)
    if isinstance(source, SegmentedExamples):
        if source.segment_length == segment_length:
            return source
        source = source.source
    return source if segment_length == "full" else SegmentedExamples(source, int(segment_length))
