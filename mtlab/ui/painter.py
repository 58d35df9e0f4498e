"""When the live plot is drawn: a ``Painter`` turns a ``SeriesStore`` into PNG bytes through a
``LivePlot`` and hands them to a sink (the dashboard's Image widget), at most every
``draw_interval`` (0.7 s) during a run, spacing draws further when they get slow (a loaded machine)
so that drawing takes at most ``max_draw_share`` (10%) of the wall time and training keeps its speed,
but never more than ``MAX_INTERVAL`` (0.8 s) apart while there is something new to show; the share
counts the drawing thread's CPU time (waiting for a core on a loaded machine costs training nothing)
(``bench/ui_overhead.py`` measures the pace, idle and under load).

``mode``: ``"thread"`` draws in its own daemon thread (the plot follows within about a second);
``"inline"`` draws between steps in the run's own thread within half that share (no thread preempted
while it holds the GIL); ``"auto"`` picks inline when the machine is oversubscribed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..training.plotseries import validation_series
from .liveplot import LivePlot
from .state import SeriesStore

MODES = ("auto", "thread", "inline")
MAX_INTERVAL = 0.8  # s: however slow the draws, the next one starts at most this long after the last began,
# so that on an idle machine (a full draw ~130 ms of CPU) draws end at most 1 s apart. The old 3 s cap with a
# 10% share of the *wall* time made a 250-350 ms draw wait 2.5-3 s: the plot redrew every 2.2-3.6 s.


def pace(draw_interval: float, cost: float, share: float) -> float:
    """Seconds from one draw's start to the next: ``draw_interval``, longer when a draw costs more than
    ``share`` of that CPU-wise, never over ``MAX_INTERVAL``."""
    return min(max(draw_interval, cost / share if share > 0 else 0.0), MAX_INTERVAL)


class Painter:
    """Draws ``store`` into ``plot`` and gives the PNG to ``sink(png, step)``; see the module docstring."""

    def __init__(self, plot: LivePlot, store: SeriesStore, sink: Callable[[bytes, int], None],
                 draw_interval: float = 0.7, max_draw_share: float = 0.1, mode: str = "thread",
                 on_error: Callable[[str], None] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"painter must be one of {list(MODES)}, got {mode!r}")
        self.plot, self.store, self.sink = plot, store, sink
        self.draw_interval = float(draw_interval)
        self.max_draw_share = float(max_draw_share)
        self.mode = mode
        self.on_error = on_error
        self.redraws = 0  # draws done, their wall and CPU seconds (thread time: independent of the load)
        self.redraw_seconds = 0.0
        self.redraw_cpu = 0.0
        self.drawn_step: int | None = None
        self.closed = False
        self._lock = threading.RLock()
        self._dirty = threading.Event()
        self._thread: threading.Thread | None = None
        self._load_checked, self._loaded = -1e9, False
        self._inline_last, self._inline_cost = 0.0, 0.0

    def reset_counters(self) -> None:
        self.redraws, self.redraw_seconds, self.redraw_cpu = 0, 0.0, 0.0

    def set_size(self, width_px: int, font_scale: float = 1.0, pixel_ratio: float = 1.0,
                 max_height_px: int | None = None) -> None:
        """The plot laid out again (``LivePlot.set_size``), between two draws."""
        with self._lock:
            self.plot.set_size(width_px, font_scale, pixel_ratio, max_height_px)

    def draw(self) -> None:
        """Draw now, in the calling thread (one draw at a time)."""
        with self._lock:
            t0, c0 = time.monotonic(), time.thread_time()
            data = self.store.copy()
            self.plot.update(data.series, validation_series(data.validation), step=data.step, events=data.marks(),
                             ghost=data.ghost, branch=data.branch, branch_name=data.branch_name)
            png = self.plot.png()
            self.drawn_step = data.step
            self.sink(png, data.step)
            self.redraws += 1
            self.redraw_seconds += time.monotonic() - t0
            self.redraw_cpu += time.thread_time() - c0

    def _safe_draw(self) -> None:
        try:
            self.draw()
        except Exception as exc:  # noqa: BLE001 (drawing must never take a run down)
            if self.on_error is not None:
                self.on_error(f"plot: {type(exc).__name__}: {exc}")

    def inline(self) -> bool:
        """Draw in the run's thread? ``"inline"``; ``"auto"``: when the 1-minute load >= the CPUs."""
        if self.mode != "auto":
            return self.mode == "inline"
        now = time.monotonic()
        if now - self._load_checked > 5.0:
            self._load_checked = now
            try:
                self._loaded = os.getloadavg()[0] >= (os.cpu_count() or 1)
            except OSError:
                self._loaded = False
        return self._loaded

    def between_steps(self) -> None:
        """In the run's thread after new data: draw inline within the budget, or wake the thread."""
        if not self.inline():
            self.request()
            return
        now = time.monotonic()
        share = self.max_draw_share / 2
        if now - self._inline_last < pace(self.draw_interval, self._inline_cost, share):
            return
        self._inline_last = now
        c0 = time.thread_time()
        self._safe_draw()
        took = time.thread_time() - c0
        self._inline_cost = took if self._inline_cost == 0.0 else 0.7 * self._inline_cost + 0.3 * took

    def request(self) -> None:
        """Ask the drawing thread for a redraw (it draws at most every ``draw_interval``)."""
        if self.closed:
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="mtlab-dashboard-painter", daemon=True)
            self._thread.start()
        self._dirty.set()

    def _loop(self) -> None:
        last, cost = 0.0, 0.0  # cost: recent CPU seconds per draw (moving average)
        while not self.closed:
            if not self._dirty.wait(5.0):
                return  # idle: the thread ends; the next request starts a new one
            wait = pace(self.draw_interval, cost, self.max_draw_share) - (time.monotonic() - last)
            if wait > 0:
                time.sleep(wait)
            last, c0 = time.monotonic(), time.thread_time()
            with self._lock:  # cleared under the lock: idle() then waits for this very draw
                self._dirty.clear()
                self._safe_draw()
            took = time.thread_time() - c0
            cost = took if cost == 0.0 else 0.7 * cost + 0.3 * took

    def flush(self) -> None:
        """Draw now in the calling thread if a redraw is pending (after a run: no waiting for the thread)."""
        with self._lock:
            if self._dirty.is_set() and not self.closed:
                self._dirty.clear()
                self._safe_draw()

    def idle(self, timeout: float = 5.0) -> None:
        """Wait until a requested redraw has happened (scripts and tests read the image next)."""
        end = time.monotonic() + timeout
        while self._dirty.is_set() and time.monotonic() < end and self._thread is not None \
                and self._thread.is_alive():
            time.sleep(0.02)
        with self._lock:
            pass

    def close(self) -> None:
        self.closed = True
        self._dirty.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0)  # a draw in flight at interpreter exit would abort the process
