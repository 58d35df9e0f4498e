"""A live dashboard for a ``Trainer``: weight/lr/clip sliders, stepwise buttons, a background run,
each task's state, live plots, a progress bar, a validation table, snapshots and exports.

Threads: widget callbacks run on the kernel's main thread; a run (``mtlab.ui.runs.Run``) trains in
one background thread through the training loop and, between steps, hands this dashboard a cheap
snapshot (new history rows, the state table) every ``refresh_s``; a separate painter thread draws
the plot from the latest snapshot at most every ``draw_interval`` (0.7 s), so the plot is at most
about a second behind; when draws get slow (a loaded machine) it spaces them so that drawing takes
at most ``max_draw_share`` (10%) of the wall time, and training keeps its speed
(``bench/ui_overhead.py``). Sliders call
``trainer.set_weight`` & co. at once (read at the next minibatch); turning clipping on/off,
snapshot and restore during a run wait for the end of the current step. Stepwise buttons are
refused while a run is going (pause it first). A run belongs to the trainer, not to one
dashboard: a dashboard built while a run goes adopts it, and any of them stops it.
"""

from __future__ import annotations

import base64
import html
import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from ..core import combine, weighting
from ..training.debug import next_call
from ..core.trainer import Trainer
from .plots import LIVE_POINTS, LivePlot, figure_png, figure_svg, panel_of, plot_history, validation_series
from .runs import Run, current_run
from .texts import (BUSY, REASONS, STEPWISE, TOOLTIPS, clock, counter_html, events_html, run_refusal, skipped_tasks,
                    state_table_html, validation_html)


