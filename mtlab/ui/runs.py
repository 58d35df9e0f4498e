"""Background training runs for notebooks: at most one per trainer, stoppable from anywhere.

A ``Run`` trains one trainer in one background thread through the training loop; between steps
(in that thread) it runs queued commands (snapshot, restore, a clip change), waits while paused,
tells its viewers (dashboards) and stops when asked. Every run is registered by trainer, so any
dashboard of that trainer (including one built later, which adopts the run) and plain code can
reach it::

    mtlab.ui.current_run(trainer)   # the run training ``trainer`` now, or None
    mtlab.ui.stop_all()             # stop every run after its current step

Kernel -> Interrupt (SIGINT in the kernel's main thread) stops every run between steps: while no
cell executes a handler installed here stops the runs; while a cell executes, IPython's own
KeyboardInterrupt is seen after the cell and stops them too.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TYPE_CHECKING

from ..core.events import ApplyInfo, Event, MinibatchInfo, Payload, RunEndInfo
from ..training.loop import run
from .texts import BUSY

if TYPE_CHECKING:
    from ..core.trainer import Trainer
    from ..training.schedule import Schedule

_LOCK = threading.Lock()
_RUNS: dict[int, Run] = {}  # id(trainer) -> its run; the run holds the trainer, so the id stays unique

Listener = Callable[["Run", str], None]


class Run:
    """One background run of ``trainer`` (``steps=0``: until stopped or the schedule ends).

    States: ``running``, ``pausing`` (asked, the step in flight finishes), ``paused``, ``stopping``,
    ``ended``. ``reason`` says why it ended (``steps``, ``stopped``, ``interrupted``, ``error``,
    or what the loop reports); ``error`` holds the exception of a failed run.

    Inside a step it counts the step's minibatches (``minibatch`` of ``minibatches``). A step that has gone on
    ``LONG_STEP_S`` seconds or more (K = 1000 rounds, a slow model) tells its viewers after each minibatch
    (``minibatch``), and a stop asked during it ends it early, at its next minibatch: the step is abandoned as
    if it had not begun (its accumulation discarded, as ``reset`` does, data positions and RNG put back by the
    loop; ``abandoned`` says where). A step shorter than that is finished first.
    """

    LONG_STEP_S = 1.0  # s: a step longer than this shows its minibatches and a stop does not wait for its end

    def __init__(self, trainer: Trainer, steps: int = 0, schedule: Schedule | None = None) -> None:
        self.trainer = trainer
        self.steps = int(steps)
        self.schedule = schedule
        self.state = "new"
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.steps_done = 0
        self.started = 0.0
        self.ended = 0.0
        self.paused_seconds = 0.0
        self._pause_t0: float | None = None
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._wake = threading.Event()
        self._commands: list[tuple[str, Callable[[], Any]]] = []
        self._commands_lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._thread: threading.Thread | None = None
        self.stop_source: str | None = None
        self.loop_reason: str | None = None  # what the training loop said when it returned
        self.end_step: int | None = None  # the trainer's step when the run ended (a restore may go back since)
        self.minibatch = 0  # minibatches done in the step in flight (0: between steps)
        self.minibatches = 0  # minibatches the step in flight draws (every active linked set, K rounds)
        self.step_t0 = 0.0  # when the step in flight began (monotonic)
        self.abandoned: tuple[int, int, int] | None = None  # (step, minibatches done, of) of a step a stop ended
        self._done = threading.Event()  # set when the thread has finished (wait() waits on it, not on join)

    # ------------------------------------------------------------------ queries
    @property
    def alive(self) -> bool:
        """Started and not ended (running, pausing, paused or stopping)."""
        return self.state not in ("new", "ended")

    @property
    def in_thread(self) -> bool:
        """True when called from this run's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def active_seconds(self) -> float:
        """Seconds spent running, paused time excluded."""
        end = self.ended if self.state == "ended" else time.monotonic()
        paused = self.paused_seconds + (end - self._pause_t0 if self._pause_t0 is not None else 0.0)
        return max(end - self.started - paused, 0.0)

    def rate(self) -> float:
        """Steps per second while running (paused time excluded)."""
        return self.steps_done / max(self.active_seconds(), 1e-9)

    def long_step(self) -> bool:
        """The step in flight has gone on ``LONG_STEP_S`` seconds or more."""
        return self.minibatch > 0 and time.monotonic() - self.step_t0 >= self.LONG_STEP_S

    # ------------------------------------------------------------------ listeners (dashboards)
    def listen(self, fn: Listener) -> None:
        """Call ``fn(run, what)`` with what in ``between`` (after a step, in the run's thread), ``minibatch``
        (after each minibatch of a long step, in the run's thread), ``state`` (paused, resumed, stopping) and
        ``end``."""
        if fn not in self._listeners:
            self._listeners.append(fn)

    def newest(self, fn: Listener) -> bool:
        """``fn`` is the listener added last (the dashboard on screen after a cell was re-run)."""
        return bool(self._listeners) and self._listeners[-1] == fn

    def unlisten(self, fn: Listener) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _tell(self, what: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(self, what)
            except Exception:  # a broken viewer must not stop training
                self.unlisten(fn)

    # ------------------------------------------------------------------ control (any thread)
    def start(self) -> None:
        """Register and start the thread; raises RuntimeError when the trainer already has a run."""
        with _LOCK:
            other = _RUNS.get(id(self.trainer))
            if other is not None and other.alive:
                raise RuntimeError(f"a run of this trainer is already in progress (step {self.trainer.step_count})")
            _RUNS[id(self.trainer)] = self
            self.state = "running"
            self.started = time.monotonic()
            self._thread = threading.Thread(target=self._main, name="mtlab-run", daemon=True)
            self.trainer.add_callback(self._count)
            self._thread.start()
        _watch_sigint()

    def stop(self, source: str = "stop", wait: bool = False, timeout: float | None = 30.0) -> bool:
        """Stop after the step in flight (a long one: at its next minibatch, the step abandoned); with ``wait``,
        block until the thread ended. False if not alive."""
        if not self.alive:
            return False
        if not self._stop.is_set():
            self.stop_source = source
            self._stop.set()
            self._wake.set()
            if self.state != "ended":
                self.state = "stopping"
                self._tell("state")
        if wait:
            self.wait(timeout)
        return True

    def pause(self) -> None:
        """Pause after the step in flight (state ``pausing`` until then, ``paused`` after)."""
        if self.alive and not self._stop.is_set() and not self._pause.is_set():
            self._pause.set()
            self.state = "pausing"
            self._tell("state")

    def resume(self) -> None:
        if self._pause.is_set():
            self._pause.clear()
            self._wake.set()
            if self.state in ("pausing", "paused"):
                self.state = "running"
                self._tell("state")

    def submit(self, what: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in the run's thread between two steps (``what`` names it in messages)."""
        with self._commands_lock:
            self._commands.append((what, fn))
        self._wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends; True if it has. A KeyboardInterrupt here stops the run."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return not self.alive
        try:  # an Event, not thread.join: a join cut by Ctrl-C may return at once later, the thread still going
            self._done.wait(timeout)
        except KeyboardInterrupt:
            self.stop("interrupt")
            raise
        if self._done.is_set():
            thread.join()
            release_sigint()
        return self._done.is_set()

    # ------------------------------------------------------------------ the thread
    def _count(self, event: Event, info: Payload) -> None:
        if isinstance(info, MinibatchInfo) and self.in_thread:
            self.minibatch += 1
            if self._stop.is_set() and self.minibatch < self.minibatches and self.long_step():
                self.abandoned = (self.trainer.step_count, self.minibatch, self.minibatches)
                # The loop abandons the step (its accumulation, data positions and RNG as before it) and ends.
                raise KeyboardInterrupt(f"mtlab: stop: step {self.trainer.step_count} abandoned at minibatch "
                                        f"{self.minibatch} of {self.minibatches}")
            if self.long_step():
                self._tell("minibatch")
        elif isinstance(info, ApplyInfo) and self.in_thread:
            self.steps_done += 1
            self.minibatch = 0
        elif isinstance(info, RunEndInfo) and self.in_thread:
            self.loop_reason = info.reason

    def _run_commands(self) -> None:
        with self._commands_lock:
            commands, self._commands = self._commands, []
        for what, fn in commands:
            try:
                fn()
            except Exception as exc:
                self._tell(f"command-error:{what}: {type(exc).__name__}: {exc}")

    def _finish_hand_work(self) -> None:
        """Minibatches processed by hand while paused: finish that accumulation (the chain's calls, then
        apply) before the run's next step, which would refuse to discard them."""
        tr = self.trainer
        busy = {n: a.minibatches for n, a in ((n, tr.state(n)) for n in tr.tasks) if a.phase in BUSY}
        if not busy:
            return
        tr.finish()  # the chain's calls still due, then apply (as the step button does)
        parts = ", ".join(f"{n}: {k} minibatch(es)" for n, k in busy.items())
        self._tell(f"note:resumed: finished the accumulation started by hand while paused ({parts}) as step "
                   f"{tr.step_count}")

    def _between(self) -> bool:
        """Between two steps, in the run's thread: commands, pause, viewers; True stops the run."""
        self._run_commands()
        if self._pause.is_set() and not self._stop.is_set():
            self.state = "paused"
            self._pause_t0 = time.monotonic()
            self._tell("state")
            while self._pause.is_set() and not self._stop.is_set():
                self._wake.wait(0.1)
                self._wake.clear()
                self._run_commands()
                self._tell("paused")
            self.paused_seconds += time.monotonic() - self._pause_t0
            self._pause_t0 = None
            if not self._stop.is_set():
                self.state = "running"
                self._tell("state")
                self._finish_hand_work()
        if self._stop.is_set():
            return True
        if self.steps and self.steps_done >= self.steps:
            self.reason = "steps"
            return True
        self._tell("between")
        tr = self.trainer
        rounds = tr.minibatches_per_step
        self.minibatch, self.step_t0 = 0, time.monotonic()
        self.minibatches = sum(rounds[n] * len(sets) for n, sets in tr.active_tasks().items())
        return False

    def _main(self) -> None:
        try:
            out = run(self.trainer, schedule=self.schedule, steps=self.steps or None, progress=False,
                      between_steps=self._between)  # the one training loop
            last = self.loop_reason or getattr(out, "last_stop", None) or getattr(out, "reason", None)
            self.reason = self.reason or (str(last) if last else None)
            self._run_commands()
        except BaseException as exc:  # noqa: BLE001 (shown by the viewers; the thread must not die silently)
            self.error = exc
            self.reason = "error"
        finally:
            if self._stop.is_set() and self.reason != "error":  # asked to stop: say who asked
                self.reason = "interrupted" if self.stop_source == "interrupt" else "stopped"
            self.reason = self.reason or "done"
            self.end_step = self.trainer.step_count
            self.trainer.remove_callback(self._count)
            with _LOCK:
                if _RUNS.get(id(self.trainer)) is self:
                    del _RUNS[id(self.trainer)]
                self.ended = time.monotonic()
                if self._pause_t0 is not None:
                    self.paused_seconds += self.ended - self._pause_t0
                    self._pause_t0 = None
                self.state = "ended"
                self.minibatch = 0
            self._tell("end")
            self._done.set()


def current_run(trainer: Trainer) -> Run | None:
    """The run training ``trainer`` now (running, paused or stopping), or None."""
    with _LOCK:
        run = _RUNS.get(id(trainer))
    return run if run is not None and run.alive else None


def runs() -> list[Run]:
    """Every run in progress."""
    with _LOCK:
        return [r for r in _RUNS.values() if r.alive]


def stop_all(wait: bool = True, timeout: float | None = 30.0, source: str = "stop_all") -> int:
    """Stop every background run after its current step (``wait``: until they ended); how many."""
    found = runs()
    for r in found:
        r.stop(source)
    if wait:
        for r in found:
            r.wait(timeout)
        release_sigint()
    return len(found)


def release_sigint() -> None:
    """Put the previous SIGINT handler back once no run is left (main thread only; a no-op otherwise)."""
    if threading.current_thread() is threading.main_thread() and not runs() and _kernel_loop() is None:
        _uninstall()


# ---------------------------------------------------------------------------------- Kernel -> Interrupt
_previous_handler: Callable[[int, FrameType | None], Any] | int | None = None
_installed = False
_hooked = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """Stop every run, then do what SIGINT did before (nothing in an idle kernel; KeyboardInterrupt
    in a script)."""
    n = stop_all(wait=False, source="interrupt")
    if n:
        print(f"Interrupt: stopping {n} background run(s) after the current step", flush=True)
    prev = _previous_handler
    if callable(prev) and prev is not _on_sigint:
        prev(signum, frame)


def _install() -> None:
    """Put ``_on_sigint`` in place (main thread only). In a kernel only when idle: while a handler
    runs ipykernel sets its own and restores the one it saved afterwards."""
    global _previous_handler, _installed
    current = signal.getsignal(signal.SIGINT)
    if current is _on_sigint:
        return
    _previous_handler = current
    signal.signal(signal.SIGINT, _on_sigint)
    _installed = True


def _uninstall() -> None:
    global _installed
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, _previous_handler if _previous_handler is not None else signal.default_int_handler)
    _installed = False


def _after_cell(result: object) -> None:
    """IPython post_run_cell hook: a cell ended by KeyboardInterrupt (Kernel -> Interrupt) stops the runs."""
    if isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
        n = stop_all(wait=False, source="interrupt")
        if n:
            print(f"Interrupt: stopping {n} background run(s) after the current step", flush=True)


def _kernel_loop() -> Any:
    """The running asyncio loop of an IPython kernel (main thread), or None."""
    try:
        import asyncio

        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    if ip is None or not hasattr(ip, "kernel"):
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _watch_sigint() -> None:
    """Make Kernel -> Interrupt (or Ctrl-C in a script) stop the runs; called in the thread that started one."""
    global _hooked
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except ImportError:
        ip = None
    if ip is not None and not _hooked:
        ip.events.register("post_run_cell", _after_cell)
        _hooked = True
    loop = _kernel_loop()
    if loop is None:
        try:
            _install()
        except ValueError:  # not the main thread of the interpreter
            pass
        return

    def check() -> None:
        # Idle kernel: SIGINT is SIG_IGN (ipykernel) and nothing would stop the runs; put ours there.
        # While a handler runs, SIGINT is default_int_handler: leave it (post_run_cell covers cells).
        current = signal.getsignal(signal.SIGINT)
        if runs():
            if current is signal.SIG_IGN:
                _install()
            loop.call_later(0.2, check)
        elif current is _on_sigint:
            _uninstall()

    loop.call_later(0.0, check)
