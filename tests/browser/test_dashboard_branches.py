"""Forks and re-initialise as a class sees them, in JupyterLab (headless Chromium, 1280x800): "fork here", then
"continue", adds the branch's line to the plot and the branch to the selector; re-initialise (beside run, pause,
stop) with "starting knobs" leaves only the new branch's event marks. What the plot holds is read from the kernel
(the lines drawn, the marks), what a person sees is in the screenshots.

``MTLAB_SCREENSHOTS=docs/screenshots pytest tests/browser/test_dashboard_branches.py`` keeps them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, CUT_JS, DRAWN_JS, FLAGS, STEP_JS, collapse_file_browser, open_and_run_all, shoot, sync_api, wait_for_running_dashboard
from helpers.paths import TESTS

pytestmark = pytest.mark.slow  # a server, a kernel and a browser

NOTEBOOK = "branches.ipynb"
CELLS = [
    f"""import sys
sys.path.insert(0, {str(TESTS)!r})
import math, json
import torch
torch.set_num_threads(1)
import mtlab, mtlab.ui
from helpers import make_examples, make_models, task_a, task_b
ex = make_examples(96, 5)
trainer = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")""",
    "dash = mtlab.ui.dashboard(trainer)\ndash",
]
STATUS_JS = "() => [...document.querySelectorAll('.mtlab-dashboard .widget-html-content')].map(e => e.innerText).join(' | ')"
# Runs ``code`` in the notebook's kernel (idle: the dashboard's runs are threads) and returns what it printed.
KERNEL_JS = ("async (code) => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;"
             " const f = k.requestExecute({code: code, silent: false, store_history: false}); let out = '';"
             " f.onIOPub = (m) => { if (m.header.msg_type === 'stream') out += m.content.text; }; await f.done;"
             " return out; }")


def write_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def kernel(page, code: str):
    return json.loads(page.evaluate(KERNEL_JS, code).strip().splitlines()[-1])


def run_steps(page, n: int) -> None:
    output = page.locator(".jp-OutputArea")
    before = page.evaluate(STEP_JS)
    steps = output.locator(".widget-inline-hbox", has_text="steps").locator("input").first
    steps.fill(str(n))
    steps.press("Enter")
    page.wait_for_function(f"() => ({STATUS_JS})().includes('steps -> {n}')", timeout=60_000)
    output.get_by_role("button", name="run", exact=True).click()
    page.wait_for_function(f"({STEP_JS})() >= {before + n} && ({STATUS_JS})().includes('run ended')",
                           timeout=180_000)
    page.wait_for_function(f"({DRAWN_JS})() >= {before + n}", timeout=60_000)


def test_fork_here_then_reinitialise(lab: str, tmp_path: Path) -> None:
    write_notebook(tmp_path / "lab" / NOTEBOOK)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        open_and_run_all(page, lab, NOTEBOOK)
        collapse_file_browser(page)
        page.wait_for_selector(".mtlab-dashboard", timeout=120_000)
        page.wait_for_function(f"({DRAWN_JS})() >= 0", timeout=120_000)
        output = page.locator(".jp-OutputArea")
        run_steps(page, 4)
        kernel(page, "trainer.set_weight('a', 'noisy', 0.2); print(1)")  # an event of the first branch

        output.locator(".lm-TabBar-tab", has_text="branches").first.click()
        output.get_by_role("button", name="fork here", exact=True).click()
        page.wait_for_function(f"() => ({STATUS_JS})().includes(\"fork: branch 'branch-1' from step 4\")",
                               timeout=60_000)
        output.get_by_role("button", name="continue", exact=True).click()  # steps box: 4
        page.wait_for_function(f"() => ({STATUS_JS})().includes(\"branch 'branch-1': 4 step(s) trained\")",
                               timeout=180_000)
        try:  # the branch selector on the page names the branch, where it parted and where it is
            page.wait_for_function("() => [...document.querySelectorAll('.mtlab-dashboard select')].some(s =>"
                                   " [...s.options].some(o => o.text.replace(/\\s+/g, ' ')"
                                   ".includes('branch-1: from step 4, now 8')))", timeout=60_000)
        except sync_api.TimeoutError:
            raise AssertionError(page.evaluate("() => [...document.querySelectorAll('.mtlab-dashboard select')]"
                                               ".map(s => [...s.options].map(o => o.text))")) from None
        lines = kernel(page, "dash.painter.idle(30); print(json.dumps({k: [min(l.get_xdata()), max(l.get_xdata())]"
                             " for k, l in dash.live.lines.items() if k.startswith('branch:') and len(l.get_xdata())}))")
        assert lines.get("branch:a/loss") == [4, 8], lines  # a second line on the loss panel: the branch's own part
        page.evaluate("() => document.querySelector('.mtlab-dashboard').scrollIntoView()")
        shoot(page, tmp_path, "jupyterlab_fork_1280x800.png")
        cut = page.evaluate(CUT_JS)  # the branches tab is the one shown
        assert not cut, f"texts cut: {cut}"  # the branch selector's 'branch-1: from step 4, now 8' whole

        index = page.evaluate("() => [...document.querySelectorAll('.mtlab-dashboard select')]"
                              ".findIndex(s => [...s.options].some(o => /starting\\s+knobs/.test(o.text)))")
        page.locator(".mtlab-dashboard select").nth(index).select_option(index=1)  # "starting knobs"
        output.get_by_role("button", name="re-initialise", exact=True).click()
        page.wait_for_function(f"() => ({STATUS_JS})().includes('re-initialised: step 4 -> 0')", timeout=60_000)
        assert "the starting knobs again (a/noisy weight 0.5)" in page.evaluate(STATUS_JS)
        run_steps(page, 3)
        kernel(page, "trainer.set_weight('a', 'clean', 0.8); print(1)")  # an event of the new branch, at step 3
        run_steps(page, 2)
        marks = kernel(page, "dash.painter.idle(30); print(json.dumps([[s, t] for s, t in dash.controller.data.marks()"
                             " if math.isfinite(s)]))")
        assert [s for s, _ in marks] == [0, 3], marks  # only the new branch's: the re-initialisation, the weight
        drawn = kernel(page, "print(json.dumps(sorted({float(a.get_xdata()[0]) for a in dash.live._event_artists"
                             " if hasattr(a, 'get_xdata')})))")
        assert drawn == [3.0], drawn  # no mark of the abandoned branch (its knob change and fork at step 4)
        page.evaluate("() => document.querySelector('.mtlab-dashboard').scrollIntoView()")
        shoot(page, tmp_path, "jupyterlab_reinitialise_1280x800.png")
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.shutdown()")
        browser.close()


