"""``mtlab.plots.plot_runs`` for 2 to 4 runs read at a glance (measured with matplotlib's renderer): one wide axes,
every text at least 10 px and inside the figure, the legend and what sets the runs apart under the axes in words
("lr 1e-3 from step 11"), never a raw dict; a fork's shared past drawn once; every point inside the limits; a height asked
for that is too small is grown, never the axes squeezed."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from mtlab import plots  # noqa: E402
from helpers.figures import all_texts, outside, raw_texts, readability  # noqa: E402



@pytest.fixture(scope="module")
def runs():
    import torch

    torch.set_num_threads(1)
    ex = make_examples(24, 5)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")
    for _ in range(6):
        tr.step()
    snap = tr.state_dict()
    lower = tr.fork("lower-lr")
    lower.lr = 1e-3
    clean = tr.fork("clean-only")
    clean.set_weight("a", "noisy", 0.0)
    tr.set_task_weight("b", 0.5)
    for t in (tr, lower, clean):
        for _ in range(6):
            t.step()
    back = tr.fork("restored", state=snap)
    for _ in range(3):
        back.step()
    return {"main": tr, "lower-lr": lower, "clean-only": clean, "restored": back}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_plot_runs_is_readable_for_2_to_4_runs(runs, n):
    chosen = dict(list(runs.items())[:n])
    fig = plots.plot_runs(chosen)
    assert readability(fig) == [] and outside(fig) == [] and raw_texts(fig) == []
    texts = [t.get_text() for t in all_texts(fig)]
    assert any(t.startswith("lower-lr: lr 1e-3 from step 7") for t in texts), texts
    assert any(t.startswith("main: task b weight 0.5 from step 7") for t in texts), texts
    if n >= 3:
        assert any("clean-only: a/noisy weight 0 from step 7" in t for t in texts), texts
    (ax,) = [a for a in fig.axes if a.get_label() != plots.LEGEND_CELL]
    assert ax.get_window_extent().width >= 0.8 * fig.bbox.width  # one wide axes, the legend under it
    main = {ln.get_label(): dict(zip(ln.get_xdata(), ln.get_ydata())) for ln in ax.lines
            if ln.get_label().startswith("main:")}
    for line in ax.lines:  # a fork's shared past once: each branch from its last point shared with the first run
        name, task = line.get_label().split(": ")
        first = min(line.get_xdata())
        if name == "main":
            assert first == 1
        else:
            assert first in (6, 7), line.get_label()  # forked after step 6 (its step-7 loss: the same weights)
            assert main[f"main: {task}"][first] == line.get_ydata()[0]
    looks = {(to_hex(ln.get_color()), str(ln.get_linestyle())) for ln in ax.lines}
    assert len(looks) == len(ax.lines)  # every run x task its own look


@pytest.fixture(scope="module")
def busy_runs(runs):
    """Four runs, each with a few knob changes of its own: four or five lines of differences under the axes."""
    busy = {name: t.fork(f"{name}-busy") for name, t in runs.items()}
    for t in busy.values():
        for i in range(6):
            t.step()
            if i % 2 == 0:
                t.lr = t.lr * 0.7
                t.set_weight("a", "clean", 0.5 + i / 20)
    return busy


@pytest.mark.parametrize("width_px, height_px", [
    (400, 250), (830, 250),  # a narrow figure, and the notebook's width with a height too small
    *(pytest.param(w, h, marks=pytest.mark.slow) for w, h in [(400, None), (553, None), (553, 250), (830, None),
                                                            (1245, None), (1245, 250)])])
def test_plot_runs_axes_stay_readable_at_any_size_asked(busy_runs, width_px, height_px):
    """The axes keep at least 200x110 px and no text is cut, however narrow the figure and however many lines
    of differences it holds: a height asked for that is too small for both is grown, never the axes squeezed."""
    fig = plots.plot_runs(busy_runs, width_px=width_px, height_px=height_px)
    assert readability(fig) == [] and outside(fig) == [] and raw_texts(fig) == []
    texts = [t.get_text() for t in all_texts(fig)]
    assert sum(t.startswith(("main:", "lower-lr:", "clean-only:", "restored:")) for t in texts) == 4, texts
    assert round(fig.bbox.width) == width_px
    if height_px is not None:
        assert round(fig.bbox.height) >= height_px


def test_short_numbers_and_changes_in_words():
    assert plots.short_number(1e-3) == "1e-3" and plots.short_number(2.5e-4) == "2.5e-4"
    assert plots.short_number(0.5) == "0.5" and plots.short_number(16) == "16"
    entry = {"type": "change", "kind": "restore", "step": 9, "state": {"id": "230ab9", "n": 6, "k": None},
             "to_step": 6}
    assert plots.change_in_words(entry) == "went back to step 6"
    assert plots.change_in_words({"kind": "lr", "step": 30, "value": 1e-3}) == "lr 1e-3 from step 31"
    assert plots.change_in_words({"kind": "minibatches_per_step", "step": 16, "value": 2, "task": None}) == \
        "K (minibatches per step) 2 from step 17"
    assert plots.change_in_words({"kind": "minibatches_per_step", "step": 4, "value": 3, "task": "a"}) == \
        "a/K (minibatches per step) 3 from step 5"
    assert plots.change_in_words({"kind": "batch_size", "step": 4, "value": 8, "task": "b"}) == "b/batch size 8 from step 5"
