"""Notebook 03 as a teacher runs it: *Run All* in JupyterLab (1280x800, headless Chromium), then a real mouse drag
of the frames/noisy slider while the run goes. Every cell has run while the run still goes (no cell keeps the
kernel busy), the change reaches the run within 2 steps of the drag (the event log's step against the counter
read just before the drag), and the status line says whether it is pending or in force. Event-driven waits only.

``MTLAB_SCREENSHOTS=docs/screenshots pytest tests/browser/test_notebook03_runall.py`` keeps the screenshot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, FLAGS, STEP_JS, collapse_file_browser, open_and_run_all, shoot, sync_api

from helpers.notebook03 import (DASH_ERROR_JS, MODEL_ERRORS_JS, NOTEBOOK, RUNNING_JS, check_running_plot,
                                      write_copy)

pytestmark = pytest.mark.slow  # a server, a kernel and a browser

# Execution counts of the code cells (null: not run yet) and whether the kernel is idle.
CELLS_JS = ("() => { const w = window.jupyterapp.shell.currentWidget; const cells = w.content.model.cells; const out = [];"
            " for (let i = 0; i < cells.length; i++) { const c = cells.get(i); if (c.type === 'code')"
            " out.push(c.executionCount || null); }"
            " return {counts: out, idle: w.sessionContext.session.kernel.status === 'idle'}; }")
# The event log's entries and the texts that tell of the drag (to 0, not the 0.25 the notebook set first).
EVENTS_JS = ("() => [...document.querySelectorAll('.mtlab-dashboard li')].map(e => e.textContent)"
             ".filter(t => /frames\\/noisy weight 0(?![.\\d])/.test(t))")
STATUS_JS = ("() => [...document.querySelectorAll('.mtlab-dashboard .widget-html-content')].map(e => e.innerText)"
             ".filter(t => /frames\\/noisy weight 0(?![.\\d])/.test(t)).join(' | ')")


def test_run_all_then_a_slider_drag_acts_within_two_steps(lab: str, tmp_path: Path) -> None:
    write_copy(tmp_path / "lab" / NOTEBOOK, until_start=False)  # the whole notebook, a run that outlasts the test
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        open_and_run_all(page, lab, NOTEBOOK)
        collapse_file_browser(page)
        # Run All is over while the run goes on: every code cell has run and the kernel is idle.
        try:
            page.wait_for_function(f"() => {{ const s = ({CELLS_JS})(); return s.idle && s.counts.every(c => c); }}",
                                   timeout=300_000)
        finally:
            page.screenshot(path=str(tmp_path / "after_run_all.png"))
            print(page.evaluate(CELLS_JS))
        page.wait_for_function(f"({STEP_JS})() >= 1 && ({RUNNING_JS})()", timeout=300_000)
        assert not page.evaluate(MODEL_ERRORS_JS), page.evaluate(MODEL_ERRORS_JS)
        slider = page.locator(".mtlab-dashboard .widget-slider", has_text="frames/noisy").first
        slider.scroll_into_view_if_needed()
        handle = slider.locator(".noUi-handle").first
        track = slider.locator(".noUi-target").first
        hb, tb = handle.bounding_box(), track.bounding_box()
        before = page.evaluate(STEP_JS)  # the step the counter shows just before the drag
        page.mouse.move(hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2)
        page.mouse.down()
        page.mouse.move(tb["x"] + tb["width"] * 0.3, tb["y"] + tb["height"] / 2, steps=8)
        page.mouse.move(tb["x"] - 40, tb["y"] + tb["height"] / 2, steps=8)  # past the left end: 0
        page.mouse.up()
        page.wait_for_function(f"({EVENTS_JS})().length > 0", timeout=120_000)
        (event,) = page.evaluate(EVENTS_JS)
        at = int(re.match(r"step (\d+)[,:]", event).group(1))  # "step N:" or "step N, minibatch M:"
        assert at <= before + 2, (event, before)  # taken by the run within 2 steps of the drag
        assert page.evaluate(RUNNING_JS)  # mid-run, not after it
        status = page.evaluate(STATUS_JS)
        assert "pending" in status or "in force from step" in status, status
        page.wait_for_function(f"({STEP_JS})() > {at + 1}", timeout=120_000)
        try:
            page.wait_for_function("() => /in force from step/.test(document.querySelector('.mtlab-dashboard')"
                                   ".innerText)", timeout=120_000)
        except sync_api.TimeoutError:
            raise AssertionError(f"never said in force; the status: {page.evaluate(STATUS_JS)!r}; the events: "
                                 f"{page.evaluate(EVENTS_JS)!r}") from None
        page.locator(".mtlab-dashboard").first.evaluate("e => e.scrollIntoView()")
        shoot(page, tmp_path, "03_runall_slider_1280x800.png")
        assert not page.evaluate(DASH_ERROR_JS), page.evaluate(DASH_ERROR_JS)
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.shutdown()")
        browser.close()


def test_voila_shows_the_dashboard_while_the_run_goes(voila, tmp_path: Path) -> None:
    """Voila runs every cell of 03 (none waits for the run): the page shows the dashboard, its counter moving and
    its plot drawn, before the run ends."""
    write_copy(tmp_path / "voila" / NOTEBOOK, until_start=False)
    port = voila()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"http://127.0.0.1:{port}/voila/render/{NOTEBOOK}", timeout=300_000)
        check_running_plot(page, tmp_path, "03_voila_runall_1280x800.png")
        assert page.evaluate(RUNNING_JS)  # still running: the page came before the run's end
        page.get_by_role("button", name="stop", exact=True).click()
        page.wait_for_function("() => [...document.querySelectorAll('.widget-html-content')]"
                               ".some(e => e.textContent.includes('run ended'))", timeout=60_000)
        browser.close()
