"""Notebook UI for mtlab (extra ``mtlab[notebook]``): a live dashboard and plotting helpers.

>>> import mtlab.ui
>>> mtlab.ui.dashboard(trainer)          # sliders, stepwise buttons, background run, live plots
>>> mtlab.ui.dashboard(exp)              # an experiment: its runs follow exp.schedule (lr decay, validation)
>>> mtlab.ui.stop_all()                 # stop every background run (also: Kernel -> Interrupt)
>>> mtlab.ui.plots.plot_losses(trainer.history).savefig("losses.png")
"""

from __future__ import annotations

try:
    import ipywidgets  # noqa: F401
    import matplotlib  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test that hides ipywidgets
    raise ImportError(
        f"mtlab.ui needs ipywidgets and matplotlib ({exc.name} is missing); "
        'install them with: pip install "mtlab[notebook]"'
    ) from exc

from . import plots, runs
from .dashboard import Dashboard, dashboard
from .runs import Run, current_run, stop_all

__all__ = ["Dashboard", "Run", "current_run", "dashboard", "plots", "runs", "stop_all"]
