"""``mtlab.plots.plot_noise_scale``: every series (a task, a task's model) its own colour and dash, readable."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

from helpers.figures import readability  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from mtlab import plots  # noqa: E402


def test_every_series_of_the_noise_scale_figure_is_distinct():
    import pandas as pd

    df = pd.DataFrame({"step": [1, 2, 3], "gns/frames": [3.0, 4.0, 5.0], "gns/frames/enc": [2.0, 3.0, 4.0],
                       "gns/frames/frame_head": [1.0, 2.0, 3.0], "gns/speaker": [6.0, 5.0, 4.0],
                       "gns/speaker/enc": [3.0, 2.0, 1.5], "gns/speaker/spk_head": [2.0, 1.0, 0.5]})
    fig = plots.plot_noise_scale(df)
    ax = fig.axes[0]
    looks = [(to_hex(ln.get_color()), tuple(ln._dash_pattern[1] or ())) for ln in ax.lines]
    assert len(ax.lines) == 6 and len(set(looks)) == 6, looks
    assert readability(fig) == []
