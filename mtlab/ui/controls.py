"""The dashboard's widgets, built for one screen (1280x800): every control carries a tooltip that says
what it calls and what it needs. Building only; ``dashboard.py`` wires them to the controller."""

from __future__ import annotations

import math
from typing import Any, TYPE_CHECKING

import ipywidgets as widgets

from ..core import combine, weighting
from .texts import call_buttons, call_tooltip

if TYPE_CHECKING:
    from ..core.trainer import Trainer

BUTTONS = {"minibatch": "process minibatch", "normalize": "normalize", "clip": "clip", "apply": "apply",
           "step": "step", "reset": "reset", "run": "run", "pause": "pause", "stop": "stop", "snapshot": "snapshot",
           "restore": "restore", "export_png": "PNG", "export_svg": "SVG", "export_csv": "history CSV",
           "clear_error": "clear"}
LEFT_WIDTH = 320  # px: the controls column; the plot takes the rest of a 1280-px screen's notebook width
PLOT_WIDTH = 620  # px: the PNG is drawn at exactly this width (no downscaling by the browser)


def _layout(**kw: Any) -> widgets.Layout:
    return widgets.Layout(**kw)


def weight_slider(label: str, value: float, width: str, tip: str) -> widgets.FloatSlider:
    """A weight slider from 0 to at least 2 (twice the value when larger), applied on release."""
    return widgets.FloatSlider(value=value, min=0.0, max=max(2.0, 2 * value), step=0.01, description=label,
                               readout_format=".2f", continuous_update=False, tooltip=tip,
                               style={"description_width": width}, layout=_layout(width=f"{LEFT_WIDTH - 44}px"))


