"""A y range too short to read (one point, a flat line) is widened, never magnified: every panel of
``plot_history`` shows distinct tick labels, and two values equal but for rounding are drawn close, not at the
two ends of the axis. Measured on the drawn figure (the tick texts matplotlib renders, the limits)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

import mtlab  # noqa: E402
from helpers import make_examples, make_models, task_a  # noqa: E402
from mtlab.training import plots  # noqa: E402


def shown_ticks(ax) -> list[str]:
    """The y tick labels drawn inside the axes' limits."""
    lo, hi = sorted(ax.get_ylim())
    return [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi and t.get_text()]


def panels(fig) -> list:
    FigureCanvasAgg(fig).draw()
    return [ax for ax in fig.axes if ax.get_title()]


def test_a_one_step_history_has_distinct_tick_labels_on_every_panel(one_thread) -> None:
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, clip_grad_value=0.5, device="cpu")
    tr.step()
    axes = panels(plots.plot_history(tr.history))
    assert axes
    for ax in axes:
        ticks = shown_ticks(ax)
        assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), (ax.get_title(), ax.get_ylim(), ticks)
        lo, hi = sorted(ax.get_xlim())  # the step axis: whole steps only (one point once read 0.8, 0.9, 1.0, ...)
        steps = [v for v in ax.get_xticks() if lo <= v <= hi]
        assert steps and all(float(v).is_integer() for v in steps), (ax.get_title(), ax.get_xlim(), steps)


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_values_equal_but_for_rounding_are_drawn_close(scale: str) -> None:
    history = pd.DataFrame({"step": [1, 2, 3], "lr": [1e-3] * 3, "skipped": [False] * 3,
                            "a/loss": [0.15101, 0.15102, 0.15101], "a/grad_norm": [0.459, 0.459, 0.459]})
    for ax in panels(plots.plot_history(history, scale=scale)):
        lo, hi = ax.get_ylim()
        ys = [float(y) for ln in ax.lines for y in ln.get_ydata()]
        if ax.get_yscale() == "log":
            assert hi / lo >= 10 ** (plots.FLAT_DECADES * 0.99), (ax.get_title(), lo, hi)
        else:
            assert hi - lo >= plots.FLAT_SHARE * max(ys) * 0.99, (ax.get_title(), lo, hi)
        assert lo <= min(ys) and max(ys) <= hi
        ticks = shown_ticks(ax)
        assert len(set(ticks)) == len(ticks), (ax.get_title(), ticks)
