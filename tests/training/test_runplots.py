"""mtlab.plots.plot_runs: runs and branches on shared axes, their knob differences listed beside the curves."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from mtlab.core.journal import knob_differences  # noqa: E402


def test_branches_side_by_side_list_what_sets_them_apart(tmp_path, one_thread):
    ex = make_examples(24, 3)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], numbatches_to_aggregate=2, device="cpu",
                       noise_scale=True)
    tr.step()
    branch = tr.fork("low-lr")
    branch.lr = 1e-4
    tr.step(), branch.step()
    assert knob_differences({"main": tr.journal, "low-lr": branch.journal}) == {
        "main": [], "low-lr": ["step 1: lr 1e-4 (code)"]}
    tr.journal.write(tmp_path / "journal.jsonl")
    tr.history.to_csv(tmp_path / "history.csv", index=False)
    fig = mtlab.plots.plot_runs({"main": tmp_path, "low-lr": branch})
    ax = fig.axes[0]
    assert {line.get_label() for line in ax.get_lines()} == {"main: a", "main: b", "low-lr: a", "low-lr: b"}
    text = "\n".join(t.get_text() for a in fig.axes for t in a.texts)  # under the axes, in words
    assert "low-lr: lr 1e-4 from step 2" in text and "main: no change of its own" in text
    fig = mtlab.plots.plot_noise_scale(tr)
    assert {line.get_label() for line in fig.axes[0].get_lines()} >= {"a", "b"}


def test_a_scheduled_decay_is_no_change_between_runs_their_recipes_differences_are() -> None:
    """Two runs of a schedule with lr decay: the loop sets the lr before every step (journaled, source schedule);
    what sets them apart is the recipe setting they differ in, not a 'change' per step."""
    from mtlab.training.loop import Schedule, run
    from mtlab.training.runplots import run_differences

    journals, recipes = {}, {}
    for name, lr in (("base", 1e-2), ("faster", 2e-2)):
        ex = make_examples(12, 4)
        tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=lr, device="cpu", distributed=False)
        run(tr, Schedule(num_steps=4, initial_learning_rate=lr, learning_rate_decay=0.5), progress=False)
        journals[name] = tr.journal
        recipes[name] = {"trainer": {"initial_learning_rate": lr, "learning_rate_decay": 0.5}, "source": name}
    said = run_differences(journals, recipes=recipes)
    assert said == {"base": ["initial_learning_rate = 0.01"], "faster": ["initial_learning_rate = 0.02"]}, said
    assert run_differences(journals) == {"base": [], "faster": []}
