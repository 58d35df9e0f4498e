"""The dashboard's widgets, built for one screen (1280x800): every control carries a tooltip that says
what it calls and what it needs. Building only; ``dashboard.py`` wires them to the controller."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import traitlets

from ..core import combine, weighting
from ..core.columns import set_key
from .controller import KNOB_CHOICES
from .texts import BRANCHES_TAB, call_buttons, call_tooltip

if TYPE_CHECKING:
    from ..core.trainer import Trainer

BUTTONS = {"minibatch": "process minibatch", "normalize": "normalize", "clip": "clip", "apply": "apply",
           "step": "step", "reset": "reset", "run": "run", "pause": "pause", "stop": "stop", "snapshot": "snapshot",
           "restore": "restore", "export_png": "PNG", "export_svg": "SVG", "export_csv": "history CSV",
           "fork": "fork here", "export_journal": "journal", "continue": "continue", "switch": "switch",
           "compare": "compare", "drop": "drop",
           "clear_error": "clear", "reinitialize": "re-initialise"}
LEFT_WIDTH = 360  # px: the controls column; the plot takes the rest of a 1280-px screen's notebook width
MAX_K = 1000  # the K box refuses more minibatch rounds per step (a step of 10^6 rounds would never end in class)
PRESENT_LEFT = 236  # px: presentation mode's column of run buttons and chosen sliders (tracks of 200 px or more)
PLOT_WIDTH = 620  # px: the PNG is drawn at exactly this width (no downscaling by the browser)


# The groups of controls ``Dashboard(hide=[...])`` can hide, and what each holds.
GROUPS = {"run": "steps box, run, pause, stop, re-initialise", "weights": "the weights tab (task and linked-set weights, lr, clip, "
          "combine)", "accumulation": "the batches tab (minibatches per step K, batch size)",
          "stepwise": "the stepwise tab (process minibatch, normalize, clip, apply, step, reset)",
          "snapshots": "the branches tab (fork here, continue, switch, compare, drop; snapshot, restore; export)",
          "plot_options": "the plot options (scale, smoothing, zoom, read-out step)", "table": "the state table",
          "log": "the read-out, events and validation tabs", "progress": "the progress bar"}


def check_hide(hide: Sequence[str]) -> tuple[str, ...]:
    """The control groups to hide; an unknown name is an error that lists the valid ones."""
    if isinstance(hide, str):
        hide = [hide]
    unknown = [h for h in hide if h not in GROUPS]
    if unknown:
        raise ValueError(f"hide: unknown control group(s) {unknown}; valid: " +
                         ", ".join(f"{k!r} ({v})" for k, v in GROUPS.items()))
    return tuple(hide)


def parse_number(text: str, kind: type, minimum: float | None = None, maximum: float | None = None) -> int | float:
    """A typed number: ``int`` accepts whole numbers also written ``1e3`` or ``1_000``; ``float`` any finite number.
    Raises ValueError with what was wrong and what to type instead."""
    raw = text.strip()
    if not raw:
        raise ValueError("an empty box; type a number, e.g. 25")
    try:
        value = float(raw.replace("_", ""))
    except ValueError:
        raise ValueError(f"{raw!r} is not a number; type digits, e.g. 25 or 1e3") from None
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not a finite number; type e.g. 25")
    if kind is int:
        if value != int(value):
            raise ValueError(f"{raw!r} is not a whole number; type e.g. {max(int(value), 1)}")
        value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{raw!r} is below the minimum {minimum:g}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{raw!r} is above the maximum {maximum:g}")
    return value


class _NumberString(traitlets.Unicode):
    """A Text value that also takes a number assigned from code (``box.value = 3``)."""

    def validate(self, obj: Any, value: Any) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = format(value, "g") if isinstance(value, float) else str(value)
        return super().validate(obj, value)


class NumberText(widgets.Text):
    """A number box that never guesses: the text is parsed when the user presses Enter or leaves the box; an
    invalid entry is refused (``on_refused(message)``) and the box shows the number in force again. ``number``
    holds the number taken (observe it). ``IntText`` is not used: its browser side drops "e", ",", "." and
    spaces as they are typed (its keypress and keyup handlers), so 2.5 became 25 and 1e3 became 13, and its
    number input ignores letters; here every character typed reaches the parser."""

    value = _NumberString("").tag(sync=True)
    number = traitlets.Any(0)

    def __init__(self, value: float, kind: type = int, minimum: float | None = None, maximum: float | None = None,
                 what: str = "value", **kw: Any) -> None:
        super().__init__(value=str(value), continuous_update=False, **kw)
        self.kind, self.minimum, self.maximum, self.what = kind, minimum, maximum, what
        self.on_refused: Callable[[str], None] = lambda message: None
        self.number = value
        self.refusal: str | None = None  # the latest refusal message (None after an accepted entry)
        self._showing = False
        self.observe(self._parse, "value")

    def show(self, number: float) -> None:
        """Put ``number`` in the box (no parsing, no refusal)."""
        number = self.kind(number)
        self._showing = True
        try:
            self.value = self.text_of(number)  # first the text, then the observers of the number
        finally:
            self._showing = False
        self.number = number

    def text_of(self, number: float) -> str:
        return str(int(number)) if self.kind is int else format(number, ".6g")

    def _parse(self, change: dict[str, Any]) -> None:
        if self._showing:
            return
        try:
            taken = parse_number(change["new"], self.kind, self.minimum, self.maximum)
        except ValueError as exc:
            self.refusal = f"{self.what}: refused {exc}; kept {self.text_of(self.number)}"
            self.show(self.number)
            self.on_refused(self.refusal)
            return
        self.refusal = None
        self.show(taken)


def _layout(**kw: Any) -> widgets.Layout:
    return widgets.Layout(**kw)


class TipBox(widgets.HBox):
    """A box whose tooltip shows anywhere over it. ipywidgets 8 puts the tooltip of a described control on its
    label only (hovering the dropdown or the text box showed none), and its browser side reads a box's
    ``description`` before setting the box's title (a box has none: a JavaScript error): this box has one."""

    description = traitlets.Unicode("").tag(sync=True)


