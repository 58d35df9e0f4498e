"""The dashboard without widgets: a ``Controller`` holds what a dashboard knows (the trainer, its
run, snapshots, the event log, the last outcome), takes commands, refuses what cannot be done now
(saying why and what to click instead), and after every change hands its views one ``DashState``
from which every text on screen is derived::

    c = Controller(trainer, schedule)
    c.subscribe(lambda state: print(state.status))
    c.step(); c.set("weight", 0.5, task="a", linkedset="clean")
    c.start(100); c.wait()                    # a background run (mtlab.ui.runs.Run)
    c.start(50)                               # 50 more, even after the schedule ended: it is extended

Threads: commands come from the kernel's main thread; during a run the texts are rebuilt in the run's
thread between steps (a consistent view), at most every ``refresh_s``, and at once after a change.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

from ..core.events import (Event, EvaluateInfo, KnobInfo, MinibatchInfo, Payload, ReinitializeInfo, RestoreInfo,
                           ValidationInfo)
from ..core.knobs import KNOBS
from ..training.debug import next_call
from .branches import Branches
from .runcontrol import RunControl
from .runs import Run, current_run
from .schedules import schedule_text
from .state import DashState, RunView, SeriesStore, where_text
from .texts import BUSY, REASONS, call_buttons, noise_html, skipped_tasks, state_table_html

if TYPE_CHECKING:
    from ..core.trainer import Trainer
    from ..training.schedule import Schedule

View = Callable[[DashState], None]
# The choice beside "re-initialise": its label on screen -> the value ``Controller.reinitialize(knobs=...)`` takes.
KNOB_CHOICES = {"keep": "keep the knobs", "start": "starting knobs"}
# Where a knob's change is in force during a run, by its row's ``when``.
WHEN = {"minibatch": "its next minibatch", "step": "its next step", "apply": "its next apply()"}
_BY_TRAINER: dict[int, list[Controller]] = {}  # id(trainer) -> its attached controllers (the newest last)
_BY_TRAINER_LOCK = threading.Lock()


class Controller:
    """Commands, refusals and run control of one dashboard; see the module docstring. The background run is
    its ``runs`` (a ``RunControl``); ``start``, ``pause``, ``resume``, ``stop``, ``wait`` are its."""

    def __init__(self, trainer: Trainer, schedule: Schedule | None = None, keep_snapshots: int = 5, refresh_s: float = 0.25) -> None:
        self.trainer = trainer
        self.keep_snapshots = keep_snapshots
        self.refresh_s = float(refresh_s)
        self.data = SeriesStore()
        self.runs = RunControl(trainer, schedule, self.data, self)
        self.snapshots: list[dict[str, Any]] = []
        self.forks = Branches()  # the branches made by "fork here" (``branches``: name -> trainer)
        self._branch_key: tuple[Any, ...] | None = None  # the selected branch's state when its curves were read
        # What "re-initialise, back to the starting knobs" sets again: the knobs the run's first step ran with
        # (taken at its first minibatch, so a notebook cell after this one that sets lr or a weight counts), or
        # those of now when the trainer is past step 0 already.
        self.start_knobs = trainer.knobs()
        self._take_start = trainer.step_count == 0
        self.closed = False
        self.collect_cpu = 0.0  # CPU seconds spent collecting rows and building states (bench/ui_overhead.py)
        self._views: list[View] = []
        self._status, self._status_error = "", False
        self._last: DashState | None = None
        self._last_emit = 0.0
        self._dirty = False
        self._skipped_seen = skipped_tasks(trainer)
        self._in_command = False  # a command's own status line follows: trainer events need not show
        self._waiting: tuple[int, str] | None = None  # a change made during a run: (journal entries then, its line)
        trainer.add_callback(self._on_event)
        with _BY_TRAINER_LOCK:  # one live dashboard per trainer: a re-run cell replaces the older one
            older = _BY_TRAINER.setdefault(id(trainer), [])
            replaced, older[:] = list(older), [self]
        for c in replaced:
            c.detach(f"replaced by a newer dashboard of this trainer (step {trainer.step_count}); use that one")
        adopted = current_run(trainer)
        if adopted is not None:
            self.runs.attach(adopted)
            self._status = (f"this dashboard shows the run already in progress (step {trainer.step_count}); "
                            "pause and stop work here")
        else:
            self._status = "ready: " + next_call(trainer)
        self.data.minibatch_now = lambda: int(self.trainer.journal.minibatch)
        self._seed_events()
        self.data.collect(trainer)

    def _seed_events(self) -> None:
        """The events so far from the trainer's journal (a dashboard built on a trainer that has changed already:
        a re-run cell's): the same list, numbers and marks the dashboard before it showed, as far as the journal
        holds them (knob changes, restores, re-initialisations)."""
        for e in list(self.trainer.journal.entries):
            if e["type"] != "change":
                continue
            knob = KNOBS.get(e["kind"])
            if knob is not None:
                text = knob.words(e.get("value"), e.get("task"), e.get("linkedset"))
            elif e["kind"] == "reinitialize":
                self.data.restored(int(e["step"]), everything=True)
                text = f"re-initialised (from step {e.get('from_step')})"
            elif e["kind"] == "restore":
                back = int(e.get("to_step", e["step"]))
                self.data.restored(back)
                text = f"restored step {back}"
            else:
                continue
            self.data.event(int(e["step"]), text, int(e["minibatch"]))

    # ------------------------------------------------------------------ the run (``runs``)
    @property
    def schedule(self) -> Schedule | None:
        """The experiment's schedule (lr decay, validation); None: the trainer's lr."""
        return self.runs.schedule

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        self.runs.schedule = value

    @property
    def run(self) -> Run | None:
        """The background run this dashboard follows (None before the first)."""
        return self.runs.run

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the latest run (None: it ended cleanly, or is going)."""
        return self.runs.error

    @property
    def running(self) -> bool:
        """A run of this trainer is in progress and not paused."""
        return self.runs.running

    @property
    def alive(self) -> bool:
        """A run of this trainer is in progress (possibly paused)."""
        return self.runs.alive

    def start(self, steps: int = 0) -> bool:
        """Train in a background thread through the training loop: ``steps`` more steps (0: to the schedule's
        end, or until stopped once it has ended). A finished schedule is continued; False when refused."""
        return self.runs.start(steps)

    def pause(self) -> None:
        """Pause after the current step (stepwise buttons work while paused)."""
        self.runs.pause()

    def resume(self) -> None:
        self.runs.resume()

    def toggle_pause(self) -> None:
        self.runs.toggle_pause()

    def stop(self, wait: bool = True, timeout: float | None = 30.0) -> bool:
        """Stop the trainer's run after the current step (whoever started it); False when none was going."""
        return self.runs.stop(wait=wait, timeout=timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run ends. Kernel -> Interrupt here stops the run and says so in one line."""
        self.runs.wait(timeout)

    # ------------------------------------------------------------------ state and views
    def subscribe(self, view: View) -> None:
        """Call ``view(state)`` after every change (from the thread that made it)."""
        self._views.append(view)

    def state(self) -> DashState:
        """One consistent picture (call it between steps or while no run goes)."""
        tr, runs = self.trainer, self.runs
        run, view = runs.run, None
        if run is not None:
            total = run.steps
            if not total and self.schedule is not None and not runs.until_stopped:
                total = max(int(self.schedule.num_steps) - (tr.step_count - run.steps_done), 0)
            view = RunView(run.state, run.steps_done, total, run.rate(), run.active_seconds(),
                           REASONS.get(str(run.reason), run.reason) if run.reason else None, run.error is not None,
                           run.minibatch if run.in_thread else 0, run.minibatches, run.end_step)
        clip = tr.clip_grad_value
        with self.data.lock:
            events, records = tuple(self.data.events), tuple(dict(r) for r in self.data.records)
            places = tuple(where_text(s, m) for (s, _), m in zip(self.data.events, self.data.event_minibatches))
        return DashState(
            step=tr.step_count, phases={n: str(getattr(p, "value", p)) for n, p in tr.phase().items()},
            next_call=next_call(tr), skipped=skipped_tasks(tr), weights=dict(tr.weights()), lr=float(tr.lr),
            clip=None if clip is None else float(clip), combine=str(getattr(tr.update, "method", None) or "sum"),
            run=view, status=self._status, status_error=self._status_error, error=runs.traceback,
            events=events, records=records, snapshots=tuple(f"#{i + 1}: step {s['step']}"
                                                            for i, s in enumerate(self.snapshots)),
            schedule=schedule_text(self.schedule, tr), run_refusal=runs.refusal(),
            table_html=state_table_html(tr), journal=tuple(tr.journal.lines()), noise_html=noise_html(tr),
            branches=self.forks.labels(), branch=self.forks.selected, driven=self.forks.driven, places=places)

    def refresh(self) -> DashState:
        """Read new history rows, rebuild the state and show it (between steps or while idle)."""
        c0 = time.thread_time()
        if self.forks.selected is not None:
            self._show_branch()
        waiting = self._waiting
        taken = None if waiting is None else next(
            (e for e in self.trainer.journal.entries[waiting[0]:] if e["type"] == "change"), None)
        if waiting is not None and taken is not None:  # the run took it: where, in the journal's numbering
            self._waiting = None
            if self._status.startswith(waiting[1]):  # still the latest news: say it holds now
                self._status, self._status_error = (f"{waiting[1]}; in force from "
                                                    f"{where_text(taken['step'], taken['minibatch'])}"), False
        self.data.collect(self.trainer)
        self._last = self.state()
        self._last_emit, self._dirty = time.monotonic(), False
        self.collect_cpu += time.thread_time() - c0
        for view in list(self._views):
            view(self._last)
        return self._last

    def _changed(self) -> None:
        """After a change: rebuild at once, or during a run (a step in flight) show the new status on the
        last consistent state and rebuild at the end of the current step."""
        if self.closed:
            return
        run = self.run
        if run is not None and run.alive and run.state not in ("paused",) and not run.in_thread \
                and self._last is not None:
            self._dirty = True
            shown = dataclasses.replace(self._last, status=self._status, status_error=self._status_error,
                                        error=self.runs.traceback)
            for view in list(self._views):
                view(shown)
        else:
            self.refresh()

    def say(self, message: str, error: bool = False) -> None:
        """Set the status line (the outcome of the latest change) and show it."""
        self._status, self._status_error = message, error
        self._changed()

    def set_status(self, message: str, error: bool = False) -> None:
        """Set the status line, shown at the next refresh."""
        self._status, self._status_error = message, error
        self._dirty = True

    def changed(self) -> None:
        """Show a change now, or at the end of the step in flight."""
        self._changed()

    def refresh_due(self) -> bool:
        """Whether the views are due a refresh (a change waits, or ``refresh_s`` passed)."""
        return self._dirty or time.monotonic() - self._last_emit >= self.refresh_s

    # ------------------------------------------------------------------ commands
    def _command(self, name: str, fn: Callable[[], Any], stepwise: bool = False) -> bool:
        """Run a command now; a refusal or an error becomes the status line. True when it ran."""
        if self.closed:
            return False
        if stepwise and self.running:
            self.say(f"{name}: refused while a run is going; pause (or stop) the run first", error=True)
            return False
        self._in_command = True
        try:
            with self.trainer.journal.source("dashboard"):
                message = fn()
        except Exception as exc:  # noqa: BLE001 (a rejected value or call: said; the state shows what holds now)
            self.say(f"{name}: {type(exc).__name__}: {exc}", error=True)
            return False
        finally:
            self._in_command = False
        self.say(message if isinstance(message, str) else f"{name}: done. next: {next_call(self.trainer)}")
        return True

    def set(self, name: str, value: Any, task: str | None = None, linkedset: str | None = None) -> bool:
        """Set a knob of the trainer (``Trainer.set``: a row of ``mtlab.core.knobs.KNOBS``), as every control of
        the dashboard does: in force from the row's point of the cycle (also during a run: the status says it is
        pending, then where it is in force); a refused value is said in the status line, nothing changed."""
        def do() -> str:
            before = len(self.trainer.journal.entries)
            change = self.trainer.set(name, value, task, linkedset)
            skipped = skipped_tasks(self.trainer)
            tail = "; skipped by step(): " + ", ".join(f"{n} ({w})" for n, w in skipped.items()) if skipped else ""
            taken = None if change.pending else next(
                (e for e in self.trainer.journal.entries[before:] if e["type"] == "change"), None)
            if taken is not None and self.running:  # made between two steps of the run: in force at once
                return f"{change.words}{tail}; in force from {where_text(taken['step'], taken['minibatch'])}"
            return self._pending(f"{change.words}{tail}", WHEN.get(change.when, "its next minibatch"), before)
        return self._command(name.replace("_", " "), do)

    # The setters of earlier dashboards: one line each.
    def set_weight(self, task: str, linkedset: str, value: float) -> bool:
        return self.set("weight", value, task, linkedset)

    def set_task_weight(self, task: str, value: float) -> bool:
        return self.set("task_weight", value, task)

    def set_lr(self, value: float) -> bool:
        return self.set("lr", value)

    def set_clip(self, value: float | None) -> bool:
        return self.set("clip_grad_value", value)

    def set_minibatches_per_step(self, k: int, task: str | None = None) -> bool:
        return self.set("minibatches_per_step", k, task)

    def set_batch_size(self, task: str, batch_size: int) -> bool:
        return self.set("batch_size", batch_size, task)

    def set_combine(self, method: str) -> bool:
        return self.set("combine", method)

    def _pending(self, message: str, when: str, since: int | None = None) -> str:
        """During a run a change waits for the run's next minibatch (or step): the status says it is pending, and
        says where it is in force once the run took it (``refresh``), numbered as the journal and the events are."""
        if not self.running:
            return message
        self._waiting = (len(self.trainer.journal.entries) if since is None else since, message)
        return f"{message}; pending: the run takes it at {when}"

    def reinitialize(self, knobs: str = "keep") -> bool:
        """``Trainer.reinitialize()``: the initial weights and a fresh optimizer, step 0; the old curves stay grey
        on the plot, its event marks go. ``knobs``: ``"keep"`` (as set now) or ``"start"`` (back to the knobs the
        knobs the run's first step ran with: ``start_knobs``, those of the notebook's cells, the first run's, also
        after several re-initialisations). During a run at the end of the current step (the run goes on from step
        0)."""
        if knobs not in KNOB_CHOICES:
            raise ValueError(f"reinitialize(knobs=...) takes one of {list(KNOB_CHOICES)}, got {knobs!r}")

        def back() -> str:
            before = self.trainer.step_count
            changed = self.trainer.set_knobs(self.start_knobs) if knobs == "start" else []
            self.trainer.reinitialize()
            kept = ("knobs kept" if knobs == "keep" else
                    "the starting knobs again" + (f" ({', '.join(changed)})" if changed else " (none had changed)"))
            return (f"re-initialised: step {before} -> 0, the initial weights and a fresh optimizer; {kept}; "
                    "the abandoned branch stays grey on the plot")
        return self._between_steps("re-initialise", back)

    def minibatch(self, task: str, linkedset: str) -> bool:
        def do() -> str:
            self.trainer.process_minibatch(task, linkedset)
            n = self.trainer.state(task).minibatches
            return (f"minibatch: done ({task!r} has {n} minibatch(es) accumulated; the step button will finish "
                    f"this accumulation: normalize, clip, apply). next: {next_call(self.trainer)}")
        return self._command("minibatch", do, stepwise=True)

    def call(self, name: str) -> bool:
        """A stepwise call of the trainer by name: a call of its chain (normalize, clip, a user transform's),
        apply, reset (step: ``step()``)."""
        if name == "step":
            return self._command("step", self._step, stepwise=True)
        calls = call_buttons(self.trainer)
        if name == "reset":
            return self._command(name, self.trainer.reset, stepwise=True)
        if name not in (*calls, "apply"):
            raise ValueError(f"call(): {name!r} is not a stepwise call; choose one of "
                             f"{['minibatch', *calls, 'apply', 'step', 'reset']}")
        return self._command(name, lambda: self.trainer.call(name), stepwise=True)

    def _step(self) -> str:
        """step(), or, after minibatches processed by hand, ``Trainer.finish()`` on that accumulation (step()
        would start a fresh one and drop them)."""
        tr = self.trainer
        busy = {n: tr.state(n).minibatches for n, p in tr.phase().items() if p in BUSY}
        if not busy:
            tr.step()
            skipped = skipped_tasks(tr)
            extra = "; skipped " + ", ".join(f"{n} ({r})" for n, r in skipped.items()) if skipped else ""
            return f"step: done (a whole cycle, step {tr.step_count}){extra}"
        calls = tr.finish()
        parts = ", ".join(f"{n}: {k} minibatch(es)" for n, k in busy.items())
        return (f"step: finished the accumulation started by hand ({parts}) with {', '.join(calls)} "
                f"instead of a fresh step(), which would have discarded it; now step {tr.step_count}")

    def take_snapshot(self) -> bool:
        def take() -> str:
            snap = self.trainer.state_dict()
            self.snapshots.append(snap)
            del self.snapshots[:-self.keep_snapshots]
            return f"snapshot taken at step {snap['step']} ({len(self.snapshots)} kept)"
        return self._between_steps("snapshot", take)

    def restore(self, index: int | None = None) -> bool:
        """Go back to snapshot ``index`` (default: the latest); the abandoned branch stays grey on the plot."""
        if not self.snapshots:
            self.say("restore: no snapshot yet; click snapshot first", error=True)
            return False
        i = len(self.snapshots) - 1 if index is None else int(index)
        snap = self.snapshots[i]

        def back() -> str:
            self.trainer.load_state_dict(snap)  # every knob too, batch sizes included (checked before any is set)
            return f"restored snapshot #{i + 1} (step {snap['step']}); the abandoned branch stays grey on the plot"
        return self._between_steps("restore", back)

    @property
    def branches(self) -> dict[str, Trainer]:
        """Name -> the trainer of each branch made by "fork here" (not the one the dashboard drives)."""
        return self.forks.trainers

    def fork(self, name: str | None = None, index: int | None = None) -> bool:
        """"fork here": a branch of the trainer now, or of snapshot ``index``; kept in ``branches``, selected, and
        drawn on the plot (its own part, from the fork's step) once it trains: ``continue_branch``."""
        name = name or self.forks.new_name()
        if name in self.forks or name == self.forks.driven:
            self.say(f"fork: a branch named {name!r} exists already; choose another name", error=True)
            return False
        snap = self.snapshots[int(index)] if index is not None and self.snapshots else None

        def make() -> str:
            step = int(snap["step"]) if snap is not None else self.trainer.step_count
            self.forks.add(name, self.trainer.fork(name, state=snap), step)
            self.data.event(self.trainer.step_count, f"fork {name}")
            self._show_branch()
            where = f"snapshot at step {step}" if snap is not None else f"step {step}"
            return (f"fork: branch {name!r} from {where}; continue trains it (its lines join the plot), switch "
                    "drives it from here, compare draws every branch, drop forgets it")
        return self._between_steps("fork", make)

    def select_branch(self, name: str | None) -> bool:
        """The branch drawn on the plot and acted on by continue, switch, compare and drop (None: none drawn)."""
        if name is not None and name not in self.forks:
            self.say(f"branch: no branch named {name!r}; branches: {list(self.forks.trainers)}", error=True)
            return False
        self.forks.selected = name
        self._show_branch()
        self.changed()
        return True

    def _branch(self, what: str, name: str | None) -> str | None:
        """The branch a command acts on (``name``, else the selected one), or None after saying why."""
        name = name if name is not None else self.forks.selected
        if name is None or name not in self.forks:
            self.say(f"{what}: no branch yet; click fork here first", error=True)
            return None
        return name

    def continue_branch(self, steps: int = 10, name: str | None = None) -> bool:
        """Train branch ``name`` (default: the selected one) ``steps`` more steps in a background thread of its own
        (the run of the dashboard's trainer goes on); its lines grow on the plot."""
        name = self._branch("continue", name)
        if name is None:
            return False
        if self.forks.running(name):
            self.say(f"continue: branch {name!r} is training already; wait for it or stop it", error=True)
            return False
        steps = int(steps) if steps else 10
        run = Run(self.forks.trainers[name], steps=steps)
        run.listen(self._on_branch_run)
        self.forks.runs[name] = run
        self.forks.selected = name
        try:
            run.start()
        except RuntimeError as exc:
            self.say(f"continue: {exc}", error=True)
            return False
        self.say(f"continue: branch {name!r} trains {steps} more steps in the background (its lines: x marks)")
        return True

    def _on_branch_run(self, run: Run, what: str) -> None:
        if self.closed:
            run.unlisten(self._on_branch_run)
            return
        if what == "end" or (what == "between" and self.refresh_due()):
            self._show_branch()
            name = next((n for n, r in self.forks.runs.items() if r is run), "?")
            if what == "end":
                self._status, self._status_error = (f"branch {name!r}: {run.steps_done} step(s) trained, now at step "
                                                    f"{run.trainer.step_count} ({REASONS.get(str(run.reason), run.reason)})",
                                                    run.error is not None)
            self.changed()

    def switch_branch(self, name: str | None = None) -> bool:
        """Drive branch ``name`` (default: the selected one) from this dashboard; the trainer driven until now
        becomes a branch under its name (``"main"`` at first). Refused while any of them trains."""
        name = self._branch("switch", name)
        if name is None:
            return False
        busy = [n for n in self.forks.trainers if self.forks.running(n)] + (["this dashboard's run"] if self.alive else [])
        if busy:
            self.say(f"switch: refused while {', '.join(busy)} train(s); stop or wait first", error=True)
            return False
        old, new = self.trainer, self.forks.trainers[name]
        old_name, parted = self.forks.driven, self.forks.fork_steps[name]
        self.forks.remove(name)
        self.forks.add(old_name, old, parted)  # the two part at the fork's step, whichever is driven
        self.forks.driven = name
        old.remove_callback(self._on_event)
        self.trainer = new
        self.runs.trainer = new
        new.add_callback(self._on_event)
        with _BY_TRAINER_LOCK:
            mine = _BY_TRAINER.get(id(old), [])
            if self in mine:
                mine.remove(self)
            if not mine:
                _BY_TRAINER.pop(id(old), None)
            _BY_TRAINER.setdefault(id(new), []).append(self)
        self.data.clear()
        self.data.collect(new)
        self._show_branch()
        self.say(f"switch: this dashboard drives {name!r} now (step {new.step_count}; dash.trainer); the trainer it "
                 f"drove is the branch {old_name!r}")
        return True

    def drop_branch(self, name: str | None = None) -> bool:
        """Forget branch ``name`` (default: the selected one); refused while it trains."""
        name = self._branch("drop", name)
        if name is None:
            return False
        if self.forks.running(name):
            self.say(f"drop: branch {name!r} is training; wait for it first", error=True)
            return False
        self.forks.remove(name)
        self._show_branch()
        self.say(f"drop: branch {name!r} forgotten" + (f"; {self.forks.selected!r} is shown now"
                                                        if self.forks.selected else ""))
        return True

    def compared(self) -> dict[str, Trainer]:
        """The runs ``compare`` draws side by side (``mtlab.plots.plot_runs``): the driven trainer, then each branch."""
        return {self.forks.driven: self.trainer, **self.forks.trainers}

    def _show_branch(self) -> None:
        """The selected branch's curves into the plotted data (read again only when the branch moved on)."""
        name = self.forks.selected
        tr = self.forks.trainers.get(name) if name is not None else None
        key = (name, id(tr), tr.step_count if tr is not None else -1, len(tr.log.rows()) if tr is not None else -1)
        if key != self._branch_key:
            self._branch_key = key
            self.data.set_branch(*self.forks.series())

    def _between_steps(self, what: str, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` now, or, during an active run, in the training thread before its next step."""
        run = self.run
        if run is not None and run.alive and run.state != "paused" and not run.in_thread:
            def queued() -> None:
                with self.trainer.journal.source("dashboard"):
                    message = fn()
                self._status, self._status_error = (message if isinstance(message, str) else f"{what}: done"), False
                self._dirty = True
            run.submit(what, queued)
            self.say(f"{what}: will happen at the end of the current step")
            return True
        return self._command(what, fn)

    def clear_error(self) -> None:
        self.runs.traceback = None
        self.say("error details cleared")

    # ------------------------------------------------------------------ trainer events
    def _on_event(self, event: Event, info: Payload) -> None:
        data = self.data
        from_code = not self._in_command and threading.current_thread() is threading.main_thread()
        if isinstance(info, MinibatchInfo):
            if self._take_start:  # the first minibatch of the first step: the knobs it ran with
                self.start_knobs, self._take_start = self.trainer.knobs(), False
        elif isinstance(info, EvaluateInfo):
            with data.lock:
                data.validation.append({"step": info.step, "task": info.task, "linkedset": info.linkedset,
                                        "loss": info.loss})
        elif isinstance(info, ValidationInfo):
            record = dict(info.record)
            record.setdefault("step", info.step)
            with data.lock:
                data.records.append(record)
                data.validation.append(record)
        elif isinstance(info, KnobInfo):
            knob = KNOBS.get(info.name)
            words = knob.words(info.value, info.task, info.linkedset) if knob is not None else f"{info.name} {info.value}"
            data.event(self.trainer.step_count, words)
            if info.name in ("weight", "task_weight"):
                skipped = skipped_tasks(self.trainer)
                for name, why in skipped.items():
                    if self._skipped_seen.get(name) != why:
                        data.event(self.trainer.step_count, f"task {name} skipped by step(): {why}")
                for name in set(self._skipped_seen) - set(skipped):
                    data.event(self.trainer.step_count, f"task {name} trains again")
                self._skipped_seen = skipped
            self._dirty = True
            if from_code:
                self._changed()
        elif isinstance(info, RestoreInfo | ReinitializeInfo):
            data.restored(info.step, everything=isinstance(info, ReinitializeInfo))
            data.event(info.step, f"re-initialised (from step {info.from_step})" if isinstance(info, ReinitializeInfo)
                       else f"restored step {info.step}")
            self._dirty = True
            if from_code:
                self._changed()

    # ------------------------------------------------------------------ lifecycle
    def detach(self, why: str = "closed") -> None:
        """Stop listening to the trainer and its run (the run goes on); views get a last state saying ``why``."""
        if self.closed:
            return
        self._status, self._status_error = why, False
        self.closed = True  # first: the views see a closed controller in their last state
        if self._last is not None:
            last = dataclasses.replace(self._last, status=why, status_error=False)
            for view in list(self._views):
                view(last)
        self.runs.detach()
        self.trainer.remove_callback(self._on_event)
        with _BY_TRAINER_LOCK:
            mine = _BY_TRAINER.get(id(self.trainer), [])
            if self in mine:
                mine.remove(self)
            if not mine:
                _BY_TRAINER.pop(id(self.trainer), None)
        self._views.clear()

    def close(self, stop: bool = True) -> None:
        """Stop the trainer's run (unless ``stop=False``) and detach."""
        if stop and not self.closed:
            self.stop(wait=True)
        self.detach()
