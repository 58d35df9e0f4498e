"""The run half of the dashboard's controller (a ``controller.Controller`` holds one): start a background
run of N more steps whatever the schedule's state, pause, resume, stop, wait, and what the run tells between
steps. Kept apart so that each half reads on its own."""

from __future__ import annotations

import traceback
from typing import Any, Protocol, TYPE_CHECKING

from .runs import Run, current_run
from .schedules import continue_schedule, extend_before_end, schedule_over
from .state import SeriesStore
from .texts import REASONS, run_refusal

if TYPE_CHECKING:
    from ..core.trainer import Trainer
    from ..training.schedule import Schedule


class RunHost(Protocol):
    """Whom a ``RunControl`` tells what the run did: the dashboard's controller (its status line and views)."""

    closed: bool

    def say(self, message: str, error: bool = False) -> None:
        """Set the status line and show it."""

    def set_status(self, message: str, error: bool = False) -> None:
        """Set the status line, shown at the next refresh."""

    def refresh(self) -> Any:
        """Rebuild the state and show it (between steps or while idle)."""

    def changed(self) -> None:
        """Show a change now, or at the end of the step in flight."""

    def refresh_due(self) -> bool:
        """Whether the views are due a refresh (a change waits, or ``refresh_s`` passed)."""


class RunControl:
    """The background run of one dashboard: its ``run``, the ``error`` that ended it (and its ``traceback``),
    and whether it goes ``until_stopped``; what happens is told to ``host``."""

    def __init__(self, trainer: Trainer, schedule: Schedule | None, data: SeriesStore, host: RunHost) -> None:
        self.trainer = trainer
        self.schedule = schedule  # the experiment's schedule (lr decay, validation), None: the trainer's lr
        self.data = data
        self.host = host
        self.run: Run | None = None
        self.error: BaseException | None = None
        self.traceback: str | None = None
        self.until_stopped = False  # started with 0 steps once the schedule had ended: extended as it goes

    @property
    def running(self) -> bool:
        """A run of this trainer is in progress and not paused."""
        run = self._current()
        return run is not None and run.alive and run.state not in ("paused", "stopping")

    @property
    def alive(self) -> bool:
        """A run of this trainer is in progress (possibly paused)."""
        run = self._current()
        return run is not None and run.alive and run.state != "stopping"

    def _current(self) -> Run | None:
        run = current_run(self.trainer)
        if run is not None and run is not self.run and not self.host.closed:
            self.attach(run)
        return run if run is not None else (self.run if self.run is not None and self.run.alive else None)

    def refusal(self) -> str | None:
        """Why a run cannot start now (None: it can; a paused run: run resumes it)."""
        run = current_run(self.trainer)
        if run is not None and run.state in ("paused", "pausing"):
            return None
        if run is not None and run.alive:
            return f"a run of this trainer is already in progress (step {self.trainer.step_count}); stop it first"
        return run_refusal(self.trainer)

    def start(self, steps: int = 0) -> bool:
        """Train in a background thread through the training loop: ``steps`` more steps (0: to the schedule's
        end, or until stopped once it has ended). A finished schedule is continued (its lr decay and validation
        go on); False when refused."""
        if self.host.closed:
            return False
        paused = current_run(self.trainer)
        if paused is not None and paused.state in ("paused", "pausing"):  # run on a paused run: it goes on
            self.attach(paused)
            left = f"{paused.steps - paused.steps_done} more step(s)" if paused.steps else "until stopped"
            other = (f"; it goes on as started ({left}), not {int(steps)} steps: stop it first for a run of "
                     "another length" if steps and (not paused.steps or paused.steps - paused.steps_done != steps)
                     else "")
            paused.resume()
            self.host.say(f"run: resumed the paused run at step {self.trainer.step_count}{other}")
            return True
        why = self.refusal()
        if why is not None:
            self.host.say(f"run refused: {why}", error=True)
            return False
        steps = int(steps)
        # 0 steps: to the schedule's end; once it has ended (or without one), until stopped.
        self.until_stopped = steps == 0 and (self.schedule is None or schedule_over(self.schedule, self.trainer))
        note = ""
        if self.schedule is not None:
            note = continue_schedule(self.schedule, self.trainer, steps)
            if note:
                self.data.event(self.trainer.step_count, note)
        run = Run(self.trainer, steps=steps, schedule=self.schedule)
        self.attach(run)
        self.error, self.traceback = None, None
        # Said before the thread starts: a short run may end (and say so) before start() returns.
        self.host.set_status(("running" + (f" {steps} more steps" if steps else " until stopped"))
                             + (f"; {note}" if note else ""))
        try:
            run.start()
        except RuntimeError as exc:
            self.host.say(f"run refused: {exc}", error=True)
            return False
        self.host.changed()
        return True

    def attach(self, run: Run) -> None:
        """Follow ``run`` (one started here, or the trainer's run already in progress)."""
        if self.run is not None and self.run is not run:
            self.run.unlisten(self._on_run)
        self.run = run
        run.listen(self._on_run)

    def pause(self) -> None:
        """Pause after the current step (stepwise buttons work while paused)."""
        run = self._current()
        if run is None:
            self.host.say("pause: no run in progress", error=True)
        else:
            run.pause()

    def resume(self) -> None:
        run = self._current()
        if run is not None:
            run.resume()

    def toggle_pause(self) -> None:
        run = self._current()
        if run is not None and run.state in ("paused", "pausing"):
            self.resume()
        else:
            self.pause()

    def stop(self, wait: bool = True, timeout: float | None = 30.0) -> bool:
        """Stop the trainer's run after the current step (whoever started it); False when none was going."""
        run = self._current()
        if run is None:
            return False
        run.stop("stop", wait=wait, timeout=timeout)
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run ends. Kernel -> Interrupt here stops the run and says so in one line."""
        run = self._current() or self.run
        if run is None:
            return
        try:
            run.wait(timeout)
        except KeyboardInterrupt:  # the run is stopping (Run.wait asked it); one line instead of a traceback
            if run.wait(30.0):
                print(f"Interrupted: the run stopped at step {self.trainer.step_count}; the trainer can continue")
            else:  # a step longer than the wait: said as it is, never a step count that is about to change
                print(f"Interrupted: the run is stopping (step {self.trainer.step_count} in flight); dash.wait() "
                      "waits for its end")

    def detach(self) -> None:
        """Stop following the run (it goes on)."""
        if self.run is not None:
            self.run.unlisten(self._on_run)

    def _on_run(self, run: Run, what: str) -> None:
        """Told by the run: ``between`` (its thread), ``state``, ``end``, ``command-error:...``."""
        host = self.host
        if host.closed:
            run.unlisten(self._on_run)
            return
        if what == "minibatch":  # a long step: its minibatches shown as they go (rebuilt at most every refresh_s)
            if host.refresh_due():
                host.refresh()
        elif what == "between":
            if self.until_stopped and self.schedule is not None:
                note = extend_before_end(self.schedule, self.trainer)
                if note:
                    self.data.event(self.trainer.step_count, note)
            if host.refresh_due():
                host.refresh()
        elif what == "state":
            step = self.trainer.step_count
            stopping = (f"stopping: step {step} ends at its next minibatch ({run.minibatch} of {run.minibatches} "
                        "done), discarded as reset does" if run.long_step() and run.minibatch < run.minibatches
                        else "stopping after the current step...")
            messages = {"pausing": "pausing after the current step...",
                        "paused": f"paused at step {step}; stepwise buttons work while paused; run or resume goes on",
                        "running": "running", "stopping": stopping}
            if run.state in messages:
                host.set_status(messages[run.state])
            if run.state == "paused" or run.in_thread:
                host.refresh()
            else:
                host.changed()
        elif what.startswith("command-error:"):
            host.set_status(what[len("command-error:"):], error=True)
        elif what.startswith("note:"):  # something the run did on its own (finished hand-processed minibatches)
            host.set_status(what[len("note:"):])
        elif what == "end":
            message = (f"run ended after {run.steps_done} step(s) (now at step {self.trainer.step_count}): "
                       f"{REASONS.get(str(run.reason), str(run.reason))}")
            if run.abandoned is not None:
                step, done, of = run.abandoned
                message += (f"; step {step} was abandoned at minibatch {done} of {of}: its accumulation discarded "
                            "(as reset does), data positions and RNG as before it")
            if run.error is not None:
                self.error = run.error
                self.traceback = "".join(traceback.format_exception(type(run.error), run.error,
                                                                     run.error.__traceback__))
                message = (f"error in the training thread at step {self.trainer.step_count}, run stopped: "
                           f"{type(run.error).__name__}: {run.error}")
            host.set_status(message, error=run.error is not None)
            host.refresh()

