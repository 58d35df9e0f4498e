"""Notebook 03 (several tasks, clean and noisy linked sets) as a class sees it during its run, in headless
Chromium: JupyterLab and Voila at 1280x800 and at 150 % zoom (a 853x533 CSS-pixel viewport drawn at 1.5 device
pixels per CSS pixel, what the browser's zoom does on a 1280x800 screen).

A copy of the notebook runs with ``MTLAB_FAST=1`` (the small dev split) and a longer schedule, so that the run is
still going when the pictures are taken; JupyterLab runs the cells up to the one that starts the run (the next
one would wait for it), Voila a copy that ends there. Checked on the page: the step counter says "running" and
moves on between two pictures, the plot is drawn and not cut at the right, no cell shows an error.

Screenshots go to ``tmp_path`` and, when ``MTLAB_SCREENSHOTS`` is set, into that folder:
``MTLAB_SCREENSHOTS=docs/screenshots pytest tests/browser/test_notebook03_screens.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, DRAWN_JS, FLAGS, STEP_JS, collapse_file_browser, shoot, sync_api
from helpers.paths import NOTEBOOKS

pytestmark = pytest.mark.slow  # a server, kernels and a browser

SOURCE = NOTEBOOKS / "03_multitask_linkedsets.ipynb"
NOTEBOOK = "03_multitask_linkedsets.ipynb"
FAST_STEPS = "STEPS = 3 if FAST else 30"
LONG_STEPS = "STEPS = 400 if FAST else 30"  # the run outlasts the pictures; each page stops its run
SIZES = (("1280x800", {"width": 1280, "height": 800}, 1), ("150pct", {"width": 853, "height": 533}, 1.5))

# The counter's text during a run: "step N ... · running (r steps/s)".
RUNNING_JS = ("() => [...document.querySelectorAll('.widget-html-content')]"
              ".some(e => /^step \\d+ /.test(e.textContent) && / running /.test(e.textContent))")
# The plot's box and the part of the page that shows it: the viewport cut by every scrolling or clipping box
# around the plot below the page's body (in JupyterLab, the notebook's panel between the toolbar and the window's foot).
PLOT_JS = ("() => { const img = document.querySelector('.mtlab-dashboard img.widget-image');"
           " const r = img.getBoundingClientRect();"
           " const view = {left: 0, top: 0, right: window.innerWidth, bottom: window.innerHeight};"
           " for (let e = img.parentElement; e && e !== document.body; e = e.parentElement) { const s = getComputedStyle(e);"
           " if (!/(auto|scroll|hidden)/.test(s.overflowX + s.overflowY)) continue;"
           " const c = e.getBoundingClientRect(); view.left = Math.max(view.left, c.left);"
           " view.top = Math.max(view.top, c.top); view.right = Math.min(view.right, c.right);"
           " view.bottom = Math.min(view.bottom, c.bottom); }"
           " return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, natural: img.naturalWidth,"
           " view: view}; }")
# Error outputs as the page shows them (JupyterLab and Voila render an error as this mime type; Voila without
# tracebacks says so in a line of its own).
ERRORS_JS = ("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
             ".filter(e => e.dataset.mimeType === 'application/vnd.jupyter.stderr'"
             " && /Error|Traceback/.test(e.textContent)).map(e => e.textContent.slice(0, 300))"
             ".concat(/There was an error when executing cell/.test(document.body.innerText) ? ['voila: error'] : [])")
# ... and as the notebook model holds them (JupyterLab).
MODEL_ERRORS_JS = ("() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells; const out = [];"
                   " for (let i = 0; i < cells.length; i++) { const c = cells.get(i); if (c.type !== 'code') continue;"
                   " for (const o of c.outputs.toJSON()) if (o.output_type === 'error') out.push(i + ': ' + o.ename); }"
                   " return out; }")
DASH_ERROR_JS = ("() => [...document.querySelectorAll('.mtlab-dashboard .widget-html-content')]"
                 ".map(e => e.innerText).filter(t => /Error|Traceback|failed/.test(t))")


def write_copy(path: Path, until_start: bool) -> int:
    """Notebook 03 with the long schedule; the index of the cell that starts the run. ``until_start``: the
    copy ends with that cell (Voila runs every cell)."""
    import nbformat

    nb = nbformat.read(SOURCE, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert FAST_STEPS in first.source, f"notebook 03's first code cell no longer says {FAST_STEPS!r}: update the test"
    first.source = first.source.replace(FAST_STEPS, LONG_STEPS)
    start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "dash.start(" in c.source)
    if until_start:
        nb.cells = nb.cells[: start + 1]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return start


def check_running_plot(page, tmp_path: Path, name: str) -> None:
    """Waits for the run and a drawn plot, shows the plot, saves ``name``; then checks what a person sees."""
    page.wait_for_function(f"({STEP_JS})() > 0 && ({RUNNING_JS})() && ({DRAWN_JS})() >= 1", timeout=180_000)
    page.evaluate("() => document.querySelector('.mtlab-dashboard').scrollIntoView()")
    for _ in range(5):  # texts above the plot may change height meanwhile: again until the plot stays in view
        time.sleep(0.5)
        plot = page.evaluate(PLOT_JS)
        if plot["bottom"] <= plot["view"]["bottom"] + 1:
            break
        # A short view: the whole plot, its foot at the foot of the view.
        page.evaluate("() => document.querySelector('.mtlab-dashboard img.widget-image')"
                      ".scrollIntoView({block: 'end'})")
    step = page.evaluate(STEP_JS)
    shoot(page, tmp_path, name)
    plot = page.evaluate(PLOT_JS)
    view = plot["view"]
    assert plot["natural"] > 0, (name, plot)  # an image was drawn
    # Not cut: the whole plot inside what the page shows (1 px for rounding).
    assert view["left"] - 1 <= plot["left"] and plot["right"] <= view["right"] + 1, (name, plot)
    assert view["top"] - 1 <= plot["top"] and plot["bottom"] <= view["bottom"] + 1, (name, plot)
    # The run goes on: a second picture shows a later step.
    page.wait_for_function(f"({STEP_JS})() > {step}", timeout=120_000)
    assert page.evaluate(RUNNING_JS), name
    page.screenshot(path=str(tmp_path / ("later_" + name)))  # for a person debugging; not for the docs
    assert not page.evaluate(ERRORS_JS), (name, page.evaluate(ERRORS_JS))
    assert not page.evaluate(DASH_ERROR_JS), (name, page.evaluate(DASH_ERROR_JS))


def run_up_to(page, base: str, start: int) -> None:
    """Opens the copy and runs its cells up to and including ``start`` (not the one that waits)."""
    page.goto(f"{base}/lab/tree/{NOTEBOOK}?reset")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle' && w.sessionContext.isReady; }", timeout=60_000)
    no_news = page.get_by_role("button", name="No", exact=True)
    if no_news.count():
        no_news.first.click()
    collapse_file_browser(page)
    # The status bar off: at 1280x800 the dashboard, counter to plot, then fits in the notebook's panel.
    page.evaluate("() => { const c = window.jupyterapp.commands;"
                  " if (c.hasCommand('statusbar:toggle') && c.isToggled('statusbar:toggle')) c.execute('statusbar:toggle'); }")
    page.wait_for_function("() => { const s = document.querySelector('#jp-main-statusbar');"
                           " return !s || s.offsetParent === null || s.classList.contains('lm-mod-hidden'); }",
                           timeout=30_000)
    # Not awaited: the commands' promises resolve only when the cells have run.
    page.evaluate(f"() => {{ const app = window.jupyterapp; app.shell.currentWidget.content.activeCellIndex = {start};"
                  " app.commands.execute('notebook:run-all-above').then("
                  "() => app.commands.execute('notebook:run-cell')); }")
    page.wait_for_selector(".mtlab-dashboard", timeout=180_000)


def test_notebook03_screens_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    start = write_copy(tmp_path / "lab" / NOTEBOOK, until_start=False)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        for size, viewport, scale in SIZES:
            page = browser.new_page(viewport=viewport, device_scale_factor=scale)
            run_up_to(page, lab, start)
            check_running_plot(page, tmp_path, f"03_jupyterlab_{size}.png")
            assert not page.evaluate(MODEL_ERRORS_JS), page.evaluate(MODEL_ERRORS_JS)
            ran = page.evaluate("() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells;"
                                " const out = []; for (let i = 0; i < cells.length; i++) out.push(cells.get(i)"
                                ".executionCount || null); return out; }")
            assert ran[start] and not any(ran[start + 1:]), ran  # the waiting cell was not run
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.shutdown()")
            page.close()
        browser.close()


def test_notebook03_screens_in_voila(voila, tmp_path: Path) -> None:
    write_copy(tmp_path / "voila" / NOTEBOOK, until_start=True)
    port = voila()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        for size, viewport, scale in SIZES:
            page = browser.new_page(viewport=viewport, device_scale_factor=scale)
            page.goto(f"http://127.0.0.1:{port}/voila/render/{NOTEBOOK}", timeout=180_000)
            check_running_plot(page, tmp_path, f"03_voila_{size}.png")
            page.get_by_role("button", name="stop", exact=True).click()
            page.wait_for_function("() => [...document.querySelectorAll('.widget-html-content')]"
                                   ".some(e => e.textContent.includes('run ended'))", timeout=60_000)
            page.close()
        browser.close()
