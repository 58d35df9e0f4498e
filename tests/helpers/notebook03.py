"""Notebook 03 in a browser, for its browser tests: a copy with a long schedule, the page's checks (running,
errors, the plot in view)."""

from __future__ import annotations

import time
from pathlib import Path

from helpers.browser import DRAWN_JS, STEP_JS, shoot
from helpers.paths import NOTEBOOKS

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