class Controls:
    """Every control of a dashboard, by role (see ``Dashboard``'s docstring for the names)."""

    def __init__(self, trainer: Trainer) -> None:
        keys = [*trainer.weights()]
        width = f"{min(max(len(k) for k in keys) * 7 + 24, 150)}px"
        self.sliders: dict[str, widgets.FloatSlider] = {}
        for tname, t in trainer.tasks.items():
            self.sliders[tname] = weight_slider(
                f"task {tname}", t.weight, width,
                f"set_task_weight({tname!r}, w): task {tname!r}'s weight in the combined update; "
                "0 leaves the task out of step()")
            for sname, ls in t.linkedsets.items():
                self.sliders[f"{tname}/{sname}"] = weight_slider(
                    f"  {tname}/{sname}", ls.weight, width,
                    f"set_weight({tname!r}, {sname!r}, w): weight of this linked set's loss and normalizer, from "
                    "the next minibatch on; 0 leaves it out")
        lr = trainer.lr
        self.lr_slider = widgets.FloatLogSlider(
            value=lr, base=10, min=math.log10(lr) - 3, max=math.log10(lr) + 2, step=0.05, description="lr",
            readout_format=".2e", continuous_update=False, style={"description_width": width},
            layout=_layout(width=f"{LEFT_WIDTH - 44}px"),
            tooltip="trainer.lr: learning rate of the next apply(); a run's schedule sets it again at each step "
                    "(lr decay)")
        clip = trainer.clip_grad_value
        c0 = clip if clip is not None else 1.0
        self.clip_toggle = widgets.Checkbox(value=clip is not None, description="clip", indent=False,
                                            layout=_layout(width="60px", flex="0 0 auto"),
                                            tooltip="clipping on/off (trainer.clip_grad_value = value or None); "
                                                    "during a run it changes at the end of the current step")
        self.clip_slider = widgets.FloatLogSlider(
            value=c0, base=10, min=math.log10(c0) - 3, max=math.log10(c0) + 2, step=0.05, description="value",
            readout_format=".3g", continuous_update=False, disabled=clip is None,
            style={"description_width": "40px"}, layout=_layout(width=f"{LEFT_WIDTH - 110}px"),
            tooltip="trainer.clip_grad_value: clip() clamps every gradient element to ± this value. Needs: clip ticked")
        methods = ["sum", *combine.AGGREGATORS, *weighting.WEIGHTINGS]
        current = str(getattr(trainer.update, "method", None) or "sum")
        self.combine_dropdown = widgets.Dropdown(
            options=methods if current in methods else [*methods, current], value=current, description="combine",
            disabled=bool(trainer.acc_steps), style={"description_width": "60px"}, layout=_layout(width="240px"),
            tooltip="trainer.set_combine(): how the tasks' processed gradients become one direction, from the next "
                    "apply() (aggregators and FAMO need pip install \"mtlab[mtl]\"); during a run it changes at the "
                    "end of the current step")
        tasks = list(trainer.tasks)
        self.task_dropdown = widgets.Dropdown(options=tasks, value=tasks[0], description="task",
                                              layout=_layout(width="165px"), style={"description_width": "35px"},
                                              tooltip="the task 'process minibatch' works on")
        self.set_dropdown = widgets.Dropdown(options=list(trainer.tasks[tasks[0]].linkedsets), description="set",
                                             layout=_layout(width="165px"), style={"description_width": "35px"},
                                             tooltip="the linked set 'process minibatch' draws from")
        self.steps_box = widgets.BoundedIntText(
            value=0, min=0, max=10**9, description="steps", layout=_layout(width="130px", flex="0 0 auto"),
            style={"description_width": "40px"},
            tooltip="steps per run: run trains this many more steps, whatever the schedule's state (a finished "
                    "schedule is continued: lr decay and validation go on); 0 = to the schedule's end, or until stopped once it "
                    "has ended (or without one)")
        self.calls = call_buttons(trainer)  # the chain's calls, a user transform's included: one button each
        labels = {**BUTTONS, **{c: c for c in self.calls if c not in BUTTONS}}
        self.buttons = {name: widgets.Button(description=label, tooltip=call_tooltip(trainer, name),
                                             layout=_layout(width="auto", flex="0 0 auto", min_width="52px"),
                                             button_style="primary" if name in ("step", "run") else "")
                        for name, label in labels.items()}
        self.snapshot_dropdown = widgets.Dropdown(options=[], description="snapshot", layout=_layout(width="210px"),
                                                  style={"description_width": "60px"},
                                                  tooltip="the snapshot restore goes back to (the latest by default)")
        self.scale_toggle = widgets.ToggleButtons(options=["linear", "log"], value="linear",
                                                  tooltips=["loss axis linear", "loss axis logarithmic"],
                                                  tooltip="the loss panel's y axis: linear or logarithmic",
                                                  style={"button_width": "64px"}, layout=_layout(width="auto"))
        self.smoothing_slider = widgets.FloatSlider(
            value=0.0, min=0.0, max=0.99, step=0.01, description="smooth", readout_format=".2f",
            continuous_update=False, style={"description_width": "56px"}, layout=_layout(width="210px"),
            tooltip="EMA smoothing of the loss curves (TensorBoard's); the raw curve stays faint behind")
        self.zoom = widgets.IntRangeSlider(
            value=(0, 1), min=0, max=1, description="steps", continuous_update=False,
            style={"description_width": "40px"}, layout=_layout(width="260px"),
            tooltip="the step range shown; drag an end to zoom; at the full range the plot follows the run")
        self.read_step = widgets.BoundedIntText(
            value=0, min=0, max=10**12, description="read", style={"description_width": "34px"},
            layout=_layout(width="130px"),
            tooltip="read every plotted series at this step (the last row at or before it; 0: the latest step); a "
                    "dotted line marks it on the plot")
        self.counter, self.status, self.table = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=_layout(width="220px"),
                                            tooltip="the run's progress (steps done of the steps asked for)")
        self.progress_label = widgets.HTML()
        self.validation_table, self.event_log, self.readout = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.error_box, self.export_links, self.plot_label = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.image = widgets.Image(format="png", layout=_layout(width=f"{PLOT_WIDTH}px", height="auto"))

    def layout(self, plots: bool) -> list[widgets.Widget]:
        """The parts of one screen: texts on top, controls on the left, the plot on the right."""
        B = self.buttons
        wrap = _layout(flex_flow="row wrap", align_items="center")
        run_row = widgets.HBox([self.steps_box, B["run"], B["pause"], B["stop"]], layout=wrap)
        weights = widgets.VBox([*self.sliders.values(), self.lr_slider,
                                widgets.HBox([self.clip_toggle, self.clip_slider]), self.combine_dropdown])
        stepwise = widgets.VBox([widgets.HBox([self.task_dropdown, self.set_dropdown], layout=wrap),
                                 widgets.HBox([B[n] for n in ("minibatch", *self.calls, "apply", "step",
                                                              "reset")], layout=wrap)])
        snaps = widgets.VBox([widgets.HBox([self.snapshot_dropdown, B["snapshot"], B["restore"]], layout=wrap),
                              widgets.HBox([B["export_png"], B["export_svg"], B["export_csv"]], layout=wrap),
                              self.export_links])
        tabs = widgets.Tab([weights, stepwise, snaps], titles=("weights", "step by step", "snapshots"),
                           layout=_layout(width=f"{LEFT_WIDTH}px"))
        left = widgets.VBox([run_row, tabs], layout=_layout(width=f"{LEFT_WIDTH}px", flex="0 0 auto"))
        lower = widgets.Tab([self.readout, self.event_log, self.validation_table],
                            titles=("read-out", "events", "validation"))
        if plots:
            options = widgets.HBox([self.scale_toggle, self.smoothing_slider, self.zoom, self.read_step], layout=wrap)
            right = widgets.VBox([options, self.plot_label, self.image, lower],
                                 layout=_layout(width=f"{PLOT_WIDTH + 10}px", flex="0 1 auto"))
        else:
            right = widgets.VBox([lower], layout=_layout(flex="1 1 auto"))
        top = widgets.HBox([self.progress, self.progress_label], layout=wrap)
        errors = widgets.HBox([self.error_box, B["clear_error"]], layout=wrap)
        B["clear_error"].layout.display = "none"
        body = widgets.HBox([left, right], layout=_layout(flex_flow="row wrap", align_items="flex-start"))
        return [self.counter, top, self.status, errors, self.table, body]

    def every(self) -> list[widgets.Widget]:
        """Every widget built here (to close them)."""
        return [*self.sliders.values(), self.lr_slider, self.clip_slider, self.clip_toggle, self.combine_dropdown,
                *self.buttons.values(), self.task_dropdown, self.set_dropdown, self.steps_box, self.snapshot_dropdown,
                self.scale_toggle, self.smoothing_slider, self.zoom, self.read_step, self.counter, self.status,
                self.table, self.progress, self.progress_label, self.validation_table, self.event_log, self.readout,
                self.error_box, self.export_links, self.plot_label, self.image]