PRESENT = "present.ipynb"
# The boxes of the plot, the chosen sliders and the state table, and the part of the page that shows them (the
# viewport cut by the notebook's scrolling panel).
BOXES_JS = ("() => { const d = document.querySelector('.mtlab-dashboard'); const box = (e) => { const r ="
            " e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };"
            " const view = {left: 0, top: 0, right: window.innerWidth, bottom: window.innerHeight};"
            " for (let e = d.parentElement; e && e !== document.body; e = e.parentElement) { const s = getComputedStyle(e);"
            " if (!/(auto|scroll|hidden)/.test(s.overflowX + s.overflowY)) continue; const c = e.getBoundingClientRect();"
            " view.left = Math.max(view.left, c.left); view.top = Math.max(view.top, c.top);"
            " view.right = Math.min(view.right, c.right); view.bottom = Math.min(view.bottom, c.bottom); }"
            " const sliders = [...d.querySelectorAll('.widget-slider')].filter(e => e.offsetParent !== null)"
            ".filter(e => /a\\/noisy|lr/.test(e.innerText)).map(box);"
            " const table = d.querySelector('table.mtlab-state');"
            " return {plot: box(d.querySelector('img.widget-image')), sliders: sliders, view: view,"
            " table: table ? box(table) : null, tableParent: table ? box(table.closest('.widget-html')) : null}; }")


def inside(box, view) -> bool:
    return (view["left"] - 1 <= box["left"] and box["right"] <= view["right"] + 1 and view["top"] - 1 <= box["top"]
            and box["bottom"] <= view["bottom"] + 1)


def test_presentation_at_150_percent_shows_plot_and_sliders_on_one_screen(lab: str, tmp_path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELLS[0]), nbformat.v4.new_code_cell(
        "dash = mtlab.ui.dashboard(trainer, presentation=True, sliders=['a/noisy', 'lr'])\ndash"),
        nbformat.v4.new_code_cell("dash.start(0)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(tmp_path / "lab" / PRESENT))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 853, "height": 533}, device_scale_factor=1.5)
        open_and_run_all(page, lab, PRESENT)
        collapse_file_browser(page)
        wait_for_running_dashboard(page)
        boxes = page.evaluate(BOXES_JS)
        shoot(page, tmp_path, "jupyterlab_presentation_sliders_150pct.png")
        assert len(boxes["sliders"]) == 2, boxes
        assert inside(boxes["plot"], boxes["view"]), boxes  # the whole plot in the first screen
        assert all(inside(s, boxes["view"]) for s in boxes["sliders"]), boxes  # and the chosen sliders
        assert boxes["plot"]["right"] - boxes["plot"]["left"] >= 300, boxes  # not a thumbnail
        page.evaluate("() => document.querySelector('table.mtlab-state').scrollIntoView()")
        page.wait_for_timeout(300)
        table = page.evaluate(BOXES_JS)
        assert table["table"]["right"] <= table["view"]["right"] + 1, table  # every column of the table shows
        shoot(page, tmp_path, "jupyterlab_presentation_table_150pct.png")
        page.get_by_role("button", name="stop", exact=True).click()
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.shutdown()")
        browser.close()
