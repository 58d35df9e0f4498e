"""The one training loop: schedule, learning-rate decay, validation with rollback, progress, Ctrl-C.

The CLI, the dashboard's background run, the separation runner and the data-parallel worker all train
through :func:`run`; it is the only place that handles Ctrl-C.

>>> exp = mtlab.from_recipe("recipes/demo.toml")
>>> mtlab.run(exp, steps=50, expdir="exp/demo")   # resumable at any point

As the original multi-task trainer, but correct:

- ``num_steps = ceil(num_epochs x utterances / (batch_size x numbatches_to_aggregate))``, taking the MAX over
  every task and linked set, so each linked set is seen at least ``num_epochs`` times (the original used the
  first task's data only). A recipe's ``num_steps`` overrides it.
- Before each step ``trainer.lr = initial_learning_rate x lr_scale x learning_rate_decay^(step / num_steps)``;
  ``valid_adapt`` halves ``lr_scale``, which persists (also across ``go_back``).
- Every ``valid_frequency`` steps: ``trainer.evaluate`` on every linked set with held-out data. A task's value
  is the linked-set-weighted mean of its sets' Σloss/Σnorm (equal to the pooled Σloss/Σnorm when the sets
  have the same norm, as clean/noisy versions of one corpus do); the validation loss is Σ_t task_weight_t x
  value_t. Better: it becomes the best (in-memory snapshot, ``best.pt``), ``reset_tries`` zeroes the tries.
  Worse: ``tries`` counts up; at ``num_tries`` training stops (back at the best state with ``go_back``);
  otherwise ``go_back`` restores the best snapshot (weights, optimizer, step, data positions, RNG, history)
  and ``valid_adapt`` halves the learning rate. Because data positions go back too, ``go_back`` without
  ``valid_adapt`` repeats the same steps exactly.
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
from .trainer import Trainer

STATE_FIELDS = ("lr_scale", "tries", "best", "best_step", "validation", "skipped", "stopped", "last_stop")


@dataclass
class Schedule:
    """Settings and state of the loop around ``Trainer.step`` (all plain values; see the module doc)."""

    num_steps: int  # steps in the whole run
    initial_learning_rate: float = 1e-3  # lr at step 0
    learning_rate_decay: float = 1.0  # lr factor reached at num_steps
    valid_frequency: int = 0  # validate every this many steps (0: never)
    valid_batches: int = 0  # minibatches per validated linked set (0: all)
    valid_adapt: bool = False  # halve lr_scale after a worse validation
    go_back: bool = False  # restore the best state after a worse validation
    num_tries: int = 3  # worse validations before stopping
    reset_tries: bool = True  # a better validation zeroes tries
    lr_scale: float = 1.0
    tries: int = 0
    best: float | None = None
    best_step: int | None = None
    best_state: dict[str, Any] | None = field(default=None, repr=False)
    validation: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    stopped: str | None = None  # "num_tries" once validation has ended training
    last_stop: str | None = None  # why the last run() returned: done, num_tries, steps, interrupted, error

    def __post_init__(self) -> None:
        checks = {"num_steps": self.num_steps >= 1, "valid_frequency": self.valid_frequency >= 0,
                  "valid_batches": self.valid_batches >= 0, "num_tries": self.num_tries >= 1,
                  "initial_learning_rate": self.initial_learning_rate > 0, "learning_rate_decay": self.learning_rate_decay > 0}
        for key, ok in checks.items():
            if not ok:
                raise ConfigError(f"Schedule: {key} = {getattr(self, key)!r} is out of range; see Schedule's field comments")

    def lr_at(self, step: int) -> float:
        """``initial_learning_rate x lr_scale x learning_rate_decay^(step / num_steps)``."""
        return self.initial_learning_rate * self.lr_scale * self.learning_rate_decay ** (step / self.num_steps)

    @property
    def finished(self) -> bool:
        return self.stopped is not None

    @staticmethod
    def steps_from_epochs(trainer: Trainer, num_epochs: float) -> int:
        """``ceil(num_epochs x utterances / (batch_size x numbatches_to_aggregate))``, max over linked sets."""
        steps = 1
        for task in trainer.tasks.values():
            for ls in task.linkedsets.values():
                if ls.examples is not None:
                    per_step = task.batch_size * trainer.numbatches_to_aggregate
                    steps = max(steps, math.ceil(num_epochs * len(ls.examples) / per_step))
        return steps

    @classmethod
    def for_trainer(cls, trainer: Trainer, settings: Mapping[str, Any]) -> "Schedule":
        """The schedule of recipe ``settings`` (see ``mtlab.recipe.TRAINER_KEYS``) for ``trainer``."""
        num_steps = settings.get("num_steps") or cls.steps_from_epochs(trainer, settings.get("num_epochs", 1.0))
        keys = ("initial_learning_rate", "learning_rate_decay", "valid_frequency", "valid_batches", "valid_adapt",
                "go_back", "num_tries", "reset_tries")
        return cls(num_steps=int(num_steps), **{k: settings[k] for k in keys if k in settings})

    def state_dict(self, include_best: bool = True) -> dict[str, Any]:
        """Settings and state as plain containers (the best snapshot only with ``include_best``)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in (
            "num_steps", "initial_learning_rate", "learning_rate_decay", "valid_frequency", "valid_batches",
            "valid_adapt", "go_back", "num_tries", "reset_tries", *STATE_FIELDS)}
        out["validation"] = [dict(r) for r in self.validation]
        out["skipped"] = list(self.skipped)
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


