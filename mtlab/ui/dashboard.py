"""A live dashboard for a ``Trainer``: weight/lr/clip sliders, stepwise buttons, a background run,
each task's state and live plots.

Threads: widget callbacks run on the kernel's main thread; a run trains with ``trainer.step()`` in
one background thread, which also refreshes the widgets between steps: the step counter and state
table every ``refresh_s`` (0.5 s), the plot by time as well but within a budget (at most
``max_draw_fraction`` of the run's time spent drawing, so training keeps >= ~98% of its speed).
Sliders call ``trainer.set_weight`` & co. at once (read at the next minibatch); turning clipping
on/off during a run waits for the end of the current step. Stepwise buttons are refused while a
run is going (pause it first). Errors in the thread are caught, shown in the status line, and
stop the run.
"""

from __future__ import annotations

import html
import math
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import torch

from ..debug import next_call
from ..trainer import Trainer
from .plots import LivePlot, panel_of

_RUNS_LOCK = threading.Lock()
_RUNS: dict[int, "Dashboard"] = {}  # id(trainer) -> the dashboard running it (one run per trainer)

STEPWISE = ("minibatch", "normalize", "clip", "apply", "step", "reset")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


class Dashboard(widgets.VBox):
    """The dashboard widget; build it with ``mtlab.ui.dashboard(trainer)``.

    Parts kept as attributes for scripting and tests: ``sliders`` ("a" task weight, "a/clean"
    linked-set weight), ``lr_slider``, ``clip_slider``, ``clip_toggle``, ``buttons`` (by name),
    ``task_dropdown``, ``set_dropdown``, ``steps_box``, ``status``, ``counter``, ``table``, ``image``.
    """

    def __init__(self, trainer: Trainer, refresh_s: float = 0.5, max_draw_fraction: float = 0.02,
                 max_points: int = 2000, plots: bool = True, keep_snapshots: int = 5) -> None:
        self.trainer = trainer
        self.refresh_s = float(refresh_s)  # at most one redraw per refresh_s seconds
        self.max_draw_fraction = float(max_draw_fraction)  # and at most this share of the run's time drawing
        self.keep_snapshots = keep_snapshots
        self.snapshots: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.validation: list[dict[str, Any]] = []
        self._series: dict[str, tuple[list[float], list[float]]] = {}
        self._seen = 0
        self._reload = False
        self._syncing = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._pending: list[tuple[str, Callable[[], Any]]] = []
        self._pending_lock = threading.Lock()
        self._draw_lock = threading.Lock()
        self._last_draw = 0.0
        self._last_text = 0.0
        self._draw_cost = 0.0
        self._run_steps = 0
        self._run_t0 = 0.0
        self._ending = False
        self.redraws = 0  # refreshes done, and the seconds they took (see bench/ui_overhead.py)
        self.redraw_seconds = 0.0
        self._live = LivePlot(max_points=max_points) if plots else None

        self.sliders: dict[str, widgets.FloatSlider] = {}
        rows: list[widgets.Widget] = []
        for tname, t in trainer.tasks.items():
            self.sliders[tname] = self._weight_slider(f"task {tname}", t.weight)
            self.sliders[tname].observe(lambda ch, tn=tname: self._set_task_weight(tn, ch["new"]), "value")
            rows.append(self.sliders[tname])
            for sname, ls in t.linkedsets.items():
                key = f"{tname}/{sname}"
                self.sliders[key] = self._weight_slider(f"  {key}", ls.weight)
                self.sliders[key].observe(lambda ch, tn=tname, sn=sname: self._set_weight(tn, sn, ch["new"]), "value")
                rows.append(self.sliders[key])
        lr = trainer.lr
        self.lr_slider = widgets.FloatLogSlider(value=lr, base=10, min=math.log10(lr) - 3, max=math.log10(lr) + 2,
                                                step=0.05, description="lr", readout_format=".2e",
                                                continuous_update=False)
        self.lr_slider.observe(lambda ch: self._guard(lambda: setattr(self.trainer, "lr", ch["new"])), "value")
        clip = trainer.clip_grad_value
        c0 = clip if clip is not None else 1.0
        self.clip_toggle = widgets.Checkbox(value=clip is not None, description="clip", indent=False,
                                            layout=widgets.Layout(width="60px"))
        self.clip_slider = widgets.FloatLogSlider(value=c0, base=10, min=math.log10(c0) - 3, max=math.log10(c0) + 2,
                                                  step=0.05, description="clip value", readout_format=".3g",
                                                  continuous_update=False, disabled=clip is None)
        self.clip_toggle.observe(lambda ch: self._set_clip(), "value")
        self.clip_slider.observe(lambda ch: self._set_clip(), "value")
        rows += [self.lr_slider, widgets.HBox([self.clip_toggle, self.clip_slider])]

        tasks = list(trainer.tasks)
        self.task_dropdown = widgets.Dropdown(options=tasks, value=tasks[0], description="task",
                                              layout=widgets.Layout(width="180px"))
        self.set_dropdown = widgets.Dropdown(options=list(trainer.tasks[tasks[0]].linkedsets), description="set",
                                             layout=widgets.Layout(width="180px"))
        self.task_dropdown.observe(self._on_task_choice, "value")
        self.steps_box = widgets.BoundedIntText(value=0, min=0, max=10**9, description="steps",
                                                tooltip="steps per run; 0 = until stopped",
                                                layout=widgets.Layout(width="150px"))
        self.buttons: dict[str, widgets.Button] = {}
        actions: dict[str, tuple[str, Callable[[], None]]] = {
            "minibatch": ("process minibatch", self._do_minibatch),
            "normalize": ("normalize", lambda: self.trainer.normalize()),
            "clip": ("clip", lambda: self.trainer.clip()),
            "apply": ("apply", lambda: self.trainer.apply()),
            "step": ("step", lambda: self.trainer.step()),
            "reset": ("reset", lambda: self.trainer.reset()),
            "run": ("run", self._click_run),
            "pause": ("pause", self._click_pause),
            "stop": ("stop", lambda: self.stop(wait=False)),
            "snapshot": ("snapshot", self._click_snapshot),
            "restore": ("restore", self._click_restore),
        }
        for name, (label, fn) in actions.items():
            b = widgets.Button(description=label, layout=widgets.Layout(width="auto"),
                               button_style="primary" if name in ("step", "run") else "")
            b.on_click(lambda _b, n=name, f=fn: self._on_button(n, f))
            self.buttons[name] = b
        B = self.buttons
        buttons = widgets.VBox([
            widgets.HBox([self.task_dropdown, self.set_dropdown, B["minibatch"]]),
            widgets.HBox([B["normalize"], B["clip"], B["apply"], B["step"], B["reset"]]),
            widgets.HBox([self.steps_box, B["run"], B["pause"], B["stop"]]),
            widgets.HBox([B["snapshot"], B["restore"]]),
        ])
        self.counter = widgets.HTML()
        self.status = widgets.HTML()
        self.table = widgets.HTML()
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.log_output = widgets.Output()  # tracebacks from the training thread (append_stdout only)
        controls = widgets.HBox([widgets.VBox(rows, layout=widgets.Layout(width="48%")), buttons])
        parts = [self.counter, self.status, controls, self.table] + ([self.image] if plots else []) + [self.log_output]
        super().__init__(parts)
        self._callback = self._on_event
        trainer.add_callback(self._callback)
        self._say("ready: " + next_call(trainer))
        self.refresh()

    # ------------------------------------------------------------------ sliders
    @staticmethod
    def _weight_slider(label: str, value: float) -> widgets.FloatSlider:
        return widgets.FloatSlider(value=value, min=0.0, max=max(2.0, 2 * value), step=0.01, description=label,
                                   readout_format=".2f", continuous_update=False,
                                   style={"description_width": "90px"})

    def _guard(self, fn: Callable[[], Any]) -> None:
        if self._syncing:
            return
        try:
            fn()
        except Exception as exc:  # a rejected value: say why, put the slider back
            self._say(f"{type(exc).__name__}: {exc}", error=True)
            self._sync_sliders()

    def _set_weight(self, task: str, linkedset: str, value: float) -> None:
        self._guard(lambda: self.trainer.set_weight(task, linkedset, value))

    def _set_task_weight(self, task: str, value: float) -> None:
        self._guard(lambda: self.trainer.set_task_weight(task, value))

    def _set_clip(self) -> None:
        self.clip_slider.disabled = not self.clip_toggle.value
        value = self.clip_slider.value if self.clip_toggle.value else None
        # Switching clipping on/off inside a step would leave it half-clipped: wait for the step's end.
        self._guard(lambda: self._between_steps("clip setting", lambda: setattr(self.trainer, "clip_grad_value", value)))

    def _sync_sliders(self) -> None:
        """Put every slider at the trainer's current value (after restore or a change from code)."""
        self._syncing = True
        try:
            for key, w in self.trainer.weights().items():
                s = self.sliders.get(key)
                if s is not None and s.value != w:
                    s.max = max(s.max, w)
                    s.value = w
            if self.lr_slider.value != self.trainer.lr:
                self.lr_slider.value = self.trainer.lr
            clip = self.trainer.clip_grad_value
            self.clip_toggle.value = clip is not None
            self.clip_slider.disabled = clip is None
            if clip is not None and self.clip_slider.value != clip:
                self.clip_slider.value = clip
        finally:
            self._syncing = False

    # ------------------------------------------------------------------ events from the trainer
    def _on_event(self, event: str, info: dict[str, Any]) -> None:
        if event == "evaluate":
            self.validation.append({k: info[k] for k in ("step", "task", "linkedset", "loss")})
        elif event in ("weight", "task_weight"):
            self._sync_sliders()
        elif event == "restore":
            self._reload = True
            self._sync_sliders()

    # ------------------------------------------------------------------ buttons
    @property
    def running(self) -> bool:
        """A run is in progress (possibly paused)."""
        return self._thread is not None and self._thread.is_alive() and not self._ending

    @property
    def paused(self) -> bool:
        return self.running and self._paused.is_set()

    def _on_task_choice(self, change: dict[str, Any]) -> None:
        self.set_dropdown.options = list(self.trainer.tasks[change["new"]].linkedsets)

    def _do_minibatch(self) -> None:
        self.trainer.process_minibatch(self.task_dropdown.value, self.set_dropdown.value)

    def _on_button(self, name: str, fn: Callable[[], None]) -> None:
        if name in STEPWISE and self.running and not self.paused:
            self._say(f"{name}: refused while a run is going; pause (or stop) the run first", error=True)
            return
        try:
            fn()
        except Exception as exc:
            self._say(f"{name}: {type(exc).__name__}: {exc}", error=True)
        else:
            if name in STEPWISE:
                self._say(f"{name}: done. next: {next_call(self.trainer)}")
        if not (self.running and not self.paused):
            self.refresh()

    def _click_run(self) -> None:
        self.start(self.steps_box.value)

    def _click_pause(self) -> None:
        if not self.running:
            self._say("pause: no run in progress", error=True)
        elif self.paused:
            self.resume()
        else:
            self.pause()

    def _click_snapshot(self) -> None:
        def take() -> None:
            self.snapshots.append(self.trainer.snapshot())
            del self.snapshots[:-self.keep_snapshots]
            self._say(f"snapshot taken at step {self.trainer.step_count} ({len(self.snapshots)} kept)")
        self._between_steps("snapshot", take)

    def _click_restore(self) -> None:
        if not self.snapshots:
            self._say("restore: no snapshot yet; click snapshot first", error=True)
            return
        snap = self.snapshots[-1]

        def back() -> None:
            self.trainer.restore(snap)
            self._say(f"restored the snapshot of step {snap['step']}")
        self._between_steps("restore", back)

    def _between_steps(self, what: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` now, or, during an active run, in the training thread before its next step."""
        if self.running and not self.paused:
            with self._pending_lock:
                self._pending.append((what, fn))
            self._say(f"{what}: will happen at the end of the current step")
        else:
            fn()

    # ------------------------------------------------------------------ the background run
    def start(self, steps: int = 0) -> bool:
        """Train with ``trainer.step()`` in a background thread (``steps=0``: until ``stop()``).
        Returns False (and says why in the status line) when a run is already going."""
        with _RUNS_LOCK:
            other = _RUNS.get(id(self.trainer))
            if other is not None and other.running:
                where = "this dashboard" if other is self else "another dashboard"
                self._say(f"run refused: a run is already in progress in {where} (step {self.trainer.step_count}); "
                          "stop it first", error=True)
                return False
            self._stop.clear()
            self._paused.clear()
            self._ending = False
            self.error = None
            self._run_steps = 0
            self._run_t0 = time.monotonic()
            self._thread = threading.Thread(target=self._run, args=(int(steps),), name="mtlab-dashboard-run", daemon=True)
            _RUNS[id(self.trainer)] = self
            self._thread.start()
        self.buttons["pause"].description = "pause"
        self._say("running" + (f" {steps} steps" if steps else " until stopped"))
        return True

    def pause(self) -> None:
        """Pause after the current step (stepwise buttons work while paused)."""
        self._paused.set()
        self.buttons["pause"].description = "resume"
        self._say("pausing after the current step; stepwise buttons work while paused")

    def resume(self) -> None:
        self._paused.clear()
        self.buttons["pause"].description = "pause"
        self._say("running")

    def stop(self, wait: bool = True, timeout: float | None = 30.0) -> None:
        """Stop the run after the current step; with ``wait``, block until the thread has ended."""
        self._stop.set()
        self._paused.clear()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run ends (for scripts and tests)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, steps: int) -> None:
        done_msg = ""
        try:
            while not self._stop.is_set() and (steps == 0 or self._run_steps < steps):
                self._run_pending()
                if self._paused.is_set():
                    self._stop.wait(0.05)
                    continue
                self.trainer.step()
                self._run_steps += 1
                self._after_step()
            self._run_pending()
            done_msg = f"run ended after {self._run_steps} step(s) (step {self.trainer.step_count})"
        except Exception as exc:
            self.error = exc
            done_msg = (f"error in the training thread at step {self.trainer.step_count}, run stopped: "
                        f"{type(exc).__name__}: {exc}")
            self.log_output.append_stdout(traceback.format_exc())
        finally:
            with _RUNS_LOCK:
                self._ending = True
                if _RUNS.get(id(self.trainer)) is self:
                    del _RUNS[id(self.trainer)]
            self.buttons["pause"].description = "pause"
            try:
                self.refresh()
            except Exception as exc:  # never lose the run's own message to a drawing problem
                done_msg += f" (refresh failed: {type(exc).__name__}: {exc})"
            self._say(done_msg, error=self.error is not None)

    def _run_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for what, fn in pending:
            try:
                fn()
            except Exception as exc:
                self._say(f"{what}: {type(exc).__name__}: {exc}", error=True)

    def _after_step(self) -> None:
        """Between steps, in the training thread: the counter and table every ``refresh_s``; the plot
        as well when its time budget allows (at most ``max_draw_fraction`` of the run spent drawing)."""
        now = time.monotonic()
        if now - self._last_text < self.refresh_s:
            return
        budget = self._draw_cost / self.max_draw_fraction if self.max_draw_fraction > 0 else 0.0
        self.refresh(plot=now - self._last_draw >= max(self.refresh_s, budget))

    # ------------------------------------------------------------------ reading and drawing
    def refresh(self, plot: bool = True) -> None:
        """Read new history rows and the tasks' state; update the counter, the table and (``plot``) the plot."""
        t0 = time.monotonic()
        with self.trainer.lock:  # a consistent view: no step is half-way through
            rows = self.trainer.log.rows()
            if self._reload or len(rows) < self._seen:
                self._series = {}
                self._seen = 0
                self._reload = False
                self.validation = [v for v in self.validation if v["step"] <= self.trainer.step_count]
            new = rows[self._seen:]
            self._seen = len(rows)
            table = self._table_html()
            counter = self._counter_html()
        for row in new:
            step = row.get("step")
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and panel_of(key) is not None \
                        and math.isfinite(value):
                    xs, ys = self._series.setdefault(key, ([], []))
                    xs.append(step)
                    ys.append(value)
        self.table.value = table
        self.counter.value = counter
        self._last_text = time.monotonic()
        if self._live is None or not plot:
            return
        with self._draw_lock:
            val: dict[str, tuple[list[float], list[float]]] = {}
            for v in list(self.validation):
                xs, ys = val.setdefault(f"{v['task']}/{v['linkedset']}", ([], []))
                xs.append(v["step"])
                ys.append(v["loss"])
            self._live.update(self._series, val)
            self.image.value = self._live.png()
        self._last_draw = time.monotonic()
        self._draw_cost = self._last_draw - t0
        self.redraws += 1
        self.redraw_seconds += self._draw_cost

    def _counter_html(self) -> str:
        tr = self.trainer
        phases = ", ".join(f"{n}: <i>{p}</i>" for n, p in tr.phase().items())
        run = ""
        if self.running:
            rate = self._run_steps / max(time.monotonic() - self._run_t0, 1e-9)
            run = f" &middot; {'paused' if self.paused else 'running'} ({rate:.2f} steps/s)"
        return f"<b>step {tr.step_count}</b> &middot; {phases}{run}"

    def _table_html(self) -> str:
        head = ("<tr><th>task</th><th>phase</th><th>minibatches</th><th>Σ w·loss</th><th>Σ w·norm</th>"
                "<th>loss/norm</th><th>grad norm per model</th><th>clipped</th><th>clip fraction</th></tr>")
        body = []
        for name in self.trainer.tasks:
            st = self.trainer.state(name)
            s = st.summary()
            body.append("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in (
                name, s["phase"], s["minibatches"], s["batch_loss"], s["batch_loss_norm"],
                s["normalized_loss"] if s["minibatches"] else None, self._model_norms(st),
                s["grad_norm_clipped"], s["clip_fraction"])) + "</tr>")
        style = "<style>.mtlab-state td,.mtlab-state th{padding:1px 8px;text-align:right;font-size:12px}</style>"
        return f"{style}<table class='mtlab-state'>{head}{''.join(body)}</table>"

    @staticmethod
    def _model_norms(st: Any) -> str:
        if st.param_norms:
            norms = st.model_grad_norms()
        else:
            per: dict[str, list[torch.Tensor]] = {}
            for name, g in st.grads.items():
                per.setdefault(name.split(".", 1)[0], []).append(torch.linalg.vector_norm(g.detach().float()))
            norms = {m: torch.linalg.vector_norm(torch.stack(v)) for m, v in per.items()}
        return ", ".join(f"{m} {float(v):.3g}" for m, v in norms.items())

    def _say(self, message: str, error: bool = False) -> None:
        color = "#b00020" if error else "#555"
        self.status.value = f"<span style='color:{color}'>{html.escape(message)}</span>"

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Stop any run, detach from the trainer and close the widgets."""
        self.stop(wait=True)
        self.trainer.remove_callback(self._callback)
        for child in (*self.sliders.values(), self.lr_slider, self.clip_slider, self.clip_toggle,
                      *self.buttons.values(), self.task_dropdown, self.set_dropdown, self.steps_box,
                      self.counter, self.status, self.table, self.image, self.log_output):
            child.close()
        super().close()


def dashboard(trainer: Trainer, **kwargs: Any) -> Dashboard:
    """A live dashboard widget for ``trainer`` (display it as a cell's last expression).

    >>> d = mtlab.ui.dashboard(trainer)
    >>> d            # sliders, stepwise buttons, run/pause/stop, state table, live plots
    >>> d.start(100); d.wait()
    """
    if not isinstance(trainer, Trainer):
        raise TypeError(f"dashboard() takes an mtlab.Trainer, got {type(trainer).__name__}")
    return Dashboard(trainer, **kwargs)