class Dashboard(widgets.VBox):
    """The dashboard widget; build it with ``mtlab.ui.dashboard(trainer)``.

    Parts kept as attributes for scripting and tests: ``sliders`` ("a" task weight, "a/clean"
    linked-set weight), ``lr_slider``, ``clip_slider``, ``clip_toggle``, ``buttons`` (by name),
    ``task_dropdown``, ``set_dropdown``, ``steps_box``, ``snapshot_dropdown``, ``status``,
    ``counter``, ``progress``, ``progress_label``, ``table``, ``validation_table``, ``image``,
    ``plot_label``, ``scale_toggle``, ``smoothing_slider``, ``event_log``, ``error_box``,
    ``export_links``. ``run`` is the trainer's run shown here (None when none).
    """

    def __init__(self, trainer: Trainer, refresh_s: float = 0.25, draw_interval: float = 0.7,
                 max_draw_share: float = 0.1, max_points: int = LIVE_POINTS, plots: bool = True,
                 keep_snapshots: int = 5, painter: str = "thread",
                 export_dir: str | Path = "mtlab_export") -> None:
        self.trainer = trainer
        self.refresh_s = float(refresh_s)  # counter/table/progress at most this often during a run
        self.draw_interval = float(draw_interval)  # the painter draws at most this often
        self.max_draw_share = float(max_draw_share)  # and spends at most this share of the wall time drawing
        if painter not in ("auto", "thread", "inline"):
            raise ValueError(f"painter must be 'auto', 'thread' or 'inline', got {painter!r}")
        self.painter = painter  # where the plot is drawn during a run (see _inline)
        self._load_checked = -1e9
        self._loaded = False
        self._inline_last = 0.0
        self._inline_cost = 0.0
        self.keep_snapshots = keep_snapshots
        self.export_dir = Path(export_dir)
        self.snapshots: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.validation: list[dict[str, Any]] = []  # evaluate events and the loop's validation records
        self.records: list[dict[str, Any]] = []  # the loop's validation records (the validation table)
        self.events: list[tuple[int, str]] = []  # (step, what changed): the event log and plot markers
        self.run: Run | None = None
        self.schedule: Any = None  # the experiment's schedule, when built from an experiment
        self.status_text = ""
        self._data_step = trainer.step_count
        self.redraws = 0  # plot redraws done, and the seconds they took (see bench/ui_overhead.py)
        self.redraw_seconds = 0.0
        self.redraw_cpu = 0.0  # CPU seconds of those redraws (thread time: independent of the machine's load)
        self.collect_cpu = 0.0  # CPU seconds spent collecting rows and texts (in the run's thread during a run)
        self.drawn_step: int | None = None  # the step the plot shows
        self._series: dict[str, tuple[list[float], list[float]]] = {}
        self._ghost: dict[str, tuple[list[float], list[float]]] = {}
        self._seen = 0
        self._reload: int | None = None  # a restore to this step happened: rebuild the series
        self._syncing = False
        self._last_collect = 0.0
        self._data_lock = threading.Lock()
        self._draw_lock = threading.Lock()
        self._dirty = threading.Event()
        self._closed = False
        self._painter: threading.Thread | None = None
        self._skipped_seen: dict[str, str] = {}
        self._live = LivePlot(list(trainer.tasks), max_points=max_points) if plots else None

        self._build_controls()
        self._callback = self._on_event
        trainer.add_callback(self._callback)
        self._run_listener = self._on_run
        adopted = current_run(trainer)
        if adopted is not None:
            self._attach(adopted)
            self._say(f"this dashboard shows the run already in progress (step {trainer.step_count}); "
                      "pause and stop work here")
        else:
            self._say("ready: " + next_call(trainer))
        self.refresh()
        self._built = True

    # ------------------------------------------------------------------ building
    def _build_controls(self) -> None:
        trainer = self.trainer
        keys = [*trainer.weights()]
        width = f"{min(max(len(k) for k in keys) * 7 + 24, 190)}px"
        self.sliders: dict[str, widgets.FloatSlider] = {}
        rows: list[widgets.Widget] = []
        for tname, t in trainer.tasks.items():
            self.sliders[tname] = self._weight_slider(f"task {tname}", t.weight, width,
                                                      f"set_task_weight({tname!r}, w): task {tname!r}'s weight in the "
                                                      "combined update; 0 leaves the task out of step()")
            self.sliders[tname].observe(lambda ch, tn=tname: self._set_task_weight(tn, ch["new"]), "value")
            rows.append(self.sliders[tname])
            for sname, ls in t.linkedsets.items():
                key = f"{tname}/{sname}"
                self.sliders[key] = self._weight_slider(f"  {key}", ls.weight, width,
                                                        f"set_weight({tname!r}, {sname!r}, w): weight of this linked "
                                                        "set's loss and norm, from the next minibatch on; "
                                                        "0 leaves it out")
                self.sliders[key].observe(lambda ch, tn=tname, sn=sname: self._set_weight(tn, sn, ch["new"]), "value")
                rows.append(self.sliders[key])
        style = {"description_width": width}
        lr = trainer.lr
        self.lr_slider = widgets.FloatLogSlider(value=lr, base=10, min=math.log10(lr) - 3, max=math.log10(lr) + 2,
                                                step=0.05, description="lr", readout_format=".2e",
                                                continuous_update=False, style=style,
                                                layout=widgets.Layout(width="340px"),
                                                tooltip="trainer.lr: learning rate of the next apply(); a run's "
                                                        "schedule sets it again at each step (lr decay)")
        self.lr_slider.observe(lambda ch: self._set_lr(ch["new"]), "value")
        clip = trainer.clip_grad_value
        c0 = clip if clip is not None else 1.0
        self.clip_toggle = widgets.Checkbox(value=clip is not None, description="clip", indent=False,
                                            layout=widgets.Layout(width="60px", flex="0 0 auto"),
                                            tooltip="clipping on/off (trainer.clip_grad_value = value or None); "
                                                    "during a run it changes at the end of the current step")
        self.clip_slider = widgets.FloatLogSlider(value=c0, base=10, min=math.log10(c0) - 3, max=math.log10(c0) + 2,
                                                  step=0.05, description="clip value", readout_format=".3g",
                                                  continuous_update=False, disabled=clip is None,
                                                  style={"description_width": "70px"},
                                                  layout=widgets.Layout(width="280px"),
                                                  tooltip="trainer.clip_grad_value: clip() clamps every gradient "
                                                          "element to ± this value. Needs: clip ticked")
        self.clip_toggle.observe(lambda ch: self._set_clip(), "value")
        self.clip_slider.observe(lambda ch: self._set_clip(), "value")
        rows += [self.lr_slider, widgets.HBox([self.clip_toggle, self.clip_slider])]
        methods = ["sum", *combine.AGGREGATORS, *weighting.WEIGHTINGS]
        current = getattr(trainer.update, "method", None) or "sum"
        self.combine_dropdown = widgets.Dropdown(
            options=methods if current in methods else [*methods, str(current)], value=str(current),
            description="combine", disabled=trainer.acc_steps, style={"description_width": "60px"},
            layout=widgets.Layout(width="220px"),
            tooltip="trainer.set_combine(): how the tasks' processed gradients become one direction, from the "
                    "next apply() (aggregators and FAMO need pip install \"mtlab[mtl]\"); during a run it changes "
                    "at the end of the current step")
        self.combine_dropdown.observe(lambda ch: self._set_combine(ch["new"]), "value")
        rows.append(self.combine_dropdown)

        tasks = list(trainer.tasks)
        self.task_dropdown = widgets.Dropdown(options=tasks, value=tasks[0], description="task",
                                              layout=widgets.Layout(width="160px", flex="0 0 auto"),
                                              style={"description_width": "35px"},
                                              tooltip="the task 'process minibatch' works on")
        self.set_dropdown = widgets.Dropdown(options=list(trainer.tasks[tasks[0]].linkedsets), description="set",
                                             layout=widgets.Layout(width="160px", flex="0 0 auto"),
                                             style={"description_width": "35px"},
                                             tooltip="the linked set 'process minibatch' draws from")
        self.task_dropdown.observe(self._on_task_choice, "value")
        self.steps_box = widgets.BoundedIntText(value=0, min=0, max=10**9, description="steps",
                                                tooltip="steps per run; 0 = until stopped or the schedule ends",
                                                layout=widgets.Layout(width="150px", flex="0 0 auto"),
                                                style={"description_width": "40px"})
        self.buttons: dict[str, widgets.Button] = {}
        actions: dict[str, tuple[str, Callable[[], Any]]] = {
            "minibatch": ("process minibatch", self._do_minibatch),
            "normalize": ("normalize", lambda: self.trainer.normalize()),
            "clip": ("clip", lambda: self.trainer.clip()),
            "apply": ("apply", lambda: self.trainer.apply()),
            "step": ("step", self._do_step),
            "reset": ("reset", lambda: self.trainer.reset()),
            "run": ("run", self._click_run),
            "pause": ("pause", self._click_pause),
            "stop": ("stop", self._click_stop),
            "snapshot": ("snapshot", self._click_snapshot),
            "restore": ("restore", self._click_restore),
            "export_png": ("PNG", lambda: self.export("png")),
            "export_svg": ("SVG", lambda: self.export("svg")),
            "export_csv": ("history CSV", lambda: self.export("csv")),
            "clear_error": ("clear", self.clear_error),
        }
        for name, (label, fn) in actions.items():
            b = widgets.Button(description=label, tooltip=TOOLTIPS[name],
                               layout=widgets.Layout(width="auto", flex="0 0 auto", min_width="64px"),
                               button_style="primary" if name in ("step", "run") else "")
            b.on_click(lambda _b, n=name, f=fn: self._on_button(n, f))
            self.buttons[name] = b
        B = self.buttons
        self.snapshot_dropdown = widgets.Dropdown(options=[], description="snapshot",
                                                  layout=widgets.Layout(width="260px", flex="0 0 auto"),
                                                  style={"description_width": "60px"},
                                                  tooltip="which snapshot restore goes back to")
        wrap = widgets.Layout(flex_flow="row wrap", align_items="center")
        buttons = widgets.VBox([
            widgets.HBox([self.task_dropdown, self.set_dropdown, B["minibatch"]], layout=wrap),
            widgets.HBox([B["normalize"], B["clip"], B["apply"], B["step"], B["reset"]], layout=wrap),
            widgets.HBox([self.steps_box, B["run"], B["pause"], B["stop"]], layout=wrap),
            widgets.HBox([B["snapshot"], self.snapshot_dropdown, B["restore"]], layout=wrap),
        ], layout=widgets.Layout(flex="1 1 420px"))
        self.counter = widgets.HTML()
        self.status = widgets.HTML()
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="300px"),
                                            bar_style="info")
        self.progress_label = widgets.HTML()
        self.progress_box = widgets.HBox([self.progress, self.progress_label],
                                         layout=widgets.Layout(display="none", align_items="center"))
        self.table = widgets.HTML()
        self.validation_table = widgets.HTML()
        self.image = widgets.Image(format="png", layout=widgets.Layout(width="100%", max_width="1100px"))
        self.plot_label = widgets.HTML()
        self.scale_toggle = widgets.ToggleButtons(options=["linear", "log"], value="linear", description="loss axis",
                                                  style={"button_width": "60px", "description_width": "70px"},
                                                  tooltips=["linear loss axis", "logarithmic loss axis"],
                                                  tooltip="scale of the loss panel")
        self.scale_toggle.observe(self._on_plot_option, "value")
        self.smoothing_slider = widgets.FloatSlider(value=0.0, min=0.0, max=0.98, step=0.02, description="smoothing",
                                                    continuous_update=False, readout_format=".2f",
                                                    style={"description_width": "75px"},
                                                    layout=widgets.Layout(width="300px", flex="0 0 auto"),
                                                    tooltip="exponential moving average of the loss curves "
                                                            "(0: raw); the raw curve stays faint behind")
        self.smoothing_slider.observe(self._on_plot_option, "value")
        self.event_log = widgets.HTML()
        self.export_links = widgets.HTML()
        self.error_box = widgets.HTML()
        controls = widgets.HBox([widgets.VBox(rows, layout=widgets.Layout(flex="0 0 auto")), buttons],
                                layout=widgets.Layout(flex_flow="row wrap"))
        plot_options = widgets.HBox([self.plot_label, self.scale_toggle, self.smoothing_slider, B["export_png"],
                                     B["export_svg"], B["export_csv"], self.export_links], layout=wrap)
        parts: list[widgets.Widget] = [self.counter, self.progress_box, self.status,
                                       widgets.HBox([self.error_box, B["clear_error"]], layout=wrap), controls,
                                       self.table, self.validation_table]
        if self._live is not None:
            parts += [plot_options, self.image, self.event_log]
        else:
            parts += [widgets.HBox([B["export_csv"], self.export_links], layout=wrap), self.event_log]
        B["clear_error"].layout.display = "none"
        super().__init__(parts)

    @staticmethod
    def _weight_slider(label: str, value: float, width: str, tip: str) -> widgets.FloatSlider:
        return widgets.FloatSlider(value=value, min=0.0, max=max(2.0, 2 * value), step=0.01, description=label,
                                   readout_format=".2f", continuous_update=False, tooltip=tip,
                                   style={"description_width": width}, layout=widgets.Layout(width="340px"))

    # ------------------------------------------------------------------ sliders
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

    def _set_lr(self, value: float) -> None:
        def set_it() -> None:
            self.trainer.lr = value
            self._event(f"lr -> {value:.3g}")
        self._guard(set_it)

    def _set_clip(self) -> None:
        self.clip_slider.disabled = not self.clip_toggle.value
        value = self.clip_slider.value if self.clip_toggle.value else None

        def set_it() -> None:
            self.trainer.clip_grad_value = value
            self._event("clip off" if value is None else f"clip value -> {value:.3g}")
        # Switching clipping on/off inside a step would leave it half-clipped: wait for the step's end.
        self._guard(lambda: self._between_steps("clip setting", set_it))

    def _set_combine(self, method: str) -> None:
        def set_it() -> None:
            self.trainer.set_combine(method)
            self._event(f"combine -> {method}")
        self._guard(lambda: self._between_steps("combine method", set_it))

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
            method = getattr(self.trainer.update, "method", None) or "sum"
            if isinstance(method, str) and method in self.combine_dropdown.options:
                self.combine_dropdown.value = method
        finally:
            self._syncing = False

    # ------------------------------------------------------------------ events from the trainer and the loop
    def _event(self, text: str) -> None:
        with self._data_lock:
            self.events.append((self.trainer.step_count, text))

    def _on_event(self, event: str, info: dict[str, Any]) -> None:
        if event == "evaluate":
            self.validation.append({k: info[k] for k in ("step", "task", "linkedset", "loss")})
        elif event == "validation":
            record = dict(info.get("record") or {})
            record.setdefault("step", info.get("step"))
            self.records.append(record)
            self.validation.append(record)
        elif event in ("weight", "task_weight"):
            what = f"{info['task']}/{info['linkedset']}" if event == "weight" else f"task {info['task']}"
            self._event(f"{what} weight -> {info['weight']:.3g}")
            skipped = skipped_tasks(self.trainer)
            for name, why in skipped.items():
                if self._skipped_seen.get(name) != why:
                    self._event(f"task {name} skipped by step(): {why}")
            for name in set(self._skipped_seen) - set(skipped):
                self._event(f"task {name} trains again")
            self._skipped_seen = skipped
            if threading.current_thread() is threading.main_thread():
                self._sync_sliders()
        elif event == "restore":
            self._reload = int(info.get("step", self.trainer.step_count))
            self._event(f"restored step {self._reload}")
            if threading.current_thread() is threading.main_thread():
                self._sync_sliders()

    @property
    def live(self) -> LivePlot | None:
        """The live figure (None with ``plots=False``)."""
        return self._live

    # ------------------------------------------------------------------ buttons
    @property
    def running(self) -> bool:
        """A run of this trainer is in progress (possibly paused)."""
        run = self._current()
        return run is not None and run.alive and run.state != "stopping"

    @property
    def paused(self) -> bool:
        run = self._current()
        return run is not None and run.state == "paused"

    def _current(self) -> Run | None:
        """The trainer's run: the one attached here, or one started elsewhere (adopted now)."""
        run = current_run(self.trainer)
        if run is not None and run is not self.run:
            self._attach(run)
        return run if run is not None else (self.run if self.run is not None and self.run.alive else None)

    def _on_task_choice(self, change: dict[str, Any]) -> None:
        self.set_dropdown.options = list(self.trainer.tasks[change["new"]].linkedsets)

    def _do_minibatch(self) -> str:
        task = self.task_dropdown.value
        self.trainer.process_minibatch(task, self.set_dropdown.value)
        n = self.trainer.state(task).minibatches
        return (f"minibatch: done ({task!r} has {n} minibatch(es) accumulated; the step button will finish this "
                f"accumulation: normalize, clip, apply). next: {next_call(self.trainer)}")

    def _do_step(self) -> str:
        """step(), or, when minibatches were processed by hand, finish that accumulation (step()
        would start a fresh one and drop them)."""
        tr = self.trainer
        busy = {n: (p, tr.state(n).minibatches) for n, p in tr.phase().items() if p in BUSY}
        if not busy:
            tr.step()
            skipped = skipped_tasks(tr)
            extra = "; skipped " + ", ".join(f"{n} ({r})" for n, r in skipped.items()) if skipped else ""
            return f"step: done (a whole cycle, step {tr.step_count}){extra}"
        calls = []
        for call in tr.chain.calls():  # the trainer's own chain (normalize, clip by value / norm), in order
            if any(nxt == call for name, nxt in tr.next_calls().items() if name in busy):
                getattr(tr, call)()
                calls.append(call)
        tr.apply()
        calls.append("apply")
        parts = ", ".join(f"{n}: {k} minibatch(es)" for n, (_, k) in busy.items())
        return (f"step: finished the accumulation started by hand ({parts}) with {', '.join(calls)} "
                f"instead of a fresh step(), which would have discarded it; now step {tr.step_count}")

    def _on_button(self, name: str, fn: Callable[[], Any]) -> None:
        if name in STEPWISE and self.running and not self.paused:
            self._say(f"{name}: refused while a run is going; pause (or stop) the run first", error=True)
            return
        try:
            message = fn()
        except Exception as exc:
            self._say(f"{name}: {type(exc).__name__}: {exc}", error=True)
        else:
            if isinstance(message, str):
                self._say(message)
            elif name in STEPWISE:
                self._say(f"{name}: done. next: {next_call(self.trainer)}")
        if not (self.running and not self.paused):
            self.refresh()

    def _click_run(self) -> None:
        self.start(self.steps_box.value)

    def _click_pause(self) -> None:
        run = self._current()
        if run is None:
            self._say("pause: no run in progress", error=True)
        elif run.state in ("paused", "pausing"):
            self.resume()
        else:
            self.pause()

    def _click_stop(self) -> None:
        if not self.stop(wait=False):
            self._say("stop: no run in progress (nothing to stop)")

    def _click_snapshot(self) -> None:
        def take() -> None:
            snap = self.trainer.snapshot()
            self.snapshots.append(snap)
            del self.snapshots[:-self.keep_snapshots]
            self._update_snapshot_choices()
            self._say(f"snapshot taken at step {snap['step']} ({len(self.snapshots)} kept)")
        self._between_steps("snapshot", take)

    def _update_snapshot_choices(self) -> None:
        options = [(f"#{i + 1}: step {s['step']}", i) for i, s in enumerate(self.snapshots)]
        self.snapshot_dropdown.options = options
        if options:
            self.snapshot_dropdown.value = options[-1][1]

    def _click_restore(self) -> None:
        if not self.snapshots:
            self._say("restore: no snapshot yet; click snapshot first", error=True)
            return
        index = self.snapshot_dropdown.value if self.snapshot_dropdown.value is not None else len(self.snapshots) - 1
        snap = self.snapshots[index]

        def back() -> None:
            self.trainer.restore(snap)
            self._say(f"restored snapshot #{index + 1} (step {snap['step']}); "
                      "the abandoned branch stays grey on the plot")
        self._between_steps("restore", back)

    def _between_steps(self, what: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` now, or, during an active run, in the training thread before its next step."""
        run = self._current()
        if run is not None and run.alive and run.state != "paused":
            run.submit(what, fn)
            self._say(f"{what}: will happen at the end of the current step")
        else:
            fn()

    # ------------------------------------------------------------------ the background run
    def start(self, steps: int = 0, schedule: Any = None) -> bool:
        """Train in a background thread through the training loop (``steps=0``: until stopped or
        the schedule ends). Returns False (and says why in the status line) when refused."""
        run = self._current()
        if run is not None and run.alive:
            where = "this dashboard" if run is self.run else "another dashboard"
            self._say(f"run refused: a run of this trainer is already in progress (step {self.trainer.step_count}); "
                      f"stop it first (stop works from {where} too)", error=True)
            return False
        schedule = schedule if schedule is not None else self.schedule
        why = run_refusal(self.trainer, schedule)
        if why is not None:
            self._say(f"run refused: {why}", error=True)
            return False
        run = Run(self.trainer, steps=int(steps), schedule=schedule)
        self._attach(run)
        self.error = None
        try:
            run.start()
        except RuntimeError as exc:
            self._say(f"run refused: {exc}", error=True)
            return False
        self._show_progress(run)
        self._say("running" + (f" {steps} steps" if steps else " until stopped"))
        return True

    def _attach(self, run: Run) -> None:
        if self.run is not None and self.run is not run:
            self.run.unlisten(self._run_listener)
        self.run = run
        run.listen(self._run_listener)
        self.buttons["pause"].description = "resume" if run.state in ("paused", "pausing") else "pause"

    def pause(self) -> None:
        """Pause after the current step (stepwise buttons work while paused)."""
        run = self._current()
        if run is None:
            self._say("pause: no run in progress", error=True)
            return
        run.pause()
        self.buttons["pause"].description = "resume"

    def resume(self) -> None:
        run = self._current()
        if run is not None:
            run.resume()
        self.buttons["pause"].description = "pause"

    def stop(self, wait: bool = True, timeout: float | None = 30.0) -> bool:
        """Stop the trainer's run after the current step (whoever started it); with ``wait``, block
        until it has ended. False when no run was going."""
        run = self._current()
        if run is None:
            return False
        run.stop("stop", wait=wait, timeout=timeout)
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run ends (for scripts and tests); Kernel -> Interrupt here stops it."""
        run = self._current() or self.run
        if run is not None:
            run.wait(timeout)
        self._painter_idle(timeout=5.0)

    def _on_run(self, run: Run, what: str) -> None:
        """Told by the run: ``between`` (its thread, between steps), ``state``, ``end``, ``command-error:...``."""
        if self._closed:
            run.unlisten(self._run_listener)
            return
        if what == "between":
            if time.monotonic() - self._last_collect >= self.refresh_s:
                self._collect()
                if run.newest(self._run_listener):  # an older dashboard of the same run keeps its texts only
                    if self._inline():
                        self._draw_inline()
                    else:
                        self._request_draw()
        elif what == "state":
            messages = {"pausing": "pausing after the current step...",
                        "paused": f"paused at step {self.trainer.step_count}; stepwise buttons work while paused",
                        "running": "running", "stopping": "stopping after the current step..."}
            self.buttons["pause"].description = "resume" if run.state in ("paused", "pausing") else "pause"
            if run.state in messages:
                self._say(messages[run.state])
            if run.state == "paused":
                self._collect()
                self._draw_or_request()
        elif what.startswith("command-error:"):
            self._say(what[len("command-error:"):], error=True)
        elif what.startswith("note:"):
            self._say(what[len("note:"):])
        elif what == "end":
            self.buttons["pause"].description = "pause"
            why = REASONS.get(str(run.reason), str(run.reason))
            message = f"run ended after {run.steps_done} step(s) (now at step {self.trainer.step_count}): {why}"
            if run.error is not None:
                self.error = run.error
                message = (f"error in the training thread at step {self.trainer.step_count}, run stopped: "
                           f"{type(run.error).__name__}: {run.error}")
                self._show_error(run.error)
            try:
                self._collect()
                self._draw_or_request()
            except Exception as exc:  # never lose the run's own message to a drawing problem
                message += f" (refresh failed: {type(exc).__name__}: {exc})"
            self._say(message, error=run.error is not None)

    # ------------------------------------------------------------------ errors and exports
    def _show_error(self, exc: BaseException) -> None:
        """One collapsible traceback (the latest), never a growing pile."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.error_box.value = (f"<details><summary style='color:#b00020;cursor:pointer'>error details: "
                                f"{html.escape(type(exc).__name__)} (click to expand)</summary>"
                                f"<pre style='font-size:11px;max-height:300px;overflow:auto'>{html.escape(tb)}</pre>"
                                "</details>")
        self.buttons["clear_error"].layout.display = ""

    def clear_error(self) -> str:
        self.error_box.value = ""
        self.buttons["clear_error"].layout.display = "none"
        return "error details cleared"

    def figure(self) -> Any:
        """A fresh Figure of the whole history (the three panels, validation, grey abandoned branch)."""
        return plot_history(self.trainer.history, validation=self.validation, scale=self.scale_toggle.value,
                            smoothing=self.smoothing_slider.value, ghost=self._ghost or None)

    def export(self, kind: str) -> str:
        """Write the figure (``png``/``svg``) or the history (``csv``) into ``export_dir``; a
        download link appears next to the buttons. Returns the status message."""
        if kind not in ("png", "svg", "csv"):
            raise ValueError(f"export kind must be 'png', 'svg' or 'csv', got {kind!r}")
        self.export_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        if kind == "csv":
            data = self.trainer.history.to_csv(index=False).encode()
            name, mime = f"history-step{self.trainer.step_count}-{stamp}.csv", "text/csv"
        else:
            fig = self.figure()
            data = figure_png(fig) if kind == "png" else figure_svg(fig)
            name, mime = f"plot-step{self.trainer.step_count}-{stamp}.{kind}", (
                "image/png" if kind == "png" else "image/svg+xml")
        path = self.export_dir / name
        path.write_bytes(data)
        link = (f"<a download='{html.escape(name)}' href='data:{mime};base64,{base64.b64encode(data).decode()}'>"
                f"download {html.escape(name)}</a>")
        self.export_links.value = link
        return f"exported {kind.upper()} to {path}"

    # ------------------------------------------------------------------ reading and drawing
    def _on_plot_option(self, change: dict[str, Any]) -> None:
        if self._live is None:
            return
        self._live.set_scale(self.scale_toggle.value)
        self._live.smoothing = float(self.smoothing_slider.value)
        if not (self.running and not self.paused):
            self.refresh()

    def refresh(self, plot: bool = True) -> None:
        """Read new history rows and the tasks' state; update the texts and (``plot``) draw now.
        Call it when no step is in flight (no run, or a paused one)."""
        self._collect()
        if plot:
            self._draw()

    def _collect(self) -> None:
        """New history rows, the state table, counter and progress (between steps: a consistent view)."""
        c0 = time.thread_time()
        tr = self.trainer
        rows = tr.log.rows()
        with self._data_lock:
            if self._reload is not None or len(rows) < self._seen:
                back = self._reload if self._reload is not None else (rows[-1]["step"] if rows else 0)
                # The abandoned branch: what was drawn after the step gone back to, kept grey.
                ghost = {k: ([x for x in xs if x > back], [y for x, y in zip(xs, ys) if x > back])
                         for k, (xs, ys) in self._series.items()}
                self._ghost = {k: v for k, v in ghost.items() if v[0]}
                self._series = {}
                self._seen = 0
                self._reload = None
                self.validation = [v for v in self.validation if v["step"] <= tr.step_count]
                self.records = [r for r in self.records if r["step"] <= tr.step_count]
            new = rows[self._seen:]
            self._seen = len(rows)
            for row in new:
                step = row.get("step")
                for key, value in row.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) \
                            and panel_of(key) is not None and math.isfinite(value):
                        xs, ys = self._series.setdefault(key, ([], []))
                        xs.append(step)
                        ys.append(value)
            self._data_step = tr.step_count
        if self.lr_slider.value != tr.lr and not self._syncing:  # a schedule moves the lr during a run
            self._syncing = True
            try:
                self.lr_slider.value = tr.lr
            finally:
                self._syncing = False
        self.table.value = state_table_html(tr)
        self.counter.value = counter_html(tr, self.run)
        self.validation_table.value = validation_html(self.records)
        self.event_log.value = events_html(self.events)
        self._update_progress()
        self._last_collect = time.monotonic()
        self.collect_cpu += time.thread_time() - c0

    def _draw(self) -> None:
        """Draw the latest collected data (any thread; one draw at a time)."""
        if self._live is None:
            return
        with self._draw_lock:
            t0, c0 = time.monotonic(), time.thread_time()
            with self._data_lock:
                series = {k: (list(xs), list(ys)) for k, (xs, ys) in self._series.items()}
                ghost = dict(self._ghost)
                events = [(s, t) for s, t in self.events]
                step = self._data_step
                valid = validation_series(self.validation)
            self._live.update(series, valid, step=step, events=events, ghost=ghost)
            self.image.value = self._live.png()
            self.drawn_step = step
            self.plot_label.value = f"<span class='mtlab-asof'>plot as of step {step}</span>"
            self.redraws += 1
            self.redraw_seconds += time.monotonic() - t0
            self.redraw_cpu += time.thread_time() - c0

    def _inline(self) -> bool:
        """Draw in the run's own thread? ``painter="inline"``; ``"auto"``: when the machine is
        oversubscribed (1-minute load >= CPUs), where a drawing thread preempted while it holds the
        GIL stalls training; a draw between steps then costs exactly its own time."""
        if self.painter != "auto":
            return self.painter == "inline"
        now = time.monotonic()
        if now - self._load_checked > 5.0:
            self._load_checked = now
            try:
                self._loaded = os.getloadavg()[0] >= (os.cpu_count() or 1)
            except OSError:
                self._loaded = False
        return self._loaded

    def _draw_inline(self) -> None:
        """Between steps, in the run's thread: draw when ``draw_interval`` has passed and drawing has
        taken at most ``max_draw_share / 2`` of the time (a hard budget: it takes from training)."""
        now = time.monotonic()
        share = self.max_draw_share / 2
        interval = max(self.draw_interval, self._inline_cost / share if share > 0 else 0.0)
        if now - self._inline_last < interval:
            return
        self._inline_last = now
        try:
            self._draw()
        except Exception as exc:  # drawing must never take the run down
            self._say(f"plot: {type(exc).__name__}: {exc}", error=True)
        took = time.monotonic() - now
        self._inline_cost = took if self._inline_cost == 0.0 else 0.7 * self._inline_cost + 0.3 * took

    def _draw_or_request(self) -> None:
        """Draw now (inline painter) or ask the painter thread."""
        if self._inline():
            self._draw()
        else:
            self._request_draw()

    def _request_draw(self) -> None:
        """Ask the painter thread for a redraw (it draws at most every ``draw_interval``)."""
        if self._live is None or self._closed:
            return
        if self._painter is None or not self._painter.is_alive():
            self._painter = threading.Thread(target=self._paint_loop, name="mtlab-dashboard-painter", daemon=True)
            self._painter.start()
        self._dirty.set()

    def _paint_loop(self) -> None:
        """Draw when asked, at most every ``draw_interval``; when draws get slow (a loaded machine:
        the wall time of a draw far above its CPU time), space them so that drawing takes at most
        ``max_draw_share`` of the time: training keeps its speed, the plot lags a little more."""
        last = 0.0
        cost = 0.0  # recent wall seconds per draw (moving average)
        while not self._closed:
            if not self._dirty.wait(5.0):
                run = self.run
                if run is None or not run.alive:
                    return  # idle: the thread ends; the next request starts a new one
                continue
            interval = max(self.draw_interval, cost / self.max_draw_share if self.max_draw_share > 0 else 0.0)
            wait = interval - (time.monotonic() - last)
            if wait > 0:
                time.sleep(wait)
            self._dirty.clear()
            last = time.monotonic()
            try:
                self._draw()
            except Exception as exc:  # drawing must never take the run down
                self._say(f"plot: {type(exc).__name__}: {exc}", error=True)
            took = time.monotonic() - last
            cost = took if cost == 0.0 else 0.7 * cost + 0.3 * took

    def _painter_idle(self, timeout: float = 5.0) -> None:
        """Wait until a requested redraw has happened (scripts and tests read the image next)."""
        end = time.monotonic() + timeout
        while self._dirty.is_set() and time.monotonic() < end:
            time.sleep(0.02)
        with self._draw_lock:
            pass

    def _show_progress(self, run: Run) -> None:
        self.progress_box.layout.display = ""
        self._update_progress()

    def _update_progress(self) -> None:
        run = self.run
        if run is None:
            return
        total = run.steps
        schedule = run.schedule if run.schedule is not None else getattr(self.trainer, "schedule", None)
        if not total and schedule is not None and getattr(schedule, "num_steps", None):
            total = max(int(schedule.num_steps) - (self.trainer.step_count - run.steps_done), 0)
        done = run.steps_done
        rate = run.rate()
        self.progress.layout.visibility = "visible" if total else "hidden"
        if total:
            self.progress.max = max(total, 1)
            self.progress.value = min(done, total)
            eta = (total - done) / rate if rate > 0 and done else float("nan")
            text = f"{done}/{total} steps"
            text += f" &middot; ETA {clock(eta)}" if math.isfinite(eta) and run.alive else ""
        else:  # no end known: no bar (a full bar would claim the run is done)
            text = f"{done} steps (until stopped)"
        text += f" &middot; {rate:.2f} steps/s &middot; elapsed {clock(run.active_seconds())}"
        if run.state == "paused":
            text += " &middot; paused"
        elif run.state == "ended":
            text += f" &middot; ended ({html.escape(str(run.reason))})"
            self.progress.bar_style = "danger" if run.error is not None else "success"
        self.progress_label.value = text

    def _say(self, message: str, error: bool = False) -> None:
        color = "#b00020" if error else "#555"
        self.status_text = message
        self.status.value = f"<span style='color:{color}'>{html.escape(message)}</span>"

    # ------------------------------------------------------------------ teardown
    def close(self, stop: bool = True) -> None:
        """Stop the trainer's run (unless ``stop=False``: it goes on, other dashboards and
        ``mtlab.ui.stop_all()`` still reach it), detach from the trainer and close the widgets."""
        if not getattr(self, "_built", False):  # __init__ raised (bad argument): nothing to undo
            return
        if stop:
            self.stop(wait=True)
        self._closed = True
        self._dirty.set()
        painter = self._painter
        if painter is not None and painter is not threading.current_thread():
            painter.join(10.0)  # a draw in flight at interpreter exit would abort the process
        if self.run is not None:
            self.run.unlisten(self._run_listener)
        self.trainer.remove_callback(self._callback)
        for child in (*self.sliders.values(), self.lr_slider, self.clip_slider, self.clip_toggle, self.combine_dropdown,
                      *self.buttons.values(), self.task_dropdown, self.set_dropdown, self.steps_box,
                      self.snapshot_dropdown, self.counter, self.status, self.table, self.validation_table,
                      self.image, self.plot_label, self.scale_toggle, self.smoothing_slider, self.event_log,
                      self.export_links, self.error_box, self.progress, self.progress_label):
            child.close()
        super().close()


def dashboard(trainer: Any, schedule: Any = None, **kwargs: Any) -> Dashboard:
    """A live dashboard widget for a trainer (or an experiment from ``mtlab.from_recipe``); display it
    as a cell's last expression. A dashboard built while the trainer's run goes shows (adopts) that run.
    Its runs go through ``mtlab.run`` with ``schedule`` (default: the experiment's; none: the
    trainer's lr until stopped), so lr decay, validation and go_back happen as in a script.

    >>> d = mtlab.ui.dashboard(trainer)
    >>> d            # sliders, stepwise buttons, run/pause/stop, state table, live plots
    >>> d.start(100); d.wait()
    """
    if not isinstance(trainer, Trainer) and isinstance(getattr(trainer, "trainer", None), Trainer):
        schedule = schedule if schedule is not None else getattr(trainer, "schedule", None)
        trainer = trainer.trainer
    if not isinstance(trainer, Trainer):
        raise TypeError("dashboard() takes an mtlab.Trainer (or an experiment with .trainer), "
                        f"got {type(trainer).__name__}")
    d = Dashboard(trainer, **kwargs)
    d.schedule = schedule
    return d


__all__ = ["Dashboard", "dashboard", "run_refusal", "skipped_tasks"]
