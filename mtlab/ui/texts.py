"""The dashboard's texts: tooltips, run-end reasons, refusals, and the HTML of the counter, the
state table, the validation table and the event log (plain functions of the trainer's state)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import torch

from ..core.trainer import Trainer

STEPWISE = ("minibatch", "normalize", "clip", "apply", "step", "reset")
BUSY = ("accumulating", "normalized", "clipped")

REASONS = {"steps": "the steps asked for are done", "stopped": "stopped",
           "interrupted": "interrupted (Kernel -> Interrupt)",
           "done": "the schedule is finished", "num_tries": "validation stopped it (num_tries)",
           "relative_improvement": "validation stopped it (relative improvement under the threshold)", "error": "error"}

TOOLTIPS = {
    "minibatch": "process_minibatch(task, set): forward, weighted loss, backward, add into the task's accumulators. "
                 "Needs: the task not normalized/clipped yet (apply or reset first); no run going (pause it).",
    "normalize": "normalize(): divide each accumulating task's gradients by its accumulated norm Σ w·norm. "
                 "Needs: minibatches processed first.",
    "clip": "clip(): clamp every gradient element to ±clip value; records norms and the share clipped. "
            "Needs: normalize() first.",
    "apply": "apply(): one optimizer step on Σ task weight × gradient; counts a step and writes a history row. "
             "Needs: normalize() and clip() (when clipping is on) first.",
    "step": "step(): a whole cycle (every active linked set × K, normalize, clip, apply). If you processed "
            "minibatches by hand, it finishes that accumulation instead (normalize, clip, apply). Needs: no run going.",
    "reset": "reset(): discard what every task accumulated (phase back to empty). Needs: nothing.",
    "run": "Train in the background through the training loop (lr decay, validation) for 'steps' steps "
           "(0: until stopped or the schedule ends). Needs: no run of this trainer going, nothing accumulated by hand.",
    "pause": "Pause the run after the current step (stepwise buttons work while paused); click again to resume. "
             "Needs: a run going.",
    "stop": "Stop the run of this trainer after the current step (whichever dashboard started it). Needs: a run going.",
    "snapshot": "snapshot(): keep an in-memory copy of the whole state (weights, optimizer, step, history). "
                "During a run it is taken at the end of the current step.",
    "restore": "restore(): go back to the snapshot chosen at the left; the abandoned branch stays on the plot, grey. "
               "Needs: a snapshot taken first.",
    "export_png": "Write the current figure as PNG into the export folder and offer a download link.",
    "export_svg": "Write the current figure as SVG into the export folder and offer a download link.",
    "export_csv": "Write trainer.history as CSV into the export folder and offer a download link.",
    "clear_error": "Clear the error details below.",
}


def fmt(v: Any) -> str:
    """A table cell: floats to 4 significant digits, everything escaped."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def clock(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def skipped_tasks(trainer: Trainer) -> dict[str, str]:
    """Tasks ``step()`` leaves out, with the reason (task weight 0, or every linked set weight 0)."""
    out = {}
    for name, t in trainer.tasks.items():
        if t.weight == 0:
            out[name] = "task weight 0"
        elif all(ls.weight == 0 for ls in t.linkedsets.values()):
            out[name] = "all its linked sets have weight 0"
    return out


def run_refusal(trainer: Trainer, schedule: Any = None) -> str | None:
    """Why a background run would fail or end at once (checked before starting a thread), or None."""
    if schedule is not None and (getattr(schedule, "stopped", None) or trainer.step_count >= schedule.num_steps):
        why = f"validation stopped it ({schedule.stopped})" if getattr(schedule, "stopped", None) else \
            f"step {trainer.step_count} of its {schedule.num_steps}"
        return (f"the schedule is finished ({why}); set dash.schedule to a new mtlab.Schedule, or to None to "
                "train at the current lr until stopped")
    skipped = skipped_tasks(trainer)
    if len(skipped) == len(trainer.tasks):
        listed = "; ".join(f"{n}: {r}" for n, r in skipped.items())
        return f"every task is skipped ({listed}); raise a weight first"
    busy = {n: trainer.state(n).minibatches for n, p in trainer.phase().items() if p in BUSY}
    if busy:
        parts = ", ".join(f"{n}: {k} minibatch(es), {trainer.phase()[n]}" for n, k in busy.items())
        return (f"minibatches were accumulated by hand ({parts}); a run would discard them. "
                "Click step to finish that accumulation, or reset to discard it, first")
    for name, t in trainer.tasks.items():
        if name in skipped:
            continue
        for sname, ls in t.linkedsets.items():
            if ls.weight > 0 and ls.examples is None:
                return (f"linked set {sname!r} of task {name!r} has no examples (explicit batches only); "
                        "a run draws minibatches from examples: set its weight to 0 or give it examples")
    return None


