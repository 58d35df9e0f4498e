"""The dashboard widget: a thin view of a ``Controller`` (``controller.py``). Every control calls one
controller command; after every change the controller hands over one ``DashState`` and ``render``
derives every text from it (counter, status, progress, table, event log, validation table), idle or
running, so the texts never contradict each other. The plot is drawn by a ``Painter`` from the
controller's ``SeriesStore``; zoom (a step range) and a read-out of every series at a chosen step
work on the same data.

One screen at 1280x800: the texts on top, the controls in tabs on the left, the plot on the right.
A dashboard built while the trainer's run goes adopts the run; a newer dashboard of the same trainer
(the cell re-run) replaces this one, which then detaches from the trainer and says so.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import os
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from ..core.trainer import Trainer
from ..training.schedule import Schedule
from .controller import Controller
from .controls import PLOT_WIDTH, Controls, KnobControl, NumberText, check_hide
from .follow import Follow
from .painter import Painter
from ..training.plotparts import figure_png, figure_svg
from ..training.plots import plot_history
from ..training.plotseries import panel_of
from ..training.plotstyle import DPI
from ..training.runplots import plot_runs
from .liveplot import LIVE_POINTS, LivePlot
from .state import DashState
from .texts import (
    counter_html,
    error_html,
    events_html,
    journal_html,
    progress_html,
    status_html,
    validation_html,
)

# Presentation mode's plot: laid out at PRESENT_WIDTH px (two columns of panels) with text PRESENT_FONT times
# the dashboard's (its smallest 16.7 px) and drawn PRESENT_RATIO times finer (900 px). The browser shows it as
# large as the room beside the sliders and the screen's height allow, at most 900 CSS px: at 1280x800 about
# 820 px wide (text 23 px), at 150 % about 430 CSS px (text 12 px or more).
PRESENT_WIDTH, PRESENT_FONT, PRESENT_RATIO = 600, 1.6, 1.5
PRESENT_HEIGHT = 450  # px of layout at most (3:4): at 150 % the plot's width, not the screen's height, limits it
STALE_S = 30  # s without a new state after which a "running" claim on screen gives way to a warning


def page_css() -> str:
    """The dashboard's style sheet: presentation mode's sizes, a Voila page's dashboard first, and the expiry of
    live claims (``live_only``)."""
    return f"""<style>
.mtlab-present {{--jp-widgets-font-size: 17px; --jp-widgets-inline-height: 34px; --jp-widgets-inline-label-width: 90px}}
.mtlab-present .widget-html-content, .mtlab-present .widget-html-content *:not(.mtlab-stale), .mtlab-present .lm-TabBar-tabLabel,
.mtlab-present .widget-label, .mtlab-present button, .mtlab-present input, .mtlab-present select
  {{font-size: 17px !important; line-height: 1.35}}
.mtlab-present .widget-inline-hbox .widget-label {{width: auto !important; min-width: fit-content; padding-right: 6px}}
.mtlab-present .widget-toggle-button {{width: auto !important}}
.mtlab-present .widget-html-content .mtlab-state td, .mtlab-present .widget-html-content .mtlab-state th,
.mtlab-present .widget-html-content .mtlab-valid td, .mtlab-present .widget-html-content .mtlab-valid th
  {{font-size: 13px !important; white-space: normal !important; padding: 2px 5px !important}}
.mtlab-present img.widget-image {{object-fit: contain}}
.mtlab-present .widget-hslider {{flex-wrap: wrap !important; height: auto !important; margin: 0 14px 2px 0}}
.mtlab-present .widget-hslider > .widget-label, .mtlab-present .widget-hslider > .widget-readout
  {{height: 24px !important; line-height: 24px !important; font-size: 16px !important}}
.mtlab-present .widget-hslider > .widget-label {{order: 0; flex: 1 1 auto; max-width: none; width: auto !important}}
.mtlab-present .widget-hslider > .widget-readout {{order: 1; flex: 0 0 auto; max-width: none; width: auto !important;
  min-width: 0 !important}}
