"""The dashboard without a browser: widgets use a dummy comm outside a kernel, so sliders can be
moved (``.value`` or a simulated browser message) and buttons clicked in plain pytest."""

from __future__ import annotations

import importlib
import re
import sys
import time

import pytest
import torch

pytest.importorskip("ipywidgets", reason="the dashboard needs ipywidgets: pip install 'mtlab[notebook]'")
pytest.importorskip("matplotlib", reason="the dashboard needs matplotlib: pip install 'mtlab[notebook]'")

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402
from helpers import make_examples, make_models, task_a, task_b  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from mtlab.training import plots  # noqa: E402
from mtlab.ui.view import page_css  # noqa: E402

PNG = b"\x89PNG"


def make_trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(24, 5)
    kw.setdefault("clip_grad_value", 0.5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, device="cpu", **kw)


@pytest.fixture
def dash(request):
    # Drawing PNGs costs ~0.1 s each on a busy CPU: only the tests that look at the plot draw it.
    d = mtlab.ui.dashboard(make_trainer(), refresh_s=0.05, plots=request.node.get_closest_marker("plots") is not None)
    yield d
    d.close()


def browser_update(widget, value) -> None:
    """What the frontend sends when the user drags a slider."""
    widget._handle_msg({"content": {"data": {"method": "update", "state": {"value": value}}}})


