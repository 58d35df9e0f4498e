"""The dashboard's plots: ``mtlab.plots`` (figures of a trainer's history and the ``LivePlot``), here under
the name the notebooks use (``mtlab.ui.plots.plot_losses(trainer.history)``)."""

from ..training.plots import (  # noqa: F401
    MAX_POINTS, LIVE_POINTS, DPI, PANELS, TITLES, PALETTE, SET_DASHES, GHOST, MAX_EVENT_MARKS, panel_of,
    task_colors, tasks_in, thin, smooth, as_frame, series_from_frame, validation_series, events_from_frame,
    plot_losses, plot_grad_norms, plot_clip_fraction, plot_history, figure_png, figure_svg, save_plots,
    LivePlot, Series
)
