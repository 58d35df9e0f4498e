"""The one training loop: schedule, learning-rate decay, validation with rollback, progress, Ctrl-C.

The CLI, the dashboard's background run, the separation runner and the data-parallel worker all train
through :func:`run`; it is the only place that handles Ctrl-C.

Examples:
    >>> exp = mtlab.from_recipe("recipes/demo.toml")  # doctest: +SKIP
    >>> mtlab.run(exp, steps=50, expdir="exp/demo")   # resumable at any point  # doctest: +SKIP

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
  training ends normally or on an error). A Ctrl-C while the experiment folder is written (``final.pt``, the
  tables, plots, summary) waits until it is complete.
- Listeners (``trainer.add_callback``) hear ``run_start``, ``step`` (with the history row),
  ``validation`` (with the record) and ``run_end`` (with the reason).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from collections.abc import Mapping

import torch

from ..base.errors import ConfigError, explain
from ..base.report import say
from ..base.threads import apply_threads, oversubscribed
from ..core.accumulator import Phase
from ..core.events import DataSkippedInfo, Event, Payload, RunEndInfo, RunStartInfo, StepInfo
from ..core.columns import parse_column
from ..core.trainer import KEPT, Trainer
from . import expdir as expdir_
from .checkpoint import save_checkpoint
from .schedule import Schedule
from .validation import validate_and_decide

# The signals a run stops on as on Ctrl-C: a scheduler's stop or preemption (SIGTERM), and SLURM's warning ahead
# of the time limit (``--signal=USR1@60``). The first finishes the step in flight, a second abandons it.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))


def _said(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class _Sigint:
    """First Ctrl-C (or SIGTERM, SIGUSR1): stop after the step in flight. Second: abandon that step at once
    (KeyboardInterrupt), except inside ``apply``'s parameter update, where it waits until the update is complete.
    ``signum`` is the first signal received (None: none)."""

    def __init__(self, trainer: Trainer, progress: bool) -> None:
        self.trainer = trainer
        self.progress = progress
        self.requested = False
        self.signum: int | None = None
        self.abortable = False
        self.pending = False
        self.finishing = False  # writing the experiment folder: a Ctrl-C waits until final.pt is written
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Sigint:
        if threading.current_thread() is threading.main_thread():
            # Data parallel: ranks would stop at different steps and wait for each other forever; a group's
            # workers keep the default SIGTERM (torchrun restarts them from latest.pt, checkpoint_frequency)
            signals = STOP_SIGNALS if self.trainer.parallel.world_size == 1 else (signal.SIGINT,)
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
            self.trainer.add_callback(self._after_call)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        said = _said(signum)
        if self.signum is None:
            self.signum = signum
        if self.finishing:
            self.requested = True
            say(f"{said}: writing final.pt and the experiment folder first; it stops right after", self.progress)
            return
        if self.requested and self.abortable:
            if self.trainer.atomic:
                self.pending = True  # raised by _after_call once apply() has finished
                return
            raise KeyboardInterrupt(f"mtlab: second {said}, the step in flight was abandoned")
        self.requested = True
        say(f"{said}: stopping after this step (again to abandon the step)", self.progress)

    def _after_call(self, event: Event, info: Payload) -> None:
        if self.pending and not self.trainer.atomic:
            self.pending = False
            raise KeyboardInterrupt("mtlab: second Ctrl-C, stopped after the step's update")

    def __exit__(self, *exc: Any) -> None:
        if self._previous:
            for s, previous in self._previous.items():
                signal.signal(s, previous)
            self.trainer.remove_callback(self._after_call)


LOG_PROGRESS_S = 3.0  # the bar's interval when stderr is a file or pipe: never quiet for 5 s, a line per 3 s in a log


def _guarded_step(trainer: Trainer, guard: _Sigint) -> None:
    """``trainer.step()``, or, if it raises before applying, nothing at all (accumulation, data
    positions and RNG state as before the call)."""
    before = trainer.step_count
    fresh = all(p in (Phase.EMPTY, Phase.APPLIED) for p in trainer.phase().values())  # else step() refuses as is
    streams = {key: stream.state_dict() for key, stream in trainer.streams.items()}
    rng = trainer.rng.state_dict()  # the run's own generator
    guard.abortable = True
    try:
        trainer.step()
    except BaseException as exc:
        guard.abortable = False
        if trainer.step_count == before and fresh:
            explain(exc, "mtlab.run: the refused step was rolled back: its accumulation discarded, data positions "
                         "and RNG as before it, parameters and optimizer untouched (a resume draws the same data)",
                    instead_of=KEPT)
            trainer.record_change("abandoned", error=type(exc).__name__)  # a replay skips that step as this undoes it
            trainer.reset()
            for key in list(trainer.streams):
                if key in streams:
                    trainer.streams[key].load_state_dict(streams[key])
                else:
                    del trainer.streams[key]  # first used in this step: it starts afresh next time
            trainer.rng.load_state_dict(rng)
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
    cols = {k: parse_column(k) for k in rows[-1]}
    out = {c.task: f"{rows[-1][k]:.4g}" for k, c in cols.items()
           if c.kind == "loss" and c.task and not c.linkedset and isinstance(rows[-1][k], float)}
    if trainer.device.type == "cpu":  # the thread count decides the speed on a shared CPU: show it
        out["threads"] = str(torch.get_num_threads())
    return out


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
        trainer.events.emit(Event.DATA_SKIPPED, DataSkippedInfo(step=trainer.step_count, examples=fresh))


class LogLines:
    """The progress bar's stream when stderr is a file or pipe: each refresh one whole line (tqdm rewrites one line
    with carriage returns, which a log shows as a single line holding every refresh, or as the first)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _show(bar: Any, trainer: Trainer, schedule: Schedule, values: bool = True) -> None:
    """The step and the task losses first (visible at 80 columns, where tqdm cuts the end of a long line), the
    thread count after the bar."""
    shown = _postfix(trainer) if values else {}
    threads = shown.pop("threads", None)
    losses = " ".join(f"{task}={value}" for task, value in shown.items())
    bar.set_description_str(f"train: step {trainer.step_count}/{schedule.num_steps}" + (f" {losses}" if losses else ""),
                            refresh=False)
    bar.set_postfix_str(f"threads={threads}" if threads else "", refresh=False)


