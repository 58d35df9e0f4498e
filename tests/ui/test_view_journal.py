"""The dashboard shows the whole journal, exports it, forks ("fork here", also from a snapshot) and shows
each task's noise scale."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")

import html  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import ipywidgets as widgets  # noqa: E402
from ipywidgets.widgets.widget import _instances  # noqa: E402

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from mtlab.core.journal import Journal  # noqa: E402
from mtlab.core.knobs import KNOBS  # noqa: E402
from mtlab.ui.controller import Controller  # noqa: E402


def descendants(w) -> list:
    """Every widget under ``w`` (itself included)."""
    return [w, *(d for c in getattr(w, "children", ()) for d in descendants(c))]


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5,
                         numbatches_to_aggregate=2, device="cpu", **kw)


def test_the_controller_shows_the_journal_forks_and_the_noise_scale(one_thread):
    c = Controller(make_trainer(noise_scale=True))
    c.call("step")
    c.set_weight("a", "noisy", 0.3)
    c.take_snapshot()
    c.call("step")
    c.set_lr(2e-3)
    state = c.refresh()
    assert state.journal == tuple(c.trainer.journal.lines())
    assert [line.endswith("(dashboard)") for line in state.journal] == [True, True]
    assert "gradient noise scale" in state.noise_html and "minibatches/step" in state.noise_html
    assert c.fork(index=0) and c.fork("now")
    old, now = c.branches["branch-1"], c.branches["now"]
    assert old.step_count == 1 and now.step_count == 2
    assert now.lr == 2e-3 and old.journal.changes()[-1]["kind"] == "restore"
    now.step()
    assert c.trainer.step_count == 2 and now.step_count == 3
    assert [e["kind"] for e in c.trainer.journal.changes()][-2:] == ["fork", "fork"]
    c.close()


def test_export_writes_the_journal_and_the_event_log_shows_it(tmp_path, one_thread):
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False, export_dir=tmp_path / "out")
    d.buttons["step"].click()
    tr.set_task_weight("b", 0.5)
    d.buttons["step"].click()
    d.buttons["export_journal"].click()
    assert "exported JOURNAL" in d.status_text and "download" in d.export_links.value
    (path,) = (tmp_path / "out").glob("*.jsonl")
    assert Journal.read_file(path).entries == tr.journal.entries
    # The change once, where the journal puts it (not a second time in the journal's own wording).
    assert d.event_log.value.count("step 1: ") == 1 and "1 change(s) recorded" in d.event_log.value
    # the journal's note names the tab that holds the export button, by the title that tab shows
    named = re.search(r"export: the (\w+) tab", d.event_log.value)
    assert named, d.event_log.value
    tabs = [w for w in _instances.values() if isinstance(w, widgets.Tab) and named.group(1) in w.titles]
    page = [t.children[t.titles.index(named.group(1))] for t in tabs]
    assert any(d.buttons["export_journal"] in descendants(p) for p in page), [t.titles for t in tabs]
    d.buttons["fork"].click()
    assert "fork: branch 'branch-1'" in d.status_text
    d.close()


def event_steps(ax) -> dict[int, float]:
    """Event number -> the step its mark sits at, read from an axes' labels (``3``, ``3,4``, ``3 +4``)."""
    out: dict[int, float] = {}
    for t in ax.texts:
        label, x = t.get_text(), float(t.xy[0])
        if "+" in label:
            first, more = (int(v) for v in label.split("+"))
            numbers = range(first, first + more + 1)
        else:
            numbers = [int(v) for v in label.split(",")]
        out.update({n: x for n in numbers})
    return out


def test_one_numbering_in_the_status_the_events_the_journal_and_the_figures(one_thread):
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr)
    try:
        for _ in range(3):
            d.buttons["step"].click()
        tr.set_weight("a", "noisy", 0.3)
        d.lr_slider.value = 2e-2
        d.controller.set_task_weight("b", 0.5)
        for _ in range(2):
            d.buttons["step"].click()
        tr.set_weight("a", "clean", 0.7)
        d.buttons["step"].click()
        d.refresh()
        # The events, numbered 1.. as the plot marks them, sit at the journal's step of each change.
        changes = [e for e in tr.journal.entries if e["type"] == "change"]
        assert [s for s, _ in d.events] == [e["step"] for e in changes] == [3, 3, 3, 5]
        words = html.escape(KNOBS["weight"].words(0.3, "a", "noisy"))
        assert f"step 3: {words}" in d.event_log.value and d.event_log.value.count(words) == 1
        live = event_steps(next(iter(d.live.axes.values())))
        figure = event_steps(d.figure().axes[0])  # the exported PNG draws this figure
        assert live == figure == {1: 3.0, 2: 3.0, 3: 3.0, 4: 5.0}, (live, figure)
        # A second dashboard of the same trainer (a re-run cell) lists and marks the same events.
        d2 = mtlab.ui.dashboard(tr)
        try:
            d2.refresh()
            assert d2.events == d.events
            assert event_steps(next(iter(d2.live.axes.values()))) == live
        finally:
            d2.close()
    finally:
        d.close()


def test_a_change_during_a_run_says_where_it_is_in_force_as_the_journal_does(one_thread):
    tr = make_trainer()
    c = Controller(tr)
    states = []
    c.subscribe(states.append)
    try:
        assert c.start(0)
        until = time.monotonic() + 30
        while tr.step_count < 1:
            assert time.monotonic() < until
            time.sleep(0.005)
        c.set_weight("a", "noisy", 0.25)
        assert "pending: the run takes it at its next minibatch" in c.state().status
        while "in force from" not in c.state().status:
            assert time.monotonic() < until, c.state().status
            time.sleep(0.005)
        entry = [e for e in tr.journal.entries if e["type"] == "change"][-1]
        line = tr.journal.lines()[-1]
        place = line.split(":")[0]  # "step N" or "step N, minibatch M"
        assert c.state().status.endswith(f"in force from {place}"), (c.state().status, line)
        assert place == f"step {entry['step']}" + (f", minibatch {entry['minibatch']}" if entry["minibatch"] else "")
        c.refresh()
        assert c.state().places[-1] == place  # the event log says it the same way
    finally:
        c.close()