def until(cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the training thread")
        time.sleep(0.01)


@pytest.mark.plots
def test_builds_every_control_and_a_png(dash):
    assert set(dash.sliders) == set(dash.trainer.weights()) == {"a", "a/clean", "a/noisy", "b", "b/clean"}
    assert set(dash.buttons) >= {"minibatch", "normalize", "clip", "apply", "step", "reset", "run", "pause", "stop",
                                 "snapshot", "restore"}
    assert bytes(dash.image.value).startswith(PNG) and "step 0" in dash.counter.value
    assert "<table" in dash.table.value and "empty" in dash.table.value


def test_sliders_change_the_trainer(dash):
    tr = dash.trainer
    dash.sliders["a/noisy"].value = 0.25
    assert tr.tasks["a"].linkedsets["noisy"].weight == 0.25
    browser_update(dash.sliders["a/clean"], 1.5)
    assert tr.tasks["a"].linkedsets["clean"].weight == 1.5
    browser_update(dash.sliders["b"], 0.3)
    assert tr.tasks["b"].weight == 0.3
    browser_update(dash.lr_slider, 1e-3)
    assert tr.lr == pytest.approx(1e-3)
    browser_update(dash.clip_slider, 2.0)
    assert tr.clip_grad_value == pytest.approx(2.0)
    dash.clip_toggle.value = False
    assert tr.clip_grad_value is None and dash.clip_slider.disabled
    dash.set_dropdown.value = "noisy"
    dash.buttons["minibatch"].click()
    assert tr.state("a").records[-1].weight == 0.25
    # A change made in code moves the slider too.
    tr.set_weight("a", "noisy", 0.75)
    assert dash.sliders["a/noisy"].value == 0.75


def test_stepwise_buttons(dash):
    tr = dash.trainer
    dash.buttons["normalize"].click()
    assert "PhaseError" in dash.status.value and "process_minibatch" in dash.status.value
    dash.task_dropdown.value = "b"
    assert list(dash.set_dropdown.options) == ["clean"]
    dash.buttons["minibatch"].click()
    dash.buttons["minibatch"].click()
    assert tr.state("b").minibatches == 2 and "accumulating" in dash.table.value
    dash.buttons["normalize"].click()
    assert tr.phase()["b"] == "normalized" and "next: clip()" in dash.status.value
    dash.buttons["clip"].click()
    dash.buttons["apply"].click()
    assert tr.step_count == 1 and "step 1" in dash.counter.value
    dash.buttons["step"].click()
    assert tr.step_count == 2 and len(tr.history) == 2
    dash.buttons["reset"].click()
    assert tr.phase() == {"a": "empty", "b": "empty"}
    assert {"a/loss", "a/grad_norm", "b/clip_fraction"} <= set(dash.controller.data.series)


@pytest.mark.slow
def test_snapshot_and_restore(dash):
    tr = dash.trainer
    dash.buttons["restore"].click()
    assert "no snapshot" in dash.status.value
    dash.buttons["step"].click()
    dash.buttons["snapshot"].click()
    saved = {k: p.detach().clone() for k, p in tr.params.items()}
    dash.sliders["a/clean"].value = 0.1
    dash.buttons["step"].click()
    dash.buttons["step"].click()
    dash.buttons["restore"].click()
    assert tr.step_count == 1 and len(tr.history) == 1
    assert all(torch.equal(p, saved[k]) for k, p in tr.params.items())
    assert dash.sliders["a/clean"].value == 1.0 and tr.tasks["a"].linkedsets["clean"].weight == 1.0
    assert len(dash.controller.data.series["a/loss"][0]) == 1


def test_background_run_pause_stop_and_a_second_run_refused(dash):
    tr = dash.trainer
    assert dash.start(0)
    until(lambda: tr.step_count >= 2)
    assert not dash.start(0) and "already in progress" in dash.status.value
    dash.buttons["step"].click()
    assert "refused while a run is going" in dash.status.value
    # A weight moved mid-run is used from the next minibatch on.
    browser_update(dash.sliders["a/noisy"], 0.125)
    until(lambda: any(r.weight == 0.125 for r in tr.state("a").records))
    dash.buttons["pause"].click()
    until(lambda: tr.phase()["a"] == "applied")
    time.sleep(0.1)
    n = tr.step_count
    time.sleep(0.2)
    assert tr.step_count == n and dash.paused
    assert all(r.weight == 0.125 for r in tr.state("a").records if r.linkedset == "noisy")
    dash.buttons["minibatch"].click()  # allowed while paused
    assert tr.state("a").minibatches == 1
    dash.buttons["pause"].click()  # resume
    until(lambda: tr.step_count > n + 1)
    dash.buttons["stop"].click()
    dash.wait(20)
    assert not dash.running and "run ended" in dash.status.value
    assert dash.start(3)  # a new run is allowed once the first one ended
    dash.wait(20)
    assert "run ended after 3 step(s)" in dash.status.value and dash.run.steps_done == 3
    assert dash.start(0)
    other = mtlab.ui.dashboard(tr, plots=False)  # adopts the run: a second one is refused there too
    assert other.running and not other.start(0) and "already in progress" in other.status.value
    assert "replaced by a newer dashboard" in dash.status.value  # the older one detached and says so
    other.close()
    assert not dash.running


def test_clip_toggle_during_a_run_waits_for_the_step_end(dash):
    tr = dash.trainer
    dash.start(0)
    until(lambda: tr.step_count >= 1)
    dash.clip_toggle.value = False
    until(lambda: tr.clip_grad_value is None)
    until(lambda: len(tr.history) >= 1 and tr.history["a/clip_fraction"].iloc[-1] == 0.0)
    dash.stop()
    assert dash.error is None


def test_error_in_the_training_thread_is_shown_and_stops_the_run():
    tr = make_trainer()
    d = mtlab.ui.dashboard(tr, plots=False)
    tr.models["enc"].register_forward_hook(lambda m, i, o: o * float("nan"))
    d.start(0)
    d.wait(20)
    assert not d.running and isinstance(d.error, mtlab.NonFiniteError)
    assert "error in the training thread" in d.status.value and "NonFiniteError" in d.status.value
    assert tr.step_count == 0
    d.close()
    assert d.controller._on_event not in tr.callbacks


@pytest.mark.slow
@pytest.mark.plots
def test_validation_points_from_evaluate_events(dash):
    tr = dash.trainer
    dash.buttons["step"].click()
    loss = tr.evaluate("a", "clean", num_batches=2)
    assert dash.validation == [{"step": 1, "task": "a", "linkedset": "clean", "loss": loss}]
    dash.refresh()
    assert "valid:a/clean" in dash.live.lines


@pytest.mark.slow
def test_plot_helpers_return_figures_and_write_pngs(tmp_path):
    tr = make_trainer()
    for _ in range(3):
        tr.step()
    fig = plots.plot_losses(tr.history, validation=[{"step": 2, "task": "a", "linkedset": "clean", "loss": 1.0}])
    assert isinstance(fig, Figure) and {"a", "a/clean", "a/clean (valid)"} <= {
        line.get_label() for line in fig.axes[0].lines}
    host = Figure()
    ax = host.add_subplot()
    assert plots.plot_grad_norms(tr, ax=ax) is host
    assert {"a", "b", "a (clipped)", "b (clipped)"} <= {ln.get_label() for ln in ax.lines}
    assert plots.plot_clip_fraction(tr.log).axes[0].lines
    assert plots.figure_png(plots.plot_history(tr.history)).startswith(PNG)
    paths = plots.save_plots(tr.history, tmp_path / "exp", dpi=40)
    assert [p.name for p in paths] == ["losses.png", "grad_norms.png", "clip_fraction.png", "history.png"]
    assert all(p.read_bytes().startswith(PNG) for p in paths)
    xs, ys = plots.thin(list(range(10_000)), list(range(10_000)))
    assert len(xs) == 2000 and xs[0] == 0 and xs[-1] == 9999


@pytest.fixture
def fresh_ui(monkeypatch):
    """``mtlab.ui`` imported afresh; afterwards every ``mtlab.ui`` module is the one from before again
    (a second copy of ``mtlab.ui.runs`` would keep a second registry of runs)."""
    before = {k: v for k, v in sys.modules.items() if k == "mtlab.ui" or k.startswith("mtlab.ui.")}
    monkeypatch.setattr(mtlab, "ui", mtlab.ui)
    for name in before:
        del sys.modules[name]
    yield
    for name in [k for k in sys.modules if k == "mtlab.ui" or k.startswith("mtlab.ui.")]:
        del sys.modules[name]
    sys.modules.update(before)


def test_without_ipywidgets_the_controller_works_and_the_dashboard_names_the_extra(monkeypatch, fresh_ui,
                                                                                   one_thread):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    ui = importlib.import_module("mtlab.ui")
    c = ui.Controller(make_trainer())  # the headless controller needs no widgets
    assert c.call("step") and c.state().step == 1
    c.close()
    with pytest.raises(ImportError, match=r'pip install "mtlab\[notebook\]"'):
        ui.dashboard(make_trainer())


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def test_every_control_has_a_tooltip_and_the_layout_fits_one_screen(one_thread):
    import ipywidgets as widgets

    tr = make_trainer()
    tr.set_combine("sum")
    d = mtlab.ui.dashboard(tr)
    shown = list(walk(d))
    controls = [w for w in shown if isinstance(w, (widgets.ValueWidget, widgets.Button))
                and not isinstance(w, (widgets.HTML, widgets.Label, widgets.Image))]
    assert len(controls) >= 30  # sliders, dropdowns, checkboxes, buttons, zoom, read-out, steps box
    missing = [f"{type(w).__name__}({getattr(w, 'description', '')!r})" for w in controls if not w.tooltip]
    assert missing == []
    assert all(w in shown for w in (d.counter, d.status, d.image, d.buttons["run"], d.sliders["a"], d.zoom))
    # One screen at 1280x800: controls and plot side by side, fixed widths that fit a notebook's width.
    px = lambda w: int(w.layout.width.rstrip("px"))  # noqa: E731
    body = next(w for w in shown if isinstance(w, widgets.HBox) and len(w.children) == 2
                and w.children[0].layout.width and w.children[1].layout.width)
    assert sum(px(c) for c in body.children) <= 1100
    assert px(d.image) == png_size_of(d.image.value)
    d.close()


def png_size_of(data: bytes) -> int:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(bytes(data))).size[0]


