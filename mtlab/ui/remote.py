"""The dashboard of a job in another process: ``job.dashboard()`` (``mtlab.attach``).

The dashboard's own pieces, fed by the job instead of a trainer of this kernel: the live figure (``LivePlot``)
over the job's history (``SeriesStore``), a control for every knob of the knob table (its ``control`` hint) and
every task and linked set it applies to, each moving the knob through ``job.set`` (in force at the job's next
minibatch, said in the status line with where), pause, resume, stop and detach, the change log (the job's
journal, changes from every source) and a status line: the step, who steers, and how the job ended or that it
died, never a plot that stops without a word. ``JobView`` holds all of it without widgets (tests drive it); the
widget ``JobDashboard`` is its view, refreshed by a thread every ``refresh_s`` seconds while the job runs.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import ipywidgets as widgets

from ..core.knobtable import change_words
from ..remote.client import Job
from ..remote.wire import AttachError
from .controls import PLOT_WIDTH
from .liveplot import LivePlot
from .state import SeriesStore


class JobView:
    """What a job's dashboard knows: its history as series, its change log, its status; ``refresh()`` reads
    what is new, ``set(...)`` moves a knob (the status says where it took effect, or why it was refused)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.data = SeriesStore()
        self.status = ""
        self.error = False
        self.lines: list[str] = []
        self._seen = 0
        self._adapter = SimpleNamespace(log=SimpleNamespace(rows=job.rows), step_count=0)

    @property
    def over(self) -> bool:
        """The job has ended or died (nothing more will come)."""
        return self.job.ended is not None

    def refresh(self) -> None:
        """New rows and changes from the job, and the status line."""
        try:
            self._adapter.step_count = self.job.step
            self.data.collect(self._adapter)  # type: ignore[arg-type]  # a trainer's log and step, from the job
            changes = self.job.changes()
        except AttachError as exc:
            self.status, self.error = str(exc), True
            return
        for e in changes[self._seen:]:
            words = change_words(e) or e["kind"]
            self.data.event(int(e["step"]), words, int(e.get("minibatch", 0)))
            where = f"step {e['step']}" + (f", minibatch {e['minibatch']}" if e.get("minibatch") else "")
            self.lines.append(f"{where}: {words} ({e.get('source')})")
        self._seen = len(changes)
        s = self.job.status()
        if self.job.ended is not None:
            self.status, self.error = str(self.job.ended), True
        elif not self.error or not self.status.startswith("refused"):
            who = f"; steered by {s['steered_by']}" if s.get("steered_by") else ""
            self.status, self.error = f"{s.get('state')} at step {s.get('step')} of {s.get('num_steps')}{who}", False

    def set(self, name: str, value: Any, task: str | None = None, linkedset: str | None = None) -> bool:
        """``job.set``; the status line says where it took effect (or why not). True when in force."""
        try:
            applied = self.job.set(name, value, task, linkedset, timeout=30.0)
        except Exception as exc:  # noqa: BLE001 (a refusal or a lost job: shown, the dashboard goes on)
            self.status, self.error = f"refused: {exc}", True
            return False
        self.status, self.error = str(applied), False
        return applied.in_force

    def command(self, name: str) -> None:
        """pause, resume, stop (not waiting for the end) or detach, said in the status line."""
        try:
            if name == "stop":
                self.status = f"stop: {self.job.stop(wait=False)} (final.pt is written before the job ends)"
            elif name == "pause":
                self.status = f"pause: {self.job.pause(wait=False)} (before the next step)"
            elif name == "detach":
                self.job.detach()
                self.status = "detached: the job goes on; mtlab.attach(expdir) attaches again"
            else:
                self.status = f"resume: {self.job.resume()}"
            self.error = False
        except AttachError as exc:
            self.status, self.error = str(exc), True