def _decide(trainer: Trainer, schedule: Schedule, record: dict[str, Any], expdir: Path | None,
            act: bool = True, progress: bool = False, recipe: Mapping[str, Any] | None = None) -> None:
    loss = record["loss"]
    better = math.isfinite(loss) and (schedule.best is None or loss < schedule.best)
    actions: list[str] = []
    if better:
        schedule.best, schedule.best_step = loss, trainer.step_count
        schedule.best_state = trainer.snapshot()
        if schedule.reset_tries:
            schedule.tries = 0
        actions.append("better")
    elif act:
        schedule.tries += 1
        actions.append("worse")
        if schedule.tries >= schedule.num_tries:
            schedule.stopped = "num_tries"
            actions.append("stop")
        if schedule.go_back and schedule.best_state is not None:
            trainer.restore(schedule.best_state)
            actions.append(f"go_back_to_{schedule.best_step}")
        if schedule.valid_adapt and not schedule.stopped:
            schedule.lr_scale *= 0.5
            actions.append("halve_lr")
    else:
        actions.append("worse")
    record.update(tries=schedule.tries, best=schedule.best, action="+".join(actions))
    schedule.validation.append(record)
    if better and expdir is not None:
        save_checkpoint(trainer, schedule, expdir / "best.pt", include_best=False, recipe=recipe)
    parts = " ".join(f"{k}={v:.4g}" for k, v in record.items() if "/" not in k and isinstance(v, float)
                     and k not in ("lr", "lr_scale", "best"))
    trainer.events.emit("validation", {"step": record["step"], "record": dict(record)})
    say(f"validation at step {record['step']}: {parts} -> {record['action']} (tries {schedule.tries}/{schedule.num_tries})",
         progress)


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
    trainer.events.emit("run_start", {"step": trainer.step_count, "num_steps": schedule.num_steps})
    with _Sigint(trainer, progress) as guard:
        try:
            while True:
                if schedule.stopped:
                    reason = "num_tries"
                    break
                if trainer.step_count >= schedule.num_steps:
                    reason = "done"
                    break
                if steps is not None and done >= steps:
                    reason = "steps"
                    break
                if guard.requested or (between_steps is not None and between_steps()):
                    reason = "interrupted" if guard.requested else "stopped"
                    break
                if not follow_lr:
                    trainer.lr = schedule.lr_at(trainer.step_count)
                _guarded_step(trainer, guard)
                done += 1
                trainer.events.emit("step", {"step": trainer.step_count, "row": trainer.log.last()})
                if schedule.valid_frequency and trainer.step_count % schedule.valid_frequency == 0:
                    record = validate(trainer, schedule)
                    if record is not None:
                        _decide(trainer, schedule, record, path, progress=progress, recipe=recipe)
                    _note_skipped(trainer, schedule, progress)
                if progress and time.monotonic() - shown > (1.0 if tty else 30.0):
                    shown = time.monotonic()  # reading the history is a device sync: at most once a second
                    bar.set_postfix(_postfix(trainer), refresh=False)
                    _note_skipped(trainer, schedule, progress)
                bar.n = min(trainer.step_count, schedule.num_steps)
                bar.refresh() if tty else bar.update(0)
            if (reason == "done" and schedule.valid_frequency and not schedule.stopped
                    and (not schedule.validation or schedule.validation[-1]["step"] != trainer.step_count)):
                record = validate(trainer, schedule)  # a last look at the end, no rollback
                if record is not None:
                    _decide(trainer, schedule, record, path, act=False, progress=progress, recipe=recipe)
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
        extra["schedule"] = schedule.state_dict(include_best=include_best and schedule.go_back)
    return trainer.save(path, extra=extra)
