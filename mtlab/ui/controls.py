"""The dashboard's widgets, built for one screen (1280x800): every control carries a tooltip that says
what it calls and what it needs. Building only; ``dashboard.py`` wires them to the controller."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import traitlets

from ..core.columns import set_key
from ..core.knobs import KNOBS, Knob, fmt, knob_keys
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
MAX_K = 1000  # a knob's number box refuses more (a step of 10^6 minibatch rounds would never end in class)
PRESENT_LEFT = 236  # px: presentation mode's column of run buttons and chosen sliders (tracks of 200 px or more)
PLOT_WIDTH = 620  # px: the PNG is drawn at exactly this width (no downscaling by the browser)
PRESENT_TRACK = 280  # px: a slider's width in presentation mode outside the column (its track 236 px or more)


# The groups of controls ``Dashboard(hide=[...])`` can hide, and what each holds.
GROUPS = {"run": "steps box, run, pause, stop, re-initialise", "weights": "the weights tab (the knobs' sliders, dropdowns and "
          "checkboxes: weights, lr, clip, combine, ...)", "accumulation": "the batches tab (each task's number "
          "boxes: minibatches per step K, batch size, ...)",
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


WHEN = {"minibatch": "from the next minibatch on (during a run too)",
        "step": "from the next step on (a step in progress keeps its own)",
        "apply": "at the next apply() (during a run too)"}
SLIDERS = ("log", "linear")  # the controls that can sit beside the plot in presentation mode


def knob_key(knob: Knob, task: str | None, linkedset: str | None) -> str:
    """The name a dashboard gives a knob's control: the knob's name for a trainer's knob, ``"a"`` and
    ``"a/clean"`` for the weights (as ``trainer.weights()`` names them), else ``"name:a"``, ``"name:a/clean"``."""
    if task is None:
        return knob.name
    where = set_key(task, linkedset) if linkedset is not None else task
    return where if knob.name in ("weight", "task_weight") else f"{knob.name}:{where}"


def knob_what(knob: Knob, task: str | None, linkedset: str | None) -> str:
    """A knob's name on screen, as its change is put into words (``Knob.words``) less the value: ``lr``,
    ``a/noisy weight``, ``task a weight``, ``clip value``."""
    words = knob.words(None, task, linkedset)
    return words[:-len(fmt(None))].rstrip(" ->:") if words.endswith(fmt(None)) else words


def knob_tooltip(knob: Knob, task: str | None, linkedset: str | None) -> str:
    """What a knob's control calls, what the knob does and from when (its row's doc and ``when``)."""
    where = "".join(f", {k}={v!r}" for k, v in (("task", task), ("linkedset", linkedset)) if v is not None)
    kind = (knob.control or ("",))[0]
    extra = {"optional": "; untick: off (None)",
             "log": "; a value typed beyond the slider's range is clamped to its end: set it in code for another",
             "int": f"; whole numbers up to {MAX_K}"}.get(kind, "")
    return f"trainer.set({knob.name!r}, value{where}): {knob.doc or knob.name}; {WHEN.get(knob.when, 'at once')}{extra}"


class KnobControl:
    """The control of one knob of a trainer (a row of ``mtlab.core.knobs.KNOBS`` and its task and linked set),
    built from the row's ``control`` hint: ``("log", lo, hi)`` a log slider, ``("linear", lo, hi)`` a slider,
    ``("int", lo, hi)`` a number box (whole numbers from ``lo`` to ``MAX_K``), ``("choice", ...)`` a dropdown
    (the options the trainer accepts), ``("toggle",)`` a checkbox, ``("optional", lo, hi)`` a checkbox and a log
    slider (unticked: None). ``box`` is what is laid out, ``widget`` the control that takes the value. A value
    from code beyond a slider's range widens the range (``show``): the control shows the value in force."""

    def __init__(self, trainer: Trainer, knob: Knob, task: str | None, linkedset: str | None,
                 label_px: int = 110) -> None:
        assert knob.control is not None
        self.knob, self.task, self.linkedset = knob, task, linkedset
        self.name, self.kind, self.key = knob.name, str(knob.control[0]), knob_key(knob, task, linkedset)
        value = trainer.get(knob.name, task, linkedset)
        self.description = knob_what(knob, task, linkedset)
        tip = knob_tooltip(knob, task, linkedset)
        self.toggle: widgets.Checkbox | None = None
        full = f"{LEFT_WIDTH - 44}px"
        style = {"description_width": f"{label_px}px"}
        kind, hint = self.kind, knob.control[1:]
        if kind in ("log", "optional"):
            lo, hi = (float(h) for h in hint[:2])
            shown = value if isinstance(value, (int, float)) and value > 0 else math.sqrt(lo * hi)
            self.widget: widgets.Widget = widgets.FloatLogSlider(
                value=shown, base=10, min=math.log10(lo), max=math.log10(hi), step=0.05,
                description=self.description if kind == "log" else "", readout_format=".3g" if kind == "optional"
                else ".2e", continuous_update=False, tooltip=tip, disabled=kind == "optional" and value is None,
                style=style if kind == "log" else {"description_width": "0px"},
                layout=_layout(width=full if kind == "log" else f"{LEFT_WIDTH - 44 - label_px}px"))
            widen(self.widget, shown)
            self.widget.value = shown
            if kind == "optional":
                self.toggle = widgets.Checkbox(value=value is not None, description=self.description, indent=False,
                                               tooltip=tip, layout=_layout(width=f"{label_px}px", flex="0 0 auto"))
                self.box: widgets.Widget = widgets.HBox([self.toggle, self.widget])
                self.box.add_class("mtlab-knob-optional")
            else:
                self.box = self.widget
        elif kind == "linear":
            lo, hi = (float(h) for h in hint[:2])
            v = float(value) if value is not None else lo
            self.widget = widgets.FloatSlider(
                value=v, min=min(lo, v), max=max(hi, 2 * v), step=(hi - lo) / 200, description=self.description,
                readout_format=".3g", continuous_update=False, tooltip=tip, style=style, layout=_layout(width=full))
            self.box = self.widget
        elif kind == "int":
            self.widget = NumberText(int(value), int, int(hint[0]), MAX_K, what=self.description, tooltip=tip,
                                     layout=_layout(width="80px", flex="0 0 auto"))
            self.box = tipped(self.widget)
        elif kind == "choice":
            options = [o for o in hint if _accepts(trainer, knob, o, task, linkedset)]
            self.widget = widgets.Dropdown(options=options or list(hint), description=self.description, tooltip=tip,
                                           style={"description_width": "60px"}, layout=_layout(width="240px"),
                                           disabled=len(options) <= 1)
            self.show(value)
            self.box = tipped(self.widget)
        elif kind == "toggle":
            self.widget = widgets.Checkbox(value=bool(value), description=self.description, indent=False,
                                           tooltip=tip, layout=_layout(width="auto"))
            self.box = self.widget
        else:
            raise ValueError(f"knob {knob.name!r}: unknown control {knob.control!r}; one of log, linear, int, "
                             "choice, toggle, optional (mtlab.core.knobs)")
        self.width = str(self.widget.layout.width or "")  # as the dashboard lays it out (presentation widens it)

    def value(self) -> Any:
        """The value the control asks for (None: an optional knob unticked)."""
        if self.toggle is not None and not self.toggle.value:
            return None
        return self.widget.number if isinstance(self.widget, NumberText) else self.widget.value

    def show(self, value: Any) -> None:
        """Show ``value`` (the knob's value in force), widening a slider's range to hold it."""
        w = self.widget
        if isinstance(w, NumberText):
            if value is not None and w.number != value:
                w.show(value)
        elif isinstance(w, widgets.Dropdown):
            text = w.options[0] if value is None else value if isinstance(value, str) else str(value)
            if text not in w.options:
                w.options = [*w.options, text]
            w.value = text
        elif isinstance(w, widgets.Checkbox):
            w.value = bool(value)
        else:
            if self.toggle is not None:
                self.toggle.value = value is not None
                w.disabled = value is None
            if value is None:
                return
            if isinstance(w, widgets.FloatLogSlider):
                widen(w, float(value))
            else:
                w.min, w.max = min(w.min, value), max(w.max, value)
            if w.value != value:
                w.value = value

    def observe(self, fn: Callable[[Any], None]) -> None:
        """``fn(value)`` after every change of the control (the user's, or ``show``'s: tell them apart yourself)."""
        self.widget.observe(lambda ch: fn(self.value()), "number" if isinstance(self.widget, NumberText) else "value")
        if self.toggle is not None:
            self.toggle.observe(lambda ch: fn(self.value()), "value")

    def at_end(self, value: Any) -> str | None:
        """"lowest" or "highest" when ``value`` sits at an end of a log slider (a typed value clamped there)."""
        w = self.widget
        if not isinstance(w, widgets.FloatLogSlider) or not isinstance(value, (int, float)) or value <= 0:
            return None
        if value <= w.base ** w.min * (1 + 1e-6):
            return "lowest"
        return "highest" if value >= w.base ** w.max * (1 - 1e-6) else None

    def parts(self) -> list[widgets.Widget]:
        return [self.widget, *([self.toggle] if self.toggle is not None else [])]