.mtlab-present .widget-hslider > .slider-container {{order: 2; flex: 1 0 calc(100% - 20px) !important;
  margin: 0 10px 0 10px !important; height: 20px}}  /* the track and its handles inside the slider's box */
.mtlab-present .mtlab-side .widget-hslider {{margin-right: 0}}
.mtlab-present .mtlab-knob-optional {{flex-wrap: wrap}}
.mtlab-present .lm-TabBar-tab {{flex: 0 0 auto !important; min-width: fit-content !important; max-width: none !important}}
.mtlab-present .lm-TabBar-content {{flex-wrap: wrap}}
.mtlab-present .widget-tab > .lm-TabBar, .mtlab-present .jupyter-widget-tab > .lm-TabBar {{min-height: fit-content;
  height: auto !important; overflow: visible}}
.mtlab-present .widget-dropdown {{width: auto !important; max-width: 100%}}
.mtlab-present .widget-dropdown > select {{width: auto !important; flex: 0 1 auto}}
@media (max-width: 1100px) {{  /* zoomed in (150 % of 1280 px is 853 px): table cells wrap instead of being cut */
  .mtlab-dashboard .mtlab-state td, .mtlab-dashboard .mtlab-state th
    {{white-space: normal !important; line-height: 1.25 !important; padding: 2px 6px !important}}
}}
/* A Voila page (mtlab-first): the cell of the dashboard first, the notebook's prose and printouts under it, so
   that the page opens on a slider and the plot (Voila: a box of cell wrappers, each holding one cell). */