def tipped(widget: widgets.Widget) -> widgets.Box:
    """``widget`` in a box carrying its tooltip over the whole control."""
    return TipBox([widget], tooltip=widget.tooltip, layout=_layout(width="auto", flex="0 0 auto"))


def weight_slider(label: str, value: float, width: str, tip: str) -> widgets.FloatSlider:
    """A weight slider from 0 to at least 2 (twice the value when larger), applied on release."""
    return widgets.FloatSlider(value=value, min=0.0, max=max(2.0, 2 * value), step=0.01, description=label,
                               readout_format=".3g", continuous_update=False, tooltip=tip,
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
                self.sliders[set_key(tname, sname)] = weight_slider(
                    f"  {set_key(tname, sname)}", ls.weight, width,
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
        self.steps_box = NumberText(
            0, int, 0, 10**9, what="steps", description="steps", layout=_layout(width="130px", flex="0 0 auto"),
            style={"description_width": "40px"},
            tooltip="steps per run: run trains this many more steps, whatever the schedule's state (a finished "
                    "schedule is continued: lr decay and validation go on); 0 = to the schedule's end, or until stopped once it "
                    "has ended (or without one). Whole numbers only (25, 1e3); anything else is refused")
        rounds = trainer.minibatches_per_step
        self.k_boxes = {n: NumberText(
            rounds[n], int, 1, MAX_K, what=f"minibatches per step of {n}", description="K",
            style={"description_width": "16px"}, layout=_layout(width="90px", flex="0 0 auto"),
            tooltip=f"trainer.set_minibatches_per_step(k, {n!r}): minibatch rounds (each active linked set once) task "
                    f"{n!r} accumulates before each apply(); from the next step on (a step in progress keeps its own)")
            for n in trainer.tasks}
        self.batch_boxes = {n: NumberText(
            t.batch_size, int, 1, 10**6, what=f"batch size of {n}", description="batch",
            style={"description_width": "38px"}, layout=_layout(width="110px", flex="0 0 auto"),
            tooltip=f"trainer.set_batch_size({n!r}, n): examples per minibatch of task {n!r}, from the next minibatch "
                    "drawn on (each stream keeps its place in the epoch)")
            for n, t in trainer.tasks.items()}
        self.calls = call_buttons(trainer)  # the chain's calls, a user transform's included: one button each
        labels = {**BUTTONS, **{c: c for c in self.calls if c not in BUTTONS}}
        self.buttons = {name: widgets.Button(description=label, tooltip=call_tooltip(trainer, name),
                                             layout=_layout(width="auto", flex="0 0 auto", min_width="52px"),
                                             button_style="primary" if name in ("step", "run") else "")
                        for name, label in labels.items()}
        self.reinit_knobs = widgets.Dropdown(
            options=[(label, value) for value, label in KNOB_CHOICES.items()], value="keep",
            layout=_layout(width="150px", flex="0 0 auto"),
            tooltip="what re-initialise does with the knobs: keep them as set now, or set the starting knobs again "
                    "(the weights, lr, clip, combine method, K and batch sizes the run's first step ran with)")
        self.branch_dropdown = widgets.Dropdown(
            options=[], description="branch", layout=_layout(width="320px"), style={"description_width": "50px"},
            tooltip="the branch drawn on the plot (x marks) and acted on by continue, switch, compare and drop")
        self.compare_image = widgets.Image(format="png", layout=_layout(width=f"{PLOT_WIDTH}px", height="auto"))
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
            value=(0, 1), min=0, max=1, description="shown", continuous_update=False,
            style={"description_width": "40px"}, layout=_layout(width="260px"),
            tooltip="the step range shown; drag an end to zoom; at the full range the plot follows the run")
        self.read_step = NumberText(
            0, int, 0, 10**12, what="read-out step", description="read", style={"description_width": "34px"},
            layout=_layout(width="130px"),
            tooltip="read every plotted series at this step (the last row at or before it; 0: the latest step); a "
                    "dotted line marks it on the plot")
        self.counter, self.status = widgets.HTML(), widgets.HTML()
        self.table = widgets.HTML(layout=_layout(max_width="100%", overflow="auto"))  # scrolls when zoomed, never cut
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=_layout(width="220px"),
                                            tooltip="the run's progress (steps done of the steps asked for)")
        self.progress_label = widgets.HTML()
        self.validation_table, self.event_log, self.readout = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.error_box, self.export_links, self.plot_label = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.noise_panel = widgets.HTML()
        self.image = widgets.Image(format="png", layout=_layout(width=f"{PLOT_WIDTH}px", height="auto"))
        self.lower_tab: widgets.Tab | None = None

    def layout(self, plots: bool, hide: Sequence[str] = (), presentation: bool = False,
               chosen: Sequence[str] | None = None) -> list[widgets.Widget]:
        """The parts of one screen: texts on top, controls on the left, the plot on the right; in presentation
        mode the run buttons and the ``chosen`` sliders (weight keys, ``"lr"``; None: every weight and the lr)
        beside the plot, which fits the window's height, so that both show on one screen at 150 %; the other
        controls under them. ``hide`` names control groups (``GROUPS``) left out."""
        B, hidden = self.buttons, set(check_hide(hide))
        for slider in (*self.sliders.values(), self.lr_slider):  # presentation mode widens them: back to normal
            slider.layout.width = f"{LEFT_WIDTH - 44}px"
        wrap = _layout(flex_flow="row wrap", align_items="center")
        run_row = widgets.HBox([tipped(self.steps_box), B["run"], B["pause"], B["stop"], B["reinitialize"],
                                tipped(self.reinit_knobs)], layout=wrap)
        beside = set(list(self.sliders) + ["lr"] if chosen is None else chosen) if presentation else set()
        weights = widgets.VBox([*(s for k, s in self.sliders.items() if k not in beside),
                                *([] if "lr" in beside else [self.lr_slider]),
                                widgets.HBox([self.clip_toggle, self.clip_slider]), tipped(self.combine_dropdown)])
        accumulation = widgets.VBox([widgets.HTML("<div style='line-height:1.3;font-size:12px'>per task: K = minibatch "
                                                  "rounds per step (each active linked set once a round; from the "
                                                  "next step, at most 1000), batch = examples per minibatch (from "
                                                  "the next minibatch)</div>")] + [
            widgets.HBox([widgets.HTML(f"<b>{html.escape(n)}</b>", layout=_layout(width="70px")),
                          tipped(self.k_boxes[n]), tipped(self.batch_boxes[n])], layout=wrap) for n in self.k_boxes])
        stepwise = widgets.VBox([widgets.HBox([tipped(self.task_dropdown), tipped(self.set_dropdown)], layout=wrap),
                                 widgets.HBox([B[n] for n in ("minibatch", *self.calls, "apply", "step",
                                                              "reset")], layout=wrap)])
        snaps = widgets.VBox([widgets.HBox([B["fork"], tipped(self.branch_dropdown)], layout=wrap),
                              widgets.HBox([B[n] for n in ("continue", "switch", "compare", "drop")], layout=wrap),
                              widgets.HBox([tipped(self.snapshot_dropdown), B["snapshot"], B["restore"]], layout=wrap),
                              widgets.HBox([B["export_png"], B["export_svg"], B["export_csv"], B["export_journal"]],
                                           layout=wrap),
                              self.export_links])
        pages = [(g, box, title) for g, box, title in (("weights", weights, "weights"),
                                                        ("accumulation", accumulation, "batches"),
                                                        ("stepwise", stepwise, "stepwise"),
                                                        ("snapshots", snaps, BRANCHES_TAB)) if g not in hidden]
        width = "100%" if presentation else f"{LEFT_WIDTH}px"
        left_parts = [] if "run" in hidden or presentation else [run_row]
        if pages:
            left_parts.append(widgets.Tab([p[1] for p in pages], titles=tuple(p[2] for p in pages),
                                          layout=_layout(width=f"{round(LEFT_WIDTH * (1.3 if presentation else 1))}px")))
        left = widgets.VBox(left_parts, layout=_layout(width=width if not presentation else "auto", flex="0 0 auto"))
        lower = None if "log" in hidden else widgets.Tab(
            [self.readout, self.event_log, self.validation_table, self.noise_panel, self.compare_image],
            titles=("read-out", "events", "validation", "noise scale", "compare"))
        self.lower_tab = lower
        options = [] if "plot_options" in hidden or not plots else [
            widgets.HBox([self.scale_toggle, self.smoothing_slider, self.zoom, tipped(self.read_step)], layout=wrap)]
        if plots and not presentation:
            right = widgets.VBox([*options, self.plot_label, self.image, *([lower] if lower is not None else [])],
                                 layout=_layout(width=f"{PLOT_WIDTH + 10}px", flex="0 1 auto"))
        elif plots:
            right = widgets.VBox([self.image, self.plot_label], layout=_layout(width="auto", flex="1 1 auto",
                                                                               min_width="0"))
        else:
            right = widgets.VBox([lower] if lower is not None and not presentation else [], layout=_layout(flex="1 1 auto"))
        top = widgets.HBox([self.progress, self.progress_label], layout=wrap)
        if "progress" in hidden:
            top = widgets.HBox([self.progress_label], layout=wrap)
        errors = widgets.HBox([self.error_box, B["clear_error"]], layout=wrap)
        B["clear_error"].layout.display = "none"
        table = [] if "table" in hidden else [self.table]
        if presentation:  # run, pause, stop and the chosen sliders beside the plot; everything else under them
            keys = list(self.sliders) + ["lr"] if chosen is None else list(chosen)
            steer = [self.lr_slider if k == "lr" else self.sliders[k] for k in keys]
            for slider in steer:  # each on two lines (page_css): its name and value, then a track of the column's width
                slider.layout.width = "100%"
            run_now = widgets.HBox([B["run"], B["pause"], B["stop"]], layout=wrap)
            side = widgets.VBox(([] if "run" in hidden else [run_now]) + ([] if "weights" in hidden else steer),
                                layout=_layout(width=f"{PRESENT_LEFT}px", flex="0 0 auto"))
            side.add_class("mtlab-side")
            screen = widgets.HBox([side, right], layout=_layout(flex_flow="row", align_items="flex-start"))
            later = [] if "run" in hidden else [widgets.HBox([tipped(self.steps_box), B["reinitialize"],
                                                              tipped(self.reinit_knobs)], layout=wrap)]
            below = widgets.HBox([widgets.VBox([*later, left]), *([lower] if lower is not None else [])],
                                 layout=_layout(flex_flow="row wrap", align_items="flex-start"))
            return [self.counter, self.status, screen, top, errors, *options, below, *table]
        body = widgets.HBox([left, right], layout=_layout(flex_flow="row wrap", align_items="flex-start"))
        return [self.counter, top, self.status, errors, *table, body]

    def every(self) -> list[widgets.Widget]:
        """Every widget built here (to close them)."""
        return [*self.sliders.values(), self.lr_slider, self.clip_slider, self.clip_toggle, self.combine_dropdown,
                *self.buttons.values(), self.task_dropdown, self.set_dropdown, self.steps_box, self.snapshot_dropdown,
                self.reinit_knobs, self.branch_dropdown, self.compare_image,
                *self.k_boxes.values(), *self.batch_boxes.values(),
                self.scale_toggle, self.smoothing_slider, self.zoom, self.read_step, self.counter, self.status,
                self.table, self.progress, self.progress_label, self.validation_table, self.event_log, self.readout,
                self.error_box, self.export_links, self.plot_label, self.image, self.noise_panel]