def counter_html(trainer: Trainer, run: Any = None) -> str:
    """``step N · phases · run state (steps/s) · skipped tasks``."""
    phases = ", ".join(f"{n}: <i>{getattr(p, 'value', p)}</i>" for n, p in trainer.phase().items())
    state = ""
    if run is not None and run.alive:
        state = f" &middot; {run.state} ({run.rate():.2f} steps/s)"
    skipped = skipped_tasks(trainer)
    skip = ""
    if skipped:
        skip = (" &middot; <span style='color:#b35900'>skipped by step(): " +
                "; ".join(f"{html.escape(n)} ({html.escape(w)})" for n, w in skipped.items()) + "</span>")
    return f"<b>step {trainer.step_count}</b> &middot; {phases}{state}{skip}"


def model_norms(st: Any) -> str:
    """Gradient norm per model of a task state (``enc 0.12, head 0.3``)."""
    norms = st.model_grad_norms() if st.model_norms else (st.norms()[0] if st.minibatches else {})
    return ", ".join(f"{m} {float(v):.3g}" for m, v in norms.items())


TABLE_STYLE = ("<style>.mtlab-state td,.mtlab-state th,.mtlab-valid td,.mtlab-valid th{padding:1px 8px;"
               "text-align:right;font-size:12px;white-space:nowrap}</style>")


def state_table_html(trainer: Trainer) -> str:
    """One row per task: phase (and why it is skipped), accumulation, norms, share clipped."""
    head = ("<tr><th>task</th><th>phase</th><th>minibatches</th><th>Σ w·loss</th><th>Σ w·norm</th>"
            "<th>loss/norm</th><th>grad norm per model</th><th>clipped norm</th><th>clipped</th></tr>")
    body = []
    skipped = skipped_tasks(trainer)
    for name in trainer.tasks:
        st = trainer.state(name)
        s = st.summary()
        phase = str(getattr(s["phase"], "value", s["phase"]))
        if name in skipped:
            phase = f"{phase}; skipped ({skipped[name]})"
        clip_frac = s["clip_fraction"]
        body.append("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in (
            name, phase, s["minibatches"], s["loss"], s["normalizer"],
            s["normalized_loss"] if s["minibatches"] else None, model_norms(st),
            s["grad_norm_clipped"], None if clip_frac is None else f"{100 * float(clip_frac):.2g}%")) + "</tr>")
    return f"{TABLE_STYLE}<table class='mtlab-state'>{head}{''.join(body)}</table>"


def validation_html(records: Sequence[dict[str, Any]], last: int = 12) -> str:
    """One row per validation of the loop (as fastai shows them): step, each task, total, lr, action."""
    if not records:
        return ""
    skip = ("step", "loss", "lr", "lr_scale", "tries", "best", "action")
    keys = [k for k in records[-1] if k not in skip and "/" not in k]
    head = "<tr><th>step</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + \
           "<th>valid loss</th><th>lr</th><th>action</th></tr>"
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(k))}</td>" for k in ("step", *keys, "loss", "lr", "action"))
                   + "</tr>" for r in records[-last:])
    return f"{TABLE_STYLE}<b>validation</b><table class='mtlab-valid'>{head}{body}</table>"


def events_html(events: Sequence[tuple[int, str]], last: int = 12) -> str:
    """The numbered event log (numbers match the triangles on the plot)."""
    if not events:
        return ""
    items = "".join(f"<li value='{i}'>step {s}: {html.escape(t)}</li>"
                    for i, (s, t) in list(enumerate(events, start=1))[-last:])
    return (f"<div style='font-size:12px'><b>events</b> (numbered triangles on the plot)"
            f"<ol style='margin:0'>{items}</ol></div>")