:has(> * > .jp-Cell .mtlab-first) {{display: flex; flex-direction: column}}
:not(.jp-Cell):has(> .jp-Cell .mtlab-first) {{order: -1}}
@keyframes mtlab-expire {{to {{visibility: hidden; font-size: 0}}}}
@keyframes mtlab-appear {{to {{visibility: visible; font-size: 1em}}}}
.mtlab-live {{animation: mtlab-expire 1ms linear {STALE_S}s forwards}}
.mtlab-stale {{visibility: hidden; font-size: 0; color: #b35900; animation: mtlab-appear 1ms linear {STALE_S}s forwards}}
</style>"""


def in_voila() -> bool:
    """This kernel serves a Voila page (Voila starts its kernels with ``SERVER_SOFTWARE=voila/<version>``)."""
    return os.environ.get("SERVER_SOFTWARE", "").startswith("voila")


def live_only(text: str, beat: int) -> str:
    """``text`` (HTML) while this kernel keeps sending new states; after ``STALE_S`` s without one (a long step, a
    restarted or dead kernel, a notebook reopened with its saved widget state) a warning instead. Pure CSS: every
    render replaces the elements, which restarts the animation that hides the claim."""
    return (f"<span class='mtlab-live'>{text}</span><span class='mtlab-stale'> &middot; no news from the kernel for "
            f"{STALE_S} s: a long step, or the kernel was restarted (this view is no longer live)</span>"
            f"<!-- {beat} -->")


class Dashboard(widgets.VBox):
    """The dashboard widget; build it with ``mtlab.ui.dashboard(trainer)``.

    ``controller`` holds the state and takes the commands (scripts and tests can drive it directly).
    The knobs' controls are built from the knob table (``mtlab.core.knobs.KNOBS``): ``knobs`` holds one
    ``KnobControl`` per knob of the trainer whose row has a ``control`` hint (a slider, a number box, a dropdown
    or a checkbox), keyed ``"lr"``, ``"a"``/``"a/clean"`` (the weights), ``"batch_size:a"``; a row added to the
    table gets its control with no code here, and every control calls ``controller.set(name, value, task,
    linkedset)``. The widgets are attributes too: ``sliders`` ("a" task weight, "a/clean" linked-set weight),
    ``lr_slider``, ``clip_slider``, ``clip_toggle``, ``combine_dropdown``, ``buttons`` (by name),
    ``task_dropdown``, ``set_dropdown``, ``steps_box``, ``snapshot_dropdown``, ``status``, ``counter``,
    ``progress``, ``progress_label``, ``table``, ``validation_table``, ``event_log``, ``image``,
    ``plot_label``, ``scale_toggle``, ``smoothing_slider``, ``zoom``, ``read_step``, ``readout``,
    ``error_box``, ``export_links``, ``k_boxes`` and ``batch_boxes`` (per task: minibatches per step and batch
    size, in the "batches" tab). Number boxes (``steps_box``, ``read_step``, ``k_boxes``, ``batch_boxes``) parse
    what is typed on Enter: a refusal says why in the status line and the box shows the value in force again.

    ``presentation=True`` (or ``dash.presentation = True`` later; by default on in a Voila page, off elsewhere):
    larger text, the run buttons and the sliders
    ``sliders=[...]`` names (keys of ``knobs`` whose control is a slider: weight keys, ``"lr"``; default: every
    slider) beside the plot, which fits the
    window's height, the other controls under them: plot and sliders on one screen of a projector (150 % zoom on
    1280x800). ``hide=[...]`` leaves control groups out
    (``mtlab.ui.controls.GROUPS``: run, weights, accumulation, stepwise, snapshots, plot_options, table, log,
    progress), e.g. for a guided exercise; an unknown name is an error that lists them.

    While a run goes, "running" on screen expires after ``STALE_S`` s without a new state from the kernel (a
    restarted kernel, a notebook reopened with its saved widget state) and a warning takes its place.
    """

    def __init__(self, trainer: Trainer, schedule: Schedule | None = None, refresh_s: float = 0.25, draw_interval: float = 0.7,
                 max_draw_share: float = 0.1, max_points: int = LIVE_POINTS, plots: bool = True,
                 keep_snapshots: int = 5, painter: str = "thread", export_dir: str | Path = "mtlab_export",
                 presentation: bool | None = None, hide: Sequence[str] = (),
                 sliders: Sequence[str] | None = None) -> None:
        hide = check_hide(hide)
        if presentation is None:  # a Voila page is a class's screen: a slider and its effect on the first one
            presentation = in_voila()
        controls = Controls(trainer)  # first: a bad argument below leaves nothing attached to the trainer
        live = LivePlot(list(trainer.tasks), max_points=max_points, width_px=PLOT_WIDTH, dpi=DPI) if plots else None
        self.controls = controls
        self.hide, self._presentation, self._plots = hide, bool(presentation), plots
        unknown = [k for k in (sliders or ()) if k not in controls.slider_keys()]
        if unknown:
            raise ValueError(f"sliders: unknown {unknown}; choose among {controls.slider_keys()}")
        self.chosen = None if sliders is None else list(sliders)  # presentation mode's sliders beside the plot
        self._beat = 0  # counts renders: a live claim ("running") re-sent each time restarts its expiry
        self.export_dir = Path(export_dir)
        self.state: DashState | None = None
        self._syncing = 0  # the thread putting the trainer's values into the controls (0: none)
        self._zoomed = False
        self._drawn_key: tuple[Any, ...] | None = None
        self._render_lock = threading.RLock()
        self._final = False
        self.followers: list[Follow] = []  # the widgets of follow(), shown again as the run goes
        self.controller = Controller(trainer, schedule, keep_snapshots=keep_snapshots, refresh_s=refresh_s)
        self.painter = (Painter(live, self.controller.data, self._show_png, draw_interval, max_draw_share, painter,
                                on_error=lambda m: self.controller.say(m, error=True)) if live is not None else None)
        super().__init__(self._parts())
        self.add_class("mtlab-dashboard")
        if in_voila():  # a class's screen: the page's style sheet shows this cell first (page_css)
            self.add_class("mtlab-first")
        self._wire()
        self.controller.subscribe(self.render)
        self.controller.refresh()

    def _parts(self) -> list[widgets.Widget]:
        parts = self.controls.layout(self._plots, self.hide, self._presentation, self.chosen)
        image = self.controls.image
        size = (PRESENT_WIDTH, PRESENT_FONT, PRESENT_RATIO, PRESENT_HEIGHT) if self._presentation \
            else (PLOT_WIDTH, 1.0, 1.0, None)
        live = self.live
        if self.painter is not None and live is not None \
                and (live.width_px, live.font_scale, live.pixel_ratio, live.max_height) != size:
            self.painter.set_size(*size)
        if self._presentation:  # the plot as large as the width beside the sliders and the window's height allow
            self.add_class("mtlab-present")
            image.layout.width, image.layout.height = "auto", "auto"
            image.layout.max_width = f"min(100%, {round(PRESENT_WIDTH * PRESENT_RATIO)}px)"
            image.layout.max_height = "calc(100vh - 210px)"
        else:
            self.remove_class("mtlab-present")
            image.layout.width, image.layout.height = f"{PLOT_WIDTH}px", "auto"
            image.layout.max_width, image.layout.max_height = None, None
        return [widgets.HTML(page_css()), *parts]

    @property
    def presentation(self) -> bool:
        """Presentation mode: larger text, the plot first, the controls below it (``hide`` still applies)."""
        return self._presentation

    @presentation.setter
    def presentation(self, on: bool) -> None:
        self._presentation = bool(on)
        self.children = self._parts()
        if self.state is not None:
            self.render(self.state)

    def __getattr__(self, name: str) -> Any:  # the widgets: dash.sliders, dash.buttons, dash.status, ...
        controls = self.__dict__.get("controls")
        if controls is not None and name in vars(controls):
            return getattr(controls, name)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    # ------------------------------------------------------------------ wiring: one command per control
    def _wire(self) -> None:
        c, w = self.controller, self.controls
        for knob in w.knobs.values():  # every knob's control: one controller.set
            knob.observe(functools.partial(self._user_knob, knob))
        numbers = [k.widget for k in w.knobs.values() if isinstance(k.widget, NumberText)]
        for box in (w.steps_box, w.read_step, *numbers):
            box.on_refused = lambda message: c.say(message, error=True)
        w.steps_box.observe(lambda ch: self._user(c.say, f"steps -> {ch['new']}: run trains this many more steps"
                                                  if ch["new"] else "steps -> 0: run goes to the schedule's end, or "
                                                  "until stopped"), "number")
        w.task_dropdown.observe(self._on_task_choice, "value")
        w.branch_dropdown.observe(lambda ch: self._user(c.select_branch, ch["new"]), "value")
        actions = {"minibatch": lambda: c.minibatch(w.task_dropdown.value, w.set_dropdown.value),
                   "step": lambda: c.call("step"), "run": lambda: c.start(w.steps_box.number),
                   "reinitialize": lambda: c.reinitialize(w.reinit_knobs.value),
                   "pause": c.toggle_pause, "stop": self._click_stop, "snapshot": c.take_snapshot,
                   "restore": lambda: c.restore(w.snapshot_dropdown.value), "clear_error": c.clear_error,
                   "export_png": lambda: self._export("png"), "export_svg": lambda: self._export("svg"),
                   "export_csv": lambda: self._export("csv"), "export_journal": lambda: self._export("journal"),
                   "fork": lambda: c.fork(), "continue": lambda: c.continue_branch(w.steps_box.number or 10),
                   "switch": c.switch_branch, "compare": self._show_comparison, "drop": c.drop_branch}
        for name in (*w.calls, "apply", "reset"):  # the chain's calls (a user transform's too), apply, reset
            actions[name] = functools.partial(c.call, name)
        for name, fn in actions.items():
            w.buttons[name].on_click(lambda _b, f=fn: f())
        for part in (w.scale_toggle, w.smoothing_slider):
            part.observe(self._on_plot_option, "value")
        w.zoom.observe(self._on_zoom, "value")
        w.read_step.observe(lambda ch: self._on_plot_option(ch), "number")

    def _user(self, fn: Callable[..., object], *args: object) -> None:
        if self._syncing != threading.get_ident():  # a value put there by render() (this thread) is no user's
            fn(*args)

    def _user_knob(self, control: KnobControl, value: Any) -> None:
        self._user(self._set_knob, control, value)

    def _set_knob(self, control: KnobControl, value: Any) -> None:
        """A knob from its control; at an end of a log slider, say that a typed value beyond it was clamped there."""
        c = self.controller
        if c.set(control.name, value, control.task, control.linkedset) and control.at_end(value) is not None:
            words = control.knob.words(value, control.task, control.linkedset)
            where = "".join(f", {k}={v!r}" for k, v in (("task", control.task), ("linkedset", control.linkedset))
                            if v is not None)
            c.say(f"{words}: the slider's {control.at_end(value)} value (a number typed beyond it is clamped "
                  f"there); for another, trainer.set({control.name!r}, value{where}) in code")

    def _on_task_choice(self, change: dict[str, Any]) -> None:
        self.controls.set_dropdown.options = list(self.controller.trainer.tasks[change["new"]].linkedsets)

    def _show_comparison(self) -> None:
        """The branches and the trainer driven side by side (``plot_runs``) in the compare tab under the plot."""
        runs = self.controller.compared()
        if len(runs) < 2:
            self.controller.say("compare: no branch yet; click fork here, then continue", error=True)
            return
        try:
            fig = plot_runs(runs, width_px=PLOT_WIDTH)
            self.controls.compare_image.value = figure_png(fig)
        except Exception as exc:  # noqa: BLE001 (a figure that fails: said, never lost)
            self.controller.say(f"compare: {type(exc).__name__}: {exc}", error=True)
            return
        tab = self.controls.lower_tab
        if tab is not None:
            tab.selected_index = len(tab.children) - 1
        self.controller.say(f"compare: {', '.join(runs)} side by side in the compare tab under the plot")

    def _click_stop(self) -> None:
        if not self.controller.stop(wait=False):
            self.controller.say("stop: no run in progress (nothing to stop)")

    def _export(self, kind: str) -> None:
        try:
            self.controller.say(self.export(kind))
        except Exception as exc:  # noqa: BLE001 (a full disk, a figure that fails: said, never lost)
            self.controller.say(f"export: {type(exc).__name__}: {exc}", error=True)

    # ------------------------------------------------------------------ rendering one state
    def render(self, state: DashState) -> None:
        """Every text and control value from ``state`` (any thread); the plot when its data changed."""
        with self._render_lock:  # one render at a time (the run's thread and the kernel's both render)
            if self._final:
                return  # replaced or closed: the last state shown says so and stays
            self._final = self.controller.closed
            self._render(state)

    def _render(self, state: DashState) -> None:
        w = self.controls
        self.state = state
        if self._final and self.painter is not None:  # no more drawing
            self.painter.close()
        self._beat += 1
        if state.running and state.run is not None:  # a claim that holds only while this kernel keeps sending:
            # it expires on screen
            still = dataclasses.replace(state, run=None)
            inside = (f" &middot; step {state.step}, minibatch {state.run.minibatch} of {state.run.minibatches}"
                      if state.run.minibatch else "")  # a long step, as it goes
            w.counter.value = counter_html(still) + live_only(
                f" &middot; {state.run.state} ({state.run.rate:.2f} steps/s){inside}", self._beat)
            w.status.value = live_only(status_html(state), self._beat)
        else:
            w.counter.value = counter_html(state)
            w.status.value = status_html(state)
        w.table.value = state.table_html
        progress = progress_html(state)  # its ETA is a live claim too: it expires with the kernel's news
        w.progress_label.value = live_only(progress, self._beat) if state.running else progress
        w.event_log.value = events_html(state.events, places=state.places) + journal_html(state.journal)
        w.noise_panel.value = state.noise_html
        w.validation_table.value = validation_html(state.records)
        w.error_box.value = error_html(state)
        w.buttons["clear_error"].layout.display = "" if state.error else "none"
        run = state.run
        w.buttons["pause"].description = "resume" if run is not None and run.state in ("paused", "pausing") else "pause"
        w.progress.layout.display = "" if run is not None and run.total else "none"
        if run is not None and run.total:
            w.progress.max, w.progress.value = max(run.total, 1), min(run.steps_done, run.total)
            w.progress.bar_style = ("danger" if run.failed else "success") if run.state == "ended" else ""
        self._sync_controls(state)
        self._plot_if_changed(state)

    def _sync_controls(self, state: DashState) -> None:
        """Controls show the trainer's values (after a restore, a schedule's lr, a change from code)."""
        w = self.controls
        self._syncing = threading.get_ident()
        try:
            # The trainer's values now, not the state's: a slider the user moved since the state was taken
            # (from the run's thread) is not put back.
            tr = self.controller.trainer
            if tr.pending_changes():  # a knob moved during a step waits for the step's next knob read: the
                self._sync_views(state)  # trainer still holds the old value, which must not put the slider back
                return
            for knob in w.knobs.values():  # every knob's control shows the value in force
                knob.show(tr.get(knob.name, knob.task, knob.linkedset))
            self._sync_views(state)
        finally:
            self._syncing = 0

    def _sync_views(self, state: DashState) -> None:
        """The selectors and the zoom from ``state`` (called by ``_sync_controls``, within its syncing)."""
        w = self.controls
        branches = [(label, name) for label, name in state.branches]
        if list(w.branch_dropdown.options) != branches:
            w.branch_dropdown.options = branches
        if state.branch != w.branch_dropdown.value and (state.branch is None or
                                                        state.branch in [n for _, n in branches]):
            w.branch_dropdown.value = state.branch
        options = [(label, i) for i, label in enumerate(state.snapshots)]
        if list(w.snapshot_dropdown.options) != options:
            w.snapshot_dropdown.options = options
            w.snapshot_dropdown.value = options[-1][1] if options else None
        first, last = self.controller.data.step_range()
        if last > w.zoom.max or first < w.zoom.min or not self._zoomed:
            w.zoom.max, w.zoom.min = max(last, first + 1), first
            if not self._zoomed:
                w.zoom.value = (first, max(last, first + 1))

    def _plot_if_changed(self, state: DashState, force: bool = False) -> None:
        painter = self.painter
        data = self.controller.data
        key = (state.step, len(data.events), len(data.validation), id(data.ghost), len(data.series),
               state.run.state if state.run is not None else None, data.branch_version)  # a knob's event is in
        # the store at once: its mark is drawn without waiting for the step in flight; a run's end is drawn always
        if painter is not None and (force or key != self._drawn_key):
            self._drawn_key = key
            self._update_readout()
            run = self.controller.run
            if run is not None and run.in_thread and run.state != "ended":
                painter.between_steps()
            elif self.controller.running:
                painter.request()
            else:  # idle, paused, or the run's last state (ended by its steps, stop, an interrupt or an error):
                painter.draw()  # drawn now, whatever the pace, so that the frame left shows the last step
        elif painter is None:
            self._update_readout()

    def _show_png(self, png: bytes, step: int) -> None:
        self.controls.image.value = png
        self.controls.plot_label.value = f"<span class='mtlab-asof' style='font-size:12px'>plot as of step {step}</span>"

    def _update_readout(self) -> None:
        step = self.controls.read_step.number or self.controller.data.step  # 0: the latest step
        values = self.controller.data.values_at(step)
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{s}</td><td>{v:.4g}</td></tr>"
                       for k, (s, v) in sorted(values.items(), key=lambda kv: (panel_of(kv[0]) or ("",))[0]))
        self.controls.readout.value = (f"<table class='mtlab-readout' style='font-size:12px'><tr><th>series</th>"
                                       f"<th>step</th><th>value</th></tr>{rows}</table>" if rows else
                                       "<i>no rows at or before this step yet</i>")

    def _on_plot_option(self, change: dict[str, Any]) -> None:
        live = self.live
        if live is not None:
            live.set_scale(self.controls.scale_toggle.value)
            live.smoothing = float(self.controls.smoothing_slider.value)
            live.set_marker(self.controls.read_step.number if self.controls.read_step.number else None)
        if self.state is not None:
            self._plot_if_changed(self.state, force=True)

    def _on_zoom(self, change: dict[str, Any]) -> None:
        if self._syncing == threading.get_ident():
            return
        w = self.controls
        lo, hi = w.zoom.value
        self._zoomed = (lo, hi) != (w.zoom.min, w.zoom.max)
        if self.live is not None:
            self.live.set_xrange((lo, hi) if self._zoomed else None)
        if self.state is not None:
            self._plot_if_changed(self.state, force=True)

    # ------------------------------------------------------------------ for scripts and tests
    @property
    def trainer(self) -> Trainer:
        return self.controller.trainer

    @property
    def live(self) -> LivePlot | None:
        """The live figure (None with ``plots=False``)."""
        return self.painter.plot if self.painter is not None else None

    @property
    def schedule(self) -> Schedule | None:
        return self.controller.schedule

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        self.controller.schedule = value
        self.controller.refresh()

    run = property(lambda self: self.controller.run, doc="the trainer's run shown here (None when none)")
    running = property(lambda self: self.controller.alive, doc="a run of this trainer is in progress (maybe paused)")
    paused = property(lambda self: self.controller.run is not None and self.controller.run.state == "paused")
    error = property(lambda self: self.controller.error, doc="the exception that ended the last run, if any")
    status_text = property(lambda self: self.state.status if self.state is not None else "")
    validation = property(lambda self: self.controller.data.validation, doc="evaluate events and validation records")
    records = property(lambda self: self.controller.data.records, doc="the loop's validation records")
    events = property(lambda self: self.controller.data.events, doc="(step, what changed): the event log")
    snapshots = property(lambda self: self.controller.snapshots)
    drawn_step = property(lambda self: self.painter.drawn_step if self.painter is not None else None)
    redraws = property(lambda self: self.painter.redraws if self.painter is not None else 0)

    def start(self, steps: int = 0) -> bool:
        """Train ``steps`` more steps in the background (0: until stopped); False (said why) when refused."""
        return self.controller.start(steps)

    def pause(self) -> None:
        self.controller.pause()

    def resume(self) -> None:
        self.controller.resume()

    def stop(self, wait: bool = True, timeout: float | None = 30.0) -> bool:
        return self.controller.stop(wait=wait, timeout=timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run ends (scripts, tests); Kernel -> Interrupt stops it with one line."""
        self.controller.wait(timeout)
        if self.painter is not None and not self.controller.alive:
            self.painter.flush()

    def follow(self, fn: Callable[[], Any], every_s: float = 1.0, max_share: float = 0.1) -> Follow:
        """A widget showing ``fn()`` (a table, a figure, a mapping, any value), shown again between steps while
        this dashboard's run goes and once more when it ends: a cell after the run's that shows "the run so
        far" stays true under *Run All* (``mtlab.ui.follow``). A redraw waits ``every_s`` s or more (``fn``'s
        own time at most ``max_share`` of the run's)."""
        run = self.controller.run
        in_flight = run is not None and run.alive and run.state != "paused"
        view = Follow(fn, self.state if in_flight and self.state is not None else self.controller.state(), in_flight,
                      every_s, max_share)
        self.controller.subscribe(view)
        self.followers.append(view)
        return view

    def refresh(self) -> None:
        """Read new rows, update every text and draw the plot now (no step in flight)."""
        self._drawn_key = None
        self.controller.refresh()
        if self.painter is not None:
            self.painter.flush()

    def figure(self) -> Any:
        """A fresh Figure of the whole history (every panel, validation, grey abandoned branch), its events marked
        and numbered as the live plot and the event log mark and number them."""
        data = self.controller.data.copy()
        return plot_history(self.trainer.history, validation=data.validation, scale=self.controls.scale_toggle.value,
                            smoothing=self.controls.smoothing_slider.value, ghost=data.ghost or None,
                            events=data.marks())

    def export(self, kind: str) -> str:
        """Write the figure (``png``/``svg``) or the history (``csv``) into ``export_dir``; a download link
        appears next to the buttons. Returns the status message."""
        if kind not in ("png", "svg", "csv", "journal"):
            raise ValueError(f"export kind must be 'png', 'svg', 'csv' or 'journal', got {kind!r}")
        self.export_dir.mkdir(parents=True, exist_ok=True)
        stamp, step = datetime.now().strftime("%Y%m%d-%H%M%S"), self.trainer.step_count
        if kind == "journal":
            data, name, mime = ("".join(line + "\n" for line in self.trainer.journal.to_jsonl())).encode(), \
                f"journal-step{step}-{stamp}.jsonl", "application/jsonl"
        elif kind == "csv":
            data, name, mime = self.trainer.history.to_csv(index=False).encode(), f"history-step{step}-{stamp}.csv", \
                "text/csv"
        else:
            fig = self.figure()
            data = figure_png(fig) if kind == "png" else figure_svg(fig)
            name, mime = f"plot-step{step}-{stamp}.{kind}", "image/png" if kind == "png" else "image/svg+xml"
        path = self.export_dir / name
        path.write_bytes(data)
        self.controls.export_links.value = (f"<a download='{html.escape(name)}' href='data:{mime};base64,"
                                            f"{base64.b64encode(data).decode()}'>download {html.escape(name)}</a>")
        return f"exported {kind.upper()} to {path}"

    def close(self, stop: bool = True) -> None:
        """Stop the trainer's run (unless ``stop=False``: it goes on, other dashboards and
        ``mtlab.ui.stop_all()`` still reach it), detach from the trainer and close the widgets."""
        controller = self.__dict__.get("controller")
        if controller is None:  # __init__ raised (bad argument): nothing to undo
            return
        controller.close(stop=stop)
        painter, controls = self.__dict__.get("painter"), self.__dict__.get("controls")  # absent if __init__ raised
        if painter is not None:
            painter.close()
        for child in [*(controls.every() if controls is not None else ()), *self.__dict__.get("followers", ())]:
            child.close()
        super().close()


