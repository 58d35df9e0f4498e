"""The dashboard's texts: tooltips, run-end reasons, refusals, and the HTML of the counter, the
state table, the validation table and the event log (plain functions of the trainer's state)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.accumulator import Accumulator, Phase
from ..core.columns import noise_column, set_key, split_key
from ..core.trainer import Trainer
from ..core.transforms import Call
from .state import DashState

BUSY = tuple(str(p) for p in Phase if p not in (Phase.EMPTY, Phase.APPLIED))

REASONS = {"steps": "the steps asked for are done", "stopped": "stopped",
           "interrupted": "interrupted (Kernel -> Interrupt)",
           "done": "the schedule is finished", "num_tries": "validation stopped it (num_tries)",
           "relative_improvement": "validation stopped it (relative improvement under the threshold)", "error": "error"}

TOOLTIPS = {
    "minibatch": "process_minibatch(task, set): forward, weighted loss, backward, add into the task's accumulators. "
                 "Needs: the task not normalized/clipped yet (apply or reset first); no run going (pause it).",
    "normalize": "normalize(): divide each accumulating task's gradients by its accumulated normalizer Σ w·normalizer. "
                 "Needs: minibatches processed first.",
    "clip": "clip(): clamp every gradient element to ±clip value; records norms and the share clipped. "
            "Needs: normalize() first.",
    "apply": "apply(): one optimizer step on Σ task weight × gradient; counts a step and writes a history row. "
             "Needs: normalize() and clip() (when clipping is on) first.",
    "step": "step(): a whole cycle (every active linked set × K, normalize, clip, apply). If you processed "
            "minibatches by hand, it finishes that accumulation instead (normalize, clip, apply). Needs: no run going.",
    "reset": "reset(): discard what every task accumulated (phase back to empty). Needs: nothing.",
    "run": "Train in the background through the training loop (lr decay, validation) for 'steps' more steps, whatever "
           "the schedule's state: a finished schedule is continued with its own rules (0: to the schedule's end, or "
           "until stopped once it has ended). Needs: no run of this trainer going, nothing accumulated by hand.",
    "pause": "Pause the run after the current step (stepwise buttons work while paused); click again to resume. "
             "Needs: a run going.",
    "stop": "Stop the run of this trainer after the current step (whichever dashboard started it). Needs: a run going.",
    "snapshot": "Snapshot: keep an in-memory copy of the whole state (trainer.state_dict(): weights, optimizer, step, history). "
                "During a run it is taken at the end of the current step.",
    "restore": "Restore: go back to the snapshot chosen at the left (trainer.load_state_dict); the abandoned branch stays on the plot, grey. "
               "Needs: a snapshot taken first.",
    "export_png": "Write the current figure as PNG into the export folder and offer a download link.",
    "export_svg": "Write the current figure as SVG into the export folder and offer a download link.",
    "export_csv": "Write trainer.history as CSV into the export folder and offer a download link.",
    "clear_error": "Clear the error details below.",
    "reinitialize": "Re-initialise: trainer.reinitialize(): back to the initial weights, a fresh optimizer state, the data "
                    "and RNG of a freshly built trainer, step 0; the knobs as chosen beside it (kept as set, or the starting "
                    "knobs again); the old curves stay grey on the plot (an abandoned branch) and its event marks go. "
                    "Unlike reset, which only discards the accumulation in progress. During a run it happens at the end "
                    "of the current step.",
    "fork": "trainer.fork(): a branch of the trainer as it is now, that trains on independently (from a snapshot: "
            "controller.fork(index=i)); kept in dashboard.controller.branches and chosen in the branch selector; "
            "continue trains it, its lines (x marks) join the plot.",
    "continue": "Train the chosen branch 'steps' more steps (0: 10) in a background thread of its own; its loss and "
                "gradient norm (x marks) grow on the plot beside the run's.",
    "switch": "Drive the chosen branch from this dashboard (dash.trainer); the trainer driven until now becomes a "
              "branch. Needs: nothing training.",
    "compare": "Draw every branch and the trainer driven side by side (mtlab.plots.plot_runs), with what sets them "
               "apart in words, in the compare tab under the plot.",
    "drop": "Forget the chosen branch. Needs: the branch not training.",
    "export_journal": "Write trainer.journal as journal.jsonl into the export folder and offer a download link "
                      "(mtlab.replay reruns it bit for bit).",
}



def call_buttons(trainer: Trainer) -> list[str]:
    """The chain's calls a dashboard offers a button for: normalize and clip always (a setting may add them to
    the chain), then every other call of the trainer's chain (a user's transform), in chain order."""
    return list(dict.fromkeys([str(Call.NORMALIZE), str(Call.CLIP), *trainer.chain.calls()]))


def call_tooltip(trainer: Trainer, call: str) -> str:
    """The tooltip of a call's button: the built-in text, or what the chain's transforms of that call do."""
    if call in TOOLTIPS:
        return TOOLTIPS[call]
    parts = "; ".join(f"{t!r}: {t.describe()}" for t in trainer.chain.of_call(call))
    return f"{call}(): {parts}. Needs: the calls before it in the chain ({', '.join(trainer.chain.calls())}) first."

def fmt(v: object) -> str:
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


def run_refusal(trainer: Trainer) -> str | None:
    """Why a background run would fail or end at once (checked before starting a thread), or None.
    Every reason names what to click; a finished schedule is no reason (the run continues it)."""
    skipped = skipped_tasks(trainer)
    if len(skipped) == len(trainer.tasks):
        listed = "; ".join(f"{n}: {r}" for n, r in skipped.items())
        return f"every task is skipped ({listed}); raise a weight slider first"
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
                return (f"linked set {sname!r} of task {name!r} has no training examples (explicit batches only); "
                        f"a run draws minibatches: set the {set_key(name, sname)} weight slider to 0 first")
    return None


def counter_html(state: DashState) -> str:
    """``step N · phases · run state (steps/s) · skipped tasks`` of one state."""
    phases = ", ".join(f"{html.escape(n)}: <i>{html.escape(p)}</i>" for n, p in state.phases.items())
    run = state.run
    text = f"<b>step {state.step}</b> &middot; {phases}"
    if run is not None and run.state != "ended":
        text += f" &middot; {run.state} ({run.rate:.2f} steps/s)"
    if run is not None and run.minibatch:  # a long step, as it goes (the journal's numbering)
        text += f" &middot; step {state.step}, minibatch {run.minibatch} of {run.minibatches}"
    if state.skipped:
        text += (" &middot; <span style='color:#b35900'>skipped by step(): " +
                 "; ".join(f"{html.escape(n)} ({html.escape(w)})" for n, w in state.skipped.items()) + "</span>")
    return text


def progress_html(state: DashState) -> str:
    """``done/total steps · ETA · steps/s · elapsed`` of the run shown (``""`` before the first run)."""
    run = state.run
    if run is None:
        return state.schedule
    if run.total:
        eta = (run.total - run.steps_done) / run.rate if run.rate > 0 and run.steps_done else float("nan")
        text = f"{run.steps_done}/{run.total} steps"
        text += f" &middot; ETA {clock(eta)}" if math.isfinite(eta) and run.state != "ended" else ""
    else:  # no end known: no bar (a full bar would claim the run is done)
        text = f"{run.steps_done} steps (until stopped)"
    text += f" &middot; {run.rate:.2f} steps/s &middot; elapsed {clock(run.elapsed)}"
    if run.state == "paused":
        text += " &middot; paused"
    elif run.state == "ended":  # where it ended: a restore or re-initialise since moves the step, not the run's end
        at = f" at step {run.end_step}" if run.end_step is not None else ""
        text += f" &middot; ended{at} ({html.escape(str(run.reason))})"
    return text + (f"<br>{state.schedule}" if state.schedule else "")


def status_html(state: DashState) -> str:
    """The status line, red while it reports an error."""
    color = "#b00020" if state.status_error else "#555"
    return f"<span style='color:{color}'>{html.escape(state.status)}</span>"


def error_html(state: DashState) -> str:
    """One collapsible traceback (the latest), never a growing pile."""
    if not state.error:
        return ""
    first = state.error.strip().splitlines()[-1].split(":")[0]
    return (f"<details><summary style='color:#b00020;cursor:pointer'>error details: {html.escape(first)} "
            f"(click to expand)</summary><pre style='font-size:11px;max-height:300px;overflow:auto'>"
            f"{html.escape(state.error)}</pre></details>")


def model_norms(st: Accumulator) -> str:
    """Gradient norm per model of a task state (``enc 0.12, head 0.3``)."""
    norms = st.model_grad_norms() if st.model_norms else (st.norms()[0] if st.minibatches else {})
    return ", ".join(f"{m} {float(v):.3g}" for m, v in norms.items())


TABLE_STYLE = ("<style>.mtlab-state td,.mtlab-state th,.mtlab-valid td,.mtlab-valid th{padding:1px 8px;line-height:16px;"
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
    return (f"{TABLE_STYLE}<table class='mtlab-state'>{head}{''.join(body)}</table>"
            "<div style='font-size:11px;line-height:1.3;color:#555'>Σ w·loss, Σ w·norm: loss and normalizer (frames, "
            "examples) summed over the minibatches, each times its linked set's weight w · loss/norm: their ratio · "
            "clipped: share of gradient elements clip() clamped</div>")


def validation_html(records: Sequence[Mapping[str, Any]], last: int = 12) -> str:
    """One row per validation of the loop (as fastai shows them): step, each task, total, lr, action."""
    if not records:
        return ""
    skip = ("step", "loss", "lr", "lr_scale", "tries", "best", "action")
    keys = [k for k in records[-1] if k not in skip and not split_key(k)[1]]  # the tasks' (not their sets')
    head = "<tr><th>step</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + \
           "<th>valid loss</th><th>lr</th><th>action</th></tr>"
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(k))}</td>" for k in ("step", *keys, "loss", "lr", "action"))
                   + "</tr>" for r in records[-last:])
    return f"{TABLE_STYLE}<b>validation</b><table class='mtlab-valid'>{head}{body}</table>"


def events_html(events: Sequence[tuple[int, str]], last: int = 12, places: Sequence[str] = ()) -> str:
    """The numbered event log (numbers match the triangles on the plot); ``places``: where each happened, in the
    journal's numbering (default ``step N``)."""
    if not events:
        return ""
    items = "".join(f"<li value='{i}'>{html.escape(places[i - 1] if i - 1 < len(places) else f'step {s}')}: "
                    f"{html.escape(t)}</li>" for i, (s, t) in list(enumerate(events, start=1))[-last:])
    return (f"<div style='font-size:12px'><b>events</b> (numbered triangles on the plot)"
            f"<ol style='margin:0'>{items}</ol></div>")