def test_a_voila_page_opens_in_presentation_mode_unless_told_otherwise(monkeypatch):
    """Voila shows only outputs, prose first: in presentation mode the sliders sit beside the plot, so that a
    slider and its effect share a screen at 1280x800 and at 150 % without editing the notebook."""
    monkeypatch.delenv("SERVER_SOFTWARE", raising=False)
    plain = mtlab.ui.dashboard(make_trainer(), plots=False)
    monkeypatch.setenv("SERVER_SOFTWARE", "voila/0.5.13")  # what Voila sets in its kernels' environment
    voila = mtlab.ui.dashboard(make_trainer(), plots=False)
    told = mtlab.ui.dashboard(make_trainer(), plots=False, presentation=False)
    try:
        assert not plain.presentation and voila.presentation and not told.presentation
        assert "mtlab-present" in voila._dom_classes
    finally:
        for d in (plain, voila, told):
            d.close()


def test_a_voila_page_shows_the_dashboard_first(monkeypatch):
    """Voila runs the whole notebook and shows its prose and printouts first: the plot of notebook 03 sat at
    726 CSS px in a 533 px view at 150 %. In a Voila page the dashboard's cell comes first (the page's style
    sheet moves it, the notebook's cells are not edited); elsewhere the notebook's order holds.
    tests/browser/test_notebook03_screens.py measures it in pixels."""
    monkeypatch.delenv("SERVER_SOFTWARE", raising=False)
    plain = mtlab.ui.dashboard(make_trainer(), plots=False, presentation=True)
    monkeypatch.setenv("SERVER_SOFTWARE", "voila/0.5.13")
    voila = mtlab.ui.dashboard(make_trainer(), plots=False)
    told = mtlab.ui.dashboard(make_trainer(), plots=False, presentation=False)
    try:
        assert "mtlab-first" not in plain._dom_classes  # JupyterLab: cells stay where the notebook puts them
        assert "mtlab-first" in voila._dom_classes and "mtlab-first" in told._dom_classes
        css = page_css()
        # the cell holding it goes first among the page's cells (Voila: a box of cell wrappers, each a cell)
        assert re.search(r":has\(> \* > \.jp-Cell \.mtlab-first\)[^{]*\{[^}]*display: flex; flex-direction: column", css)
        assert re.search(r":has\(> \.jp-Cell \.mtlab-first\)[^{]*\{[^}]*order: -1", css)
    finally:
        for d in (plain, voila, told):
            d.close()
