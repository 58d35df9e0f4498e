"""The dashboard shows the whole journal, exports it, forks ("fork here", also from a snapshot) and shows
each task's noise scale."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")

import re  # noqa: E402

import ipywidgets as widgets  # noqa: E402
from ipywidgets.widgets.widget import _instances  # noqa: E402

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from mtlab.core.journal import Journal  # noqa: E402
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
    assert "task_weight task=b" in d.event_log.value and "journal" in d.event_log.value
    # the journal's note names the tab that holds the export button, by the title that tab shows
    named = re.search(r"export: the (\w+) tab", d.event_log.value)
    assert named, d.event_log.value
    tabs = [w for w in _instances.values() if isinstance(w, widgets.Tab) and named.group(1) in w.titles]
    page = [t.children[t.titles.index(named.group(1))] for t in tabs]
    assert any(d.buttons["export_journal"] in descendants(p) for p in page), [t.titles for t in tabs]
    d.buttons["fork"].click()
    assert "fork: branch 'branch-1'" in d.status_text
    d.close()