def _left(trainer: Trainer, schedule: Schedule, done: int) -> int:
    """The bar's total: the steps run so far plus those the schedule still has."""
    return done + max(0, schedule.num_steps - trainer.step_count)


# The bar's format until the first validation: no time left yet, since the steps alone leave out what validation
# costs (the demo's first estimate was half the real time).
NO_ESTIMATE_YET = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}; time left: after the first validation]"


def _steps(trainer: Trainer, schedule: Schedule, steps: int | None, progress: bool, path: Path | None,
           between_steps: Callable[[], bool] | None, recipe: Mapping[str, Any] | None, follow_lr: bool,
           guard: _Sigint) -> tuple[int, str, BaseException | None]:
    """The step loop of :func:`run`: (steps run, why it ended, the error that ended it or None)."""
    from tqdm.auto import tqdm

    done, reason, error = 0, "done", None
    tty = sys.stderr.isatty()
    # The bar counts the steps this run has taken, never backwards: after a go_back its rate and time left stay
    # true (a rewound count made them 4x off), and the schedule's own position shows beside it ("step 150/375").
    # Its rate is the run's average so far (smoothing=0: every validation and go_back included, not the last few
    # steps alone); the time left shows from the first validation on, when that average includes one.
    every, local = schedule.valid_frequency, trainer.step_count - schedule.stage_start
    until = schedule.stage_end if steps is None else min(schedule.stage_end, trainer.step_count + steps)
    first_validation = bool(every) and schedule.stage_start + (local // every + 1) * every <= until
    bar = tqdm(total=_left(trainer, schedule, 0), initial=0, disable=not progress, unit="step",
               desc=f"train: step {trainer.step_count}/{schedule.num_steps}",
               dynamic_ncols=True, mininterval=0.1 if tty else LOG_PROGRESS_S, smoothing=0,
               bar_format=NO_ESTIMATE_YET if first_validation else None, file=None if tty else LogLines(sys.stderr))
    shown = 0.0
    with trainer.journal.source("schedule"):
        schedule.apply_stage(trainer)
        if schedule.stages:  # the stage's data views and batch sizes: journaled so that a replay refuses it
            trainer.record_change("stage", stage=schedule.stage)
    trainer.events.emit(Event.RUN_START, RunStartInfo(step=trainer.step_count, num_steps=schedule.num_steps))
    try:
        while True:
            over = schedule.stopped is not None or trainer.step_count >= schedule.stage_end
            if over and schedule.last_stage:  # a run without schedule ends when its steps are done
                reason = schedule.stopped or ("done" if not follow_lr or steps is None else "steps")
                break
            if steps is not None and done >= steps:
                reason = "steps"
                break
            if guard.requested or (between_steps is not None and between_steps()):
                reason = "interrupted" if guard.requested else "stopped"
                break
            if over:
                with trainer.journal.source("schedule"):
                    schedule.next_stage(trainer, progress)
                    trainer.record_change("stage", stage=schedule.stage)  # new data views: not replayable
                bar.total = _left(trainer, schedule, done)
                continue
            if (schedule.validate_at_step_0 and schedule.valid_frequency
                    and trainer.step_count == schedule.stage_start
                    and not any(r["step"] == trainer.step_count for r in schedule.validation[schedule.stage_first:])):
                validate_and_decide(trainer, schedule, path, progress, recipe)  # the untrained model
                if schedule.stopped:
                    continue
            if schedule.resume_streams is not None:  # after a go_back: continue the data, do not replay it
                with trainer.journal.source("validation"):
                    trainer.set_data_positions(schedule.resume_streams)
                schedule.resume_streams = None
            if not follow_lr:
                with trainer.journal.source("schedule"):
                    trainer.lr = schedule.lr_at(trainer.step_count)
            _guarded_step(trainer, guard)
            done += 1
            _note_bad_data(trainer, progress)
            trainer.events.emit(Event.STEP, StepInfo(step=trainer.step_count, row=trainer.log.last()))
            local = trainer.step_count - schedule.stage_start
            if schedule.valid_frequency and local % schedule.valid_frequency == 0:
                validate_and_decide(trainer, schedule, path, progress, recipe)
                _note_skipped(trainer, schedule, progress)
                bar.bar_format = None  # tqdm's own, with the time left
            now = time.monotonic()
            # reading the history is a device sync: at most once a second on a terminal; in a log, right before each
            # line the bar writes, so that every line carries the step it names
            if progress and (now - shown > 1.0 if tty else time.time() - bar.last_print_t >= bar.mininterval):
                shown = now
                _show(bar, trainer, schedule)
                _note_skipped(trainer, schedule, progress)
            bar.total = _left(trainer, schedule, done)
            bar.n = done
            bar.refresh() if tty else bar.update(0)
        if (reason == "done" and schedule.valid_frequency and not schedule.stopped
                and (not schedule.validation or schedule.validation[-1]["step"] != trainer.step_count)):
            validate_and_decide(trainer, schedule, path, progress, recipe, act=False)  # a last look, no rollback
    except KeyboardInterrupt:
        reason = "interrupted"
    except BaseException as exc:  # noqa: BLE001 (saved below, then re-raised)
        reason, error = "error", exc
    finally:
        bar.close()
    return done, reason, error


def run(target: Any, schedule: Schedule | None = None, steps: int | None = None, progress: bool = True,
        expdir: str | Path | None = None, between_steps: Callable[[], bool] | None = None,
        recipe: Mapping[str, Any] | None = None, threads: int | None = None) -> Schedule:
    """Train until ``schedule.num_steps`` (or ``steps`` more steps, validation stops it, Ctrl-C, or
    ``between_steps()`` returns True).

    ``target`` is a Trainer or an experiment (``mtlab.from_recipe``). Without a schedule, ``steps`` more
    steps run at the trainer's current learning rate. ``between_steps`` is called in the loop's thread
    before each step; it may block (pause), run queued commands, and returns True to stop. Returns the
    schedule; ``schedule.last_stop`` says why it returned. With ``expdir`` the experiment folder gets the
    recipe, feature stats, ``best.pt``, ``final.pt``, ``history.csv``, ``validation.csv``, plots and a summary.
    ``threads`` sets torch's CPU threads (default: ``MTLAB_THREADS``, else the free CPUs, unless the program set
    them itself; see ``mtlab.base.threads``); more threads than free CPUs is said before the first step.
    """
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
    apply_threads(threads)
    busy = oversubscribed() if trainer.device.type == "cpu" else None
    if busy:
        say(busy, progress)
    path = Path(expdir) if expdir is not None else None
    done, reason, error = 0, "done", None
    start, start_step = time.monotonic(), trainer.step_count
    # The handler is in place from the folder's first file to its last: a Ctrl-C while final.pt is written
    # waits until it is (the folder is always complete), one during the steps stops after the step in flight.
    with _Sigint(trainer, progress) as guard:
        if path is not None:
            guard.finishing = True
            expdir_.prepare(trainer, path, recipe)
            guard.finishing = False
            if guard.requested:
                reason = "interrupted"
        if reason != "interrupted":
            done, reason, error = _steps(trainer, schedule, steps, progress, path, between_steps, recipe,
                                         follow_lr, guard)
        guard.finishing = True
        schedule.last_stop = reason
        schedule.stop_signal = _said(guard.signum) if reason == "interrupted" and guard.signum is not None else None
        _note_skipped(trainer, schedule, progress)
        if reason == "interrupted":
            by = f" by {schedule.stop_signal}" if schedule.stop_signal else ""
            say(f"interrupted{by} at step {trainer.step_count}; the trainer is consistent and can continue", progress)
        if path is not None:
            expdir_.finish(trainer, schedule, path, wall_s=time.monotonic() - start, steps_run=done, recipe=recipe,
                           save=lambda p: save_checkpoint(trainer, schedule, p, recipe=recipe), start_step=start_step)
    trainer.events.emit(Event.RUN_END, RunEndInfo(reason=reason, step=trainer.step_count, steps_run=done))
    if error is not None:
        raise error
    return schedule