BRANCHES_TAB = "branches"  # the title of the tab with fork, snapshots and export (controls.py builds it)


def journal_html(lines: Sequence[str]) -> str:
    """What the journal holds, in one line: its changes are the events above, in the same numbering (listing
    them again, worded otherwise, would show each change twice)."""
    if not lines:
        return "<div style='font-size:12px'><b>journal</b>: no knob change yet</div>"
    return (f"<div style='font-size:12px'><b>journal</b>: {len(lines)} change(s) recorded, where and by whom "
            f"(trainer.journal.lines()); export: the {BRANCHES_TAB} tab</div>")


def noise_html(trainer: Trainer) -> str:
    """Each task's gradient noise scale from the latest history row, its message and suggested minibatches."""
    noise = trainer.noise_scale
    if noise is None:
        return ("<div style='font-size:12px'>gradient noise scale: off; build the trainer with "
                "<code>noise_scale=True</code> (and two or more minibatches per step) to measure it</div>")
    rows = trainer.log.rows()  # read by the dashboard's collection already: no new device read
    last = rows[-1] if rows else {}
    cells = []
    for task in trainer.tasks:
        value, per_step = last.get(noise_column(task)), last.get(noise_column(task, part="gns_minibatches"))
        shown = f"{value:.3g}" if isinstance(value, float) and math.isfinite(value) else "n/a"
        k = (f"{max(1, math.ceil(per_step))}" if isinstance(per_step, float) and math.isfinite(per_step)
             and per_step > 0 else "n/a")
        cells.append(f"<tr><td>{html.escape(task)}</td><td>{shown}</td><td>{k}</td>"
                     f"<td>{html.escape(noise.message(task))}</td></tr>")
    return ("<div style='font-size:12px'><b>gradient noise scale</b> B_simple (normalizer units, EMA)"
            "<table><tr><th>task</th><th>B_simple</th><th>minibatches/step</th><th></th></tr>"
            + "".join(cells) + "</table></div>")