def widen(slider: widgets.FloatLogSlider, value: float) -> None:
    """A log slider's range grown to hold ``value`` (a value set from code beyond it: ``trainer.lr = 1e-9``), to
    whole decades, so that the slider shows the value in force, never its end."""
    if not value > 0:
        return
    exponent = math.log10(value)
    if exponent < slider.min:
        slider.min = math.floor(exponent)
    if exponent > slider.max:
        slider.max = math.ceil(exponent)


def _accepts(trainer: Trainer, knob: Knob, value: Any, task: str | None, linkedset: str | None) -> bool:
    try:
        trainer.check_knob(knob.name, value, task, linkedset)
    except Exception:  # noqa: BLE001 (an option this trainer refuses is not offered)
        return False
    return True


def knob_controls(trainer: Trainer) -> dict[str, KnobControl]:
    """A control for every knob of ``trainer`` whose row has a ``control`` hint, in the table's order, the
    task and linked-set knobs task by task; a knob of a task or of every task (``task_or_all``) gets one per
    task (the knob of every task sets each)."""
    instances = []
    for knob in KNOBS.values():
        if knob.control is None:
            continue
        for task, linkedset in knob_keys(trainer, knob):
            if knob.scope == "task_or_all" and task is None:
                continue
            instances.append((knob, task, linkedset))
    order = {t: i for i, t in enumerate(trainer.tasks)}
    instances.sort(key=lambda e: (len(order) if e[1] is None else order[e[1]], e[2] is not None))  # stable: the
    # table's order within a task; the trainer's knobs after the tasks'
    words = [knob_what(k, t, s) for k, t, s in instances
             if (k.control or ("",))[0] in ("log", "linear")]
    label_px = min(max([len(w) for w in words] + [8]) * 7 + 16, 150)
    controls = [KnobControl(trainer, k, t, s, label_px) for k, t, s in instances]
    return {c.key: c for c in controls}


