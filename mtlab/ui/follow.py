"""A cell's result that follows the dashboard's run: ``dash.follow(fn)`` shows ``fn()`` (a table, a figure, a
mapping, any value) and shows it again between steps while the run goes, and once more when it ends, so a
notebook run with *Run All* (whose later cells run at once, at step 0) ends on the run's final numbers instead
of an empty table.

    dash.follow(lambda: trainer.history[["step", "a/loss"]].tail())
    dash.follow(lambda: mtlab.plots.plot_history(trainer.history))

``fn`` runs in the thread that made the change (the training thread, between two steps, during a run), so it
may read the trainer's gradients and history. A redraw waits at least ``every_s`` seconds after the last one,
and longer when ``fn`` is slow, so that it takes at most ``max_share`` of the run's time, except the first after
a result of step 0 or an empty one (shown at the run's first step, whatever the pace); a result that is
empty (no row, no step yet) says so in words; an exception shows its message in the caption and the next
change tries again.
"""

from __future__ import annotations

import base64
import html
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import pandas as pd
from matplotlib.figure import Figure

from ..training.plotparts import figure_png
from .state import DashState

TABLE_CSS = "font-size: 13px; border-collapse: collapse;"


def _key(value: Any) -> str:
    return " vs ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))


def mapping_rows(value: Mapping[Any, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested mapping as ``(path, value)`` rows: ``{"enc": {("a", "b"): 0.5}}`` -> ``[("enc / a vs b", 0.5)]``."""
    rows: list[tuple[str, Any]] = []
    for k, v in value.items():
        path = f"{prefix} / {_key(k)}" if prefix else _key(k)
        rows.extend(mapping_rows(v, path) if isinstance(v, Mapping) and v else [(path, v)])
    return rows


def is_empty(value: Any) -> bool:
    """Nothing to show yet: an empty mapping, frame, sequence or string, or None."""
    if value is None:
        return True
    if isinstance(value, pd.DataFrame | pd.Series):
        return value.empty
    if isinstance(value, Mapping | list | tuple | str):
        return len(value) == 0
    return False


def value_text(value: Any) -> str:
    """``value`` as plain text (what a notebook saved without widget state, or a console, shows)."""
    if isinstance(value, pd.DataFrame | pd.Series):
        return value.to_string(float_format=lambda v: f"{v:.4g}")
    if isinstance(value, Mapping):
        rows = mapping_rows(value)
        width = max(len(p) for p, _ in rows)
        return "\n".join(f"{p:<{width}}  {v:.4g}" if isinstance(v, float) else f"{p:<{width}}  {v}" for p, v in rows)
    return str(value)


def value_html(value: Any) -> str:
    """``value`` as HTML a person reads: a frame as a table, a mapping as rows of name and value, anything
    else as its text."""
    if isinstance(value, pd.Series):
        value = value.to_frame()
    if isinstance(value, pd.DataFrame):
        return value.to_html(border=0, float_format=lambda v: f"{v:.4g}", na_rep="–").replace(
            '<table class="dataframe">', f'<table class="dataframe" style="{TABLE_CSS}">')
    if isinstance(value, Mapping):
        cells = "".join(f"<tr><td style='padding-right: 1em'>{html.escape(p)}</td><td>{_number(v)}</td></tr>"
                        for p, v in mapping_rows(value))
        return f"<table style='{TABLE_CSS}'>{cells}</table>"
    return f"<pre style='margin: 0; font-size: 13px'>{html.escape(str(value))}</pre>"


class Follow(widgets.VBox):
    """``fn()`` under a caption that says at which step it was taken; see the module docstring. ``update(state)``
    shows it again now (the dashboard calls the widget between steps)."""

    def __init__(self, fn: Callable[[], Any], state: DashState, in_flight: bool = False, every_s: float = 1.0,
                 max_share: float = 0.1) -> None:
        if not callable(fn):
            raise TypeError(f"follow(fn): fn must be a function of no arguments, e.g. lambda: trainer.history.tail(); "
                            f"got {type(fn).__name__}")
        if not every_s > 0 or not 0 < max_share <= 1:
            raise ValueError(f"follow: every_s must be > 0 and max_share in (0, 1]; got {every_s}, {max_share}")
        self.fn, self.every_s, self.max_share = fn, float(every_s), float(max_share)
        self.caption = widgets.HTML(layout=widgets.Layout(margin="0 0 2px 0"))
        self.html = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.value: Any = None  # the latest result of fn
        self.plain = ""  # what is shown, as plain text (the caption's words, then the result)
        self.error: str | None = None
        self.renders = 0
        self._lock = threading.Lock()
        self._shown: tuple[Any, ...] | None = None  # (step, running) of the result shown
        self._next = 0.0  # monotonic time before which a run's redraw waits
        self._body: widgets.Widget = self.html  # the part shown under the caption
        super().__init__([self.caption, self.html])
        self.add_class("mtlab-follow")
        if in_flight:  # a step is running in another thread: fn reads the trainer at the end of it, not now
            self.html.value = "<i>shown at the end of the step in flight</i>"
            self.caption.value = self._caption(f"step {state.step}, the run goes on")
            self.plain = f"step {state.step}, the run goes on: shown at the end of the step in flight"
        else:
            self.update(state)

    def __call__(self, state: DashState) -> None:
        """The dashboard's view: show ``fn()`` again when the step changed, at most every ``every_s`` s during
        a run, at once when the run ends or between stepwise calls."""
        key = (state.step, state.running, tuple(state.phases.values()))
        if state.run is not None and state.run.minibatch:  # inside a long step: fn reads the trainer at its end
            return
        if key == self._shown or (state.running and time.monotonic() < self._next):
            return
        self.update(state)

    def update(self, state: DashState) -> None:
        """Call ``fn`` and show its result as of ``state`` (no step in flight)."""
        with self._lock:
            t0 = time.perf_counter()
            try:
                value, self.error = self.fn(), None
            except Exception as e:  # noqa: BLE001 (shown; the run goes on and the next change tries again)
                value, self.error = None, f"{type(e).__name__}: {e}"
            self.value = value
            self._show(value, state)
            spent = time.perf_counter() - t0
            # Nothing trained yet (a cell run at step 0, under Run All): the first step is shown at once, not
            # after the pace's wait, so that it never lags the cells above it.
            self._next = 0.0 if state.step == 0 or is_empty(value) else \
                time.monotonic() + max(self.every_s, spent / self.max_share)
            self._shown = (state.step, state.running, tuple(state.phases.values()))
            self.renders += 1

    def _show(self, value: Any, state: DashState) -> None:
        when = (f"step {state.step}, the run goes on: this shows it again as it goes" if state.running
                else f"step {state.step}")
        if self.error is not None:
            self.caption.value = (f"<span style='color: #b00020'>{html.escape(when)}: {html.escape(self.error)}"
                                  "</span>")
            self.plain = f"{when}: {self.error}"
            return
        empty = is_empty(value)
        nothing = "nothing yet" + (" (no step so far)" if state.step == 0 else "")
        self.plain = f"{when}\n" + ("[figure]" if isinstance(value, Figure) else nothing if empty else value_text(value))
        if isinstance(value, Figure):
            self.image.value = figure_png(value)
            width = round(value.get_figwidth() * value.dpi)
            self.image.layout.width, self.image.layout.max_width = f"{width}px", "100%"
            body: widgets.Widget = self.image
        else:
            self.html.value = f"<i>{nothing}</i>" if empty else value_html(value)
            body = self.html
        self.caption.value = self._caption(when)
        if self._body is not body:
            self._body = body
            self.children = (self.caption, body)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # beside the widget: what it shows now, for a saved or printed page
            bundle["text/plain"] = self.plain  # the numbers, not the widget's repr
            if self._body is self.image and self.image.value:
                bundle["image/png"] = base64.b64encode(self.image.value).decode()
            else:
                bundle["text/html"] = f"{self.caption.value}<br>{self.html.value}"
        return bundle

    @staticmethod
    def _caption(text: str) -> str:
        return f"<span style='color: #555; font-size: 12px'>{html.escape(text)}</span>"

    @property
    def text(self) -> str:
        """What is on screen, as its HTML (the caption, then the table, or ``[figure]``)."""
        body = "[figure]" if self._body is self.image else self.html.value
        return f"{self.caption.value}\n{body}"

    def __repr__(self) -> str:
        return f"Follow({self.plain.splitlines()[0] if self.plain else ''!r})"