def _control(row: dict[str, Any], value: Any, label: str) -> widgets.Widget | None:
    """The widget of a knob row's ``control`` hint, showing ``value``."""
    kind = row["control"][0]
    style, layout = {"description_width": "160px"}, widgets.Layout(width="420px")
    common: dict[str, Any] = {"description": label, "style": style, "layout": layout, "continuous_update": False}
    if kind == "log":
        lo, hi = row["control"][1:3]
        import math

        return widgets.FloatLogSlider(value=value, base=10, min=math.log10(lo), max=math.log10(hi), **common)
    if kind in ("linear", "optional"):
        lo, hi = row["control"][1:3]
        return widgets.FloatSlider(value=lo if value is None else value, min=lo, max=max(hi, value or hi),
                                   step=(hi - lo) / 200, **common)
    if kind == "int":
        lo, hi = row["control"][1:3]
        return widgets.IntSlider(value=value, min=lo, max=max(hi, value), **common)
    if kind == "choice":
        options = list(row["control"][1:])
        return widgets.Dropdown(options=options, value=value if value in options else options[0], description=label,
                                style=style, layout=layout)
    if kind == "toggle":
        return widgets.Checkbox(value=bool(value), description=label, style=style, layout=layout)
    return None


class JobDashboard(widgets.VBox):
    """The dashboard of a job (``job.dashboard()``): ``view`` (a ``JobView``) holds the state; ``controls``
    maps ``(name, task, linkedset)`` to its widget; ``status``, ``image``, ``changes_box`` (the change log) and
    ``buttons`` are the rest."""

    def __init__(self, job: Job, refresh_s: float = 1.0, plots: bool = True) -> None:
        self.view = JobView(job)
        self.refresh_s = float(refresh_s)
        self.live = LivePlot(list(job.info["tasks"]), width_px=PLOT_WIDTH) if plots else None
        self.title = widgets.HTML(f"<b>{job.info.get('name') or 'job'}</b> in <code>{job.info.get('expdir')}</code> "
                                  f"({job.info.get('world_size')} rank(s), {job.info.get('address')})")
        self.status = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.changes_box = widgets.HTML()
        self.buttons = {n: widgets.Button(description=n) for n in ("pause", "resume", "stop", "detach")}
        for name, b in self.buttons.items():
            b.on_click(lambda _b, name=name: self._command(name))
        rows = {r["name"]: r for r in job.info["knob_table"]}
        self.controls: dict[tuple[str, str | None, str | None], widgets.Widget] = {}
        for k in job.info["knobs"]:
            row = rows.get(k["name"])
            if row is None or not row.get("control"):
                continue
            where = "/".join(p for p in (k["task"], k["linkedset"]) if p)
            w = _control(row, k["value"], f"{row.get('label') or k['name']}" + (f" {where}" if where else ""))
            if w is None:
                continue
            key = (k["name"], k["task"], k["linkedset"])
            w.observe(lambda change, key=key: self._moved(key, change["new"]), names="value")
            self.controls[key] = w
        super().__init__([self.title, self.status, widgets.HBox(list(self.buttons.values())), self.image,
                          widgets.VBox(list(self.controls.values())), self.changes_box])
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._follow, name="mtlab-job-dashboard", daemon=True)
        self._thread.start()

    def _moved(self, key: tuple[str, str | None, str | None], value: Any) -> None:
        name, task, linkedset = key
        self.view.set(name, value, task, linkedset)
        self.render()

    def _command(self, name: str) -> None:
        self.view.command(name)
        if name == "detach":
            self._stop.set()
        self.render()

    def refresh(self) -> None:
        """Read what is new from the job and show it."""
        if not self.view.job.ended and not self._detached():
            self.view.refresh()
        self.render()

    def _detached(self) -> bool:
        return self.view.status.startswith("detached")

    def render(self) -> None:
        """Put the view's state on screen (the figure, the status, the log)."""
        v = self.view
        colour = "#b00" if v.error else "#333"
        self.status.value = f"<span style='color:{colour}'>{v.status}</span>"
        self.changes_box.value = "<br>".join(v.lines[-12:]) or "no change yet"
        if self.live is not None and v.data.series:
            data = v.data.copy()
            self.live.update(data.series, step=data.step, events=data.marks())
            self.image.value = self.live.png()
        for b in self.buttons.values():
            b.disabled = v.over or self._detached()

    def _follow(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()
            if self.view.over or self._detached():
                return

    def close(self) -> None:
        """Stop following the job (the job goes on) and close the widget."""
        self._stop.set()
        super().close()


def dashboard(job: Job, **kwargs: Any) -> JobDashboard:
    """The dashboard bound to ``job`` (``job.dashboard()``)."""
    return JobDashboard(job, **kwargs)


__all__ = ["JobDashboard", "JobView", "dashboard"]