def dashboard(trainer: Trainer, schedule: Schedule | None = None, **kwargs: Any) -> Dashboard:
    """A live dashboard widget for a trainer (or an experiment from ``mtlab.from_recipe``); display it
    as a cell's last expression. A dashboard built while the trainer's run goes shows (adopts) that run.
    Its runs go through ``mtlab.loop.run`` with ``schedule`` (default: the experiment's; none: the
    trainer's lr until stopped), so lr decay, validation and go_back happen as in a script; run after the
    schedule's end continues it.

    Examples:
        >>> d = mtlab.ui.dashboard(trainer)  # doctest: +SKIP
        >>> d            # sliders, stepwise buttons, run/pause/stop, state table, live plots  # doctest: +SKIP
        >>> d.start(100)  # in the background: the knobs act during the run; d.wait() blocks  # doctest: +SKIP
        >>> mtlab.ui.dashboard(trainer, presentation=True, hide=["stepwise", "snapshots"])  # doctest: +SKIP
    """
    if not isinstance(trainer, Trainer) and isinstance(getattr(trainer, "trainer", None), Trainer):
        schedule = schedule if schedule is not None else getattr(trainer, "schedule", None)
        trainer = trainer.trainer
    if not isinstance(trainer, Trainer):
        raise TypeError("dashboard() takes an mtlab.Trainer (or an experiment with .trainer), "
                        f"got {type(trainer).__name__}")
    return Dashboard(trainer, schedule=schedule, **kwargs)


__all__ = ["Dashboard", "dashboard"]
