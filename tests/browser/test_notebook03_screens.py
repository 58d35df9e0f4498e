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

from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, FLAGS, collapse_file_browser, sync_api
from helpers.notebook03 import NOTEBOOK, SIZES, MODEL_ERRORS_JS, write_copy, check_running_plot

pytestmark = pytest.mark.slow  # a server, kernels and a browser

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


# What the first screen of a page shows, unscrolled: the boxes around the dashboard that are scrolled, the
# viewport, the plot's box and the boxes (name and value, track) of the dashboard's sliders, in CSS px.
FIRST_SCREEN_JS = """() => { const d = document.querySelector('.mtlab-dashboard'); const box = (e) => {
   const r = e.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
 const around = [document.scrollingElement]; for (let e = d.parentElement; e; e = e.parentElement) around.push(e);
 const scrolled = around.filter(e => e && e.scrollTop > 0);
 return {scrolled: scrolled.map(e => e.tagName + '#' + e.id + '.' + e.className).slice(0, 5),
   view: {width: window.innerWidth, height: window.innerHeight}, plot: box(d.querySelector('img.widget-image')),
   sliders: [...d.querySelectorAll('.widget-hslider')].filter(s => s.offsetParent !== null).map(s => ({
     name: s.innerText.split('\\n')[0], box: box(s), track: box(s.querySelector('.slider-container') || s),
     handles: [...s.querySelectorAll('.noUi-handle')].map(box)}))}; }"""


def check_first_screen(page, name: str) -> None:
    """The page as it opens, not scrolled: the whole plot and a slider (its name, value and track) on the first
    screen, the plot drawn at least once."""
    from helpers.browser import DRAWN_JS

    page.wait_for_function(f"({DRAWN_JS})() >= 1", timeout=180_000)
    page.wait_for_timeout(500)  # the image laid out in its box
    seen = page.evaluate(FIRST_SCREEN_JS)
    view, plot = seen["view"], seen["plot"]
    assert not seen["scrolled"], (name, seen)  # nothing scrolled: what opens is what a class sees
    assert 0 <= plot["top"] and plot["bottom"] <= view["height"] + 1, (name, plot, view)  # the whole plot
    assert 0 <= plot["left"] and plot["right"] <= view["width"] + 1, (name, plot, view)
    whole = [s for s in seen["sliders"] if 0 <= s["box"]["top"] and s["track"]["bottom"] <= view["height"]
             and 0 <= s["track"]["left"] and s["track"]["right"] <= view["width"]]
    assert whole, (name, seen)  # a slider whole beside it
    assert whole[0]["track"]["right"] - whole[0]["track"]["left"] >= 200, (name, whole[0])  # a track to drag
    # Every slider's track and handles inside its own box: a handle at the end of the zoom slider touched the
    # "read" box beside it at 1280x800.
    out = [(s["name"], b) for s in seen["sliders"] for b in (s["track"], *s["handles"])
           if b["left"] < s["box"]["left"] - 1 or b["right"] > s["box"]["right"] + 1]
    assert not out, (name, out)


def test_notebook03_screens_in_voila(voila, tmp_path: Path) -> None:
    """Besides the checks of the JupyterLab test: the page opens, unscrolled, on a slider and the whole plot
    (notebook 03's prose and printouts come first in the notebook; its plot's top sat at 726 CSS px in a 533 px
    view at 150 %, at 1280x800 the first screen held only prose)."""
    write_copy(tmp_path / "voila" / NOTEBOOK, until_start=True)
    port = voila()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        for size, viewport, scale in SIZES:
            page = browser.new_page(viewport=viewport, device_scale_factor=scale)
            page.goto(f"http://127.0.0.1:{port}/voila/render/{NOTEBOOK}", timeout=180_000)
            check_first_screen(page, size)
            check_running_plot(page, tmp_path, f"03_voila_{size}.png")
            page.get_by_role("button", name="stop", exact=True).click()
            page.wait_for_function("() => [...document.querySelectorAll('.widget-html-content')]"
                                   ".some(e => e.textContent.includes('run ended'))", timeout=60_000)
            page.close()
        browser.close()
