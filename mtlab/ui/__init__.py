"""Notebook UI for mtlab (extra ``mtlab[notebook]``): a live dashboard and plotting helpers.

Examples:
    >>> import mtlab.ui  # doctest: +SKIP
    >>> mtlab.ui.dashboard(trainer)          # sliders, stepwise buttons, background run, live plots  # doctest: +SKIP
    >>> # an experiment: its runs follow exp.schedule (lr decay, validation)
    >>> mtlab.ui.dashboard(exp)  # doctest: +SKIP
    >>> mtlab.ui.stop_all()                 # stop every background run (also: Kernel -> Interrupt)  # doctest: +SKIP
    >>> mtlab.plots.plot_losses(trainer.history).savefig("losses.png")  # doctest: +SKIP

Figures of a history are ``mtlab.plots`` (``mtlab.training.plots``); the dashboard's live figure is
``mtlab.ui.liveplot.LivePlot``.

The dashboard is a view of ``mtlab.ui.controller.Controller``, which needs no widgets: scripts and
tests drive it without ipywidgets; the widgets (``Dashboard``) and the plots load on first use.
"""

from __future__ import annotations

from typing import Any

from . import runs
from .runs import Run, current_run, stop_all

_LAZY = {"Dashboard": "view", "dashboard": "view", "Controller": "controller"}


def __getattr__(name: str) -> Any:
    """``Dashboard`` and ``dashboard`` import ipywidgets: only when asked for (``Controller`` never)."""
    if name == "plots":
        raise AttributeError("mtlab.ui.plots is gone: figures of a history are mtlab.plots (mtlab.training.plots), "
                             "the dashboard's live figure is mtlab.ui.liveplot.LivePlot")
    if name not in _LAZY:
        raise AttributeError(f"module 'mtlab.ui' has no attribute {name!r}")
    if name == "Controller":  # headless: no widgets needed
        from .controller import Controller

        globals()[name] = Controller
        return Controller
    try:
        import ipywidgets  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"mtlab.ui.{name} needs ipywidgets and matplotlib ({exc.name} is missing); "
                          'install them with: pip install "mtlab[notebook]"') from exc
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["Controller", "Dashboard", "Run", "current_run", "dashboard", "runs", "stop_all"]