class Controls:
    """Every control of a dashboard, by role (see ``Dashboard``'s docstring for the names)."""

    def __init__(self, trainer: Trainer) -> None:
        # The knobs: one control per knob of the table (mtlab.core.knobs.KNOBS) with a control hint, by its key
        # (knob_key); the names below are the usual ones, kept for scripts and tests.
        self.knobs = knob_controls(trainer)
        by_name = {c.key: c.widget for c in self.knobs.values() if c.name in ("weight", "task_weight")}
        self.sliders: dict[str, widgets.Widget] = {k: by_name[k] for k in trainer.weights() if k in by_name}
        self.lr_slider: Any = self.knobs["lr"].widget if "lr" in self.knobs else None
        clip = self.knobs.get("clip_grad_value")
        self.clip_slider: Any = clip.widget if clip is not None else None
        self.clip_toggle: Any = clip.toggle if clip is not None else None
        self.combine_dropdown: Any = self.knobs["combine"].widget if "combine" in self.knobs else None
        self.k_boxes = self.per_task("minibatches_per_step")
        self.batch_boxes = self.per_task("batch_size")
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
            style={"description_width": "50px"}, layout=_layout(width="270px"),
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

    def per_task(self, name: str) -> dict[str, Any]:
        """Task -> the control of knob ``name`` of that task (e.g. the number boxes of ``batch_size``)."""
        return {c.task: c.widget for c in self.knobs.values() if c.name == name and c.task is not None
                and c.linkedset is None}

    def slider_keys(self) -> list[str]:
        """The knobs that may sit beside the plot in presentation mode (sliders), by key: ``sliders=[...]``."""
        return [k for k, c in self.knobs.items() if c.kind in SLIDERS]

    def _grid(self) -> widgets.Widget:
        """The per-task number boxes (``("int", ...)`` knobs of a task): a row per knob, a column per task."""
        rows = [n for n in dict.fromkeys(c.name for c in self.knobs.values() if c.kind == "int" and c.task is not None
                                         and c.linkedset is None)]
        tasks = list(dict.fromkeys(c.task for c in self.knobs.values() if c.task is not None))
        cells: list[widgets.Widget] = [widgets.HTML("")] + [widgets.HTML(f"<b>{html.escape(str(t))}</b>") for t in tasks]
        for name in rows:
            knob = KNOBS[name]
            cells.append(widgets.HTML(f"<span title='{html.escape(knob.doc, quote=True)}'>"
                                      f"{html.escape(knob.label or name.replace('_', ' '))}</span>"))
            for t in tasks:
                c = self.knobs.get(knob_key(knob, t, None))
                cells.append(c.box if c is not None else widgets.HTML(""))
        return widgets.GridBox(cells, layout=_layout(grid_template_columns=f"150px repeat({len(tasks)}, 90px)",
                                                     align_items="center"))

    def layout(self, plots: bool, hide: Sequence[str] = (), presentation: bool = False,
               chosen: Sequence[str] | None = None) -> list[widgets.Widget]:
        """The parts of one screen: texts on top, controls on the left, the plot on the right; in presentation
        mode the run buttons and the ``chosen`` sliders (weight keys, ``"lr"``; None: every weight and the lr)
        beside the plot, which fits the window's height, so that both show on one screen at 150 %; the other
        controls under them. ``hide`` names control groups (``GROUPS``) left out."""
        B, hidden = self.buttons, set(check_hide(hide))
        # Presentation mode: every slider on two lines (page_css), its name and value over a track of 236 px or
        # more; the dashboard's own: one line in the column's width.
        for c in self.knobs.values():
            if c.kind in SLIDERS or c.kind == "optional":
                c.widget.layout.width = f"{PRESENT_TRACK}px" if presentation else c.width
        self.smoothing_slider.layout.width = f"{PRESENT_TRACK}px" if presentation else "210px"
        self.zoom.layout.width = f"{PRESENT_TRACK}px" if presentation else "270px"
        wrap = _layout(flex_flow="row wrap", align_items="center")
        run_row = widgets.HBox([tipped(self.steps_box), B["run"], B["pause"], B["stop"], B["reinitialize"],
                                tipped(self.reinit_knobs)], layout=wrap)
        default = [k for k in self.slider_keys()]
        beside = set(default if chosen is None else chosen) if presentation else set()
        grid = [c for c in self.knobs.values() if c.kind == "int" and c.task is not None and c.linkedset is None]
        weights = widgets.VBox([c.box for k, c in self.knobs.items() if k not in beside and c not in grid])
        accumulation = widgets.VBox([widgets.HTML(f"<div style='line-height:1.3;font-size:12px'>per task, whole "
                                                  f"numbers up to {MAX_K}; each box's tooltip says what it sets "
                                                  "and from when</div>"), self._grid()])
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
        elif plots:  # "plot as of step N" over the plot: on the first screen with it
            right = widgets.VBox([self.plot_label, self.image], layout=_layout(width="auto", flex="1 1 auto",
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
            keys = default if chosen is None else list(chosen)
            steer = [self.knobs[k].box for k in keys]
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
        return [*(p for c in self.knobs.values() for p in c.parts()), *self.buttons.values(),
                self.task_dropdown, self.set_dropdown, self.steps_box, self.snapshot_dropdown,
                self.reinit_knobs, self.branch_dropdown, self.compare_image,
                self.scale_toggle, self.smoothing_slider, self.zoom, self.read_step, self.counter, self.status,
                self.table, self.progress, self.progress_label, self.validation_table, self.event_log, self.readout,
                self.error_box, self.export_links, self.plot_label, self.image, self.noise_panel]
