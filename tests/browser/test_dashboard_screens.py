"""The dashboard as a class sees it, in headless Chromium: JupyterLab and Voila during a background run, at
1280x800 and at 150 % zoom (a 853x533 CSS-pixel viewport drawn at 1.5 device pixels per CSS pixel, which is
what the browser's zoom does on a 1280x800 screen), in normal and presentation mode. Also checked on the page:
every dropdown and number box has a tooltip where the pointer is, the steps box refuses 2.5 and takes 1e3 as
1000, and after a kernel restart the dashboard no longer says "running".

Screenshots go to ``tmp_path`` and, when ``MTLAB_SCREENSHOTS`` is set, into that folder (docs/screenshots for
the documentation): ``MTLAB_SCREENSHOTS=docs/screenshots pytest tests/browser/test_dashboard_screens.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, DRAWN_JS, FLAGS, STEP_JS, collapse_file_browser, open_and_run_all, shoot, sync_api
from helpers.paths import TESTS

NOTEBOOK = "dashboard_screens.ipynb"
STALE_S = 8  # the notebook shortens the expiry of a "running" claim, so the restart check waits less


def cells(presentation: bool) -> list[str]:
    return [
        f"""import sys
sys.path.insert(0, {str(TESTS)!r})
import torch
torch.set_num_threads(1)
import mtlab, mtlab.ui
import mtlab.ui.view
mtlab.ui.view.STALE_S = {STALE_S}
from helpers import make_examples, make_models, task_a, task_b
ex = make_examples(96, 5)
trainer = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")
trainer.set_weight("a", "noisy", 1e-9)""",
        f"dash = mtlab.ui.dashboard(trainer, presentation={presentation}"
        + (", hide=['stepwise', 'snapshots', 'table'])" if presentation else ")") + "\ndash",
        "dash.start(0)  # in the background: the knobs act during the run",
    ]


def write_notebook(path: Path, presentation: bool = False) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells(presentation)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


STATUS_JS = "() => [...document.querySelectorAll('.widget-html-content')].map(e => e.innerText).join(' | ')"
# What a pointer over each dropdown or text box would show: the nearest title (ipywidgets 8 puts the tooltip of a
# described control on its label only; the dashboard wraps each in a box carrying it).
TIPS_JS = ("() => [...document.querySelectorAll('.mtlab-dashboard select, .mtlab-dashboard input[type=text]')]"
           ".map(e => [e.closest('.widget-inline-hbox') ? e.closest('.widget-inline-hbox').innerText : '',"
           " (e.closest('[title]') || {title: ''}).title])")


def top_of_dashboard(page) -> None:
    page.evaluate("() => document.querySelector('.mtlab-dashboard').scrollIntoView()")
    time.sleep(0.5)


@pytest.mark.slow
def test_dashboard_screens_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    root = tmp_path / "lab"
    write_notebook(root / NOTEBOOK)
    write_notebook(root / ("present_" + NOTEBOOK), presentation=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        open_and_run_all(page, lab, NOTEBOOK)
        collapse_file_browser(page)
        page.wait_for_function(f"({STEP_JS})() >= 3 && ({DRAWN_JS})() >= 1", timeout=120_000)
        top_of_dashboard(page)
        shoot(page, tmp_path, "jupyterlab_1280x800.png")

        tips = page.evaluate(TIPS_JS)
        assert len(tips) >= 9 and all(title for _, title in tips), tips  # combine, task, set, snapshot, boxes
        assert any("trainer.set('combine'" in t for _, t in tips) and any("snapshot" in t for _, t in tips)

        output = page.locator(".jp-OutputArea")
        steps = output.locator(".widget-inline-hbox", has_text="steps").locator("input").first
        steps.fill("2.5")
        steps.press("Enter")
        page.wait_for_function(f"() => ({STATUS_JS})().includes(\"refused '2.5' is not a whole number\")",
                               timeout=60_000)
        page.wait_for_function("(e) => e.value === '0'", arg=steps.element_handle(), timeout=30_000)
        steps.fill("1e3")
        steps.press("Enter")
        page.wait_for_function(f"() => ({STATUS_JS})().includes('steps -> 1000')", timeout=60_000)
        page.wait_for_function("(e) => e.value === '1000'", arg=steps.element_handle(), timeout=30_000)

        output.locator(".lm-TabBar-tab", has_text="batches").first.click()
        k_box = output.locator("[title*=\"set('minibatches_per_step', value, task='a')\"] input").first
        k_box.fill("3")
        k_box.press("Enter")
        page.wait_for_function(f"() => ({STATUS_JS})().includes('a/K (minibatches per step) 3')", timeout=60_000)
        shot = shoot(page, tmp_path, "jupyterlab_accumulation_1280x800.png")
        assert shot.stat().st_size > 20_000

        # A kernel restart during the run: after STALE_S s without news the view no longer says "running".
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
        # What a person sees: text nodes saying "running" whose element is visible (computed style).
        claims = ("() => { const out = []; const walk = document.createTreeWalker("
                  "document.querySelector('.jp-Notebook'), NodeFilter.SHOW_TEXT);"
                  " while (walk.nextNode()) { const n = walk.currentNode; const e = n.parentElement;"
                  " if (!/running/.test(n.textContent) || e.closest('.jp-InputArea')) continue;"
                  " const st = getComputedStyle(e); if (st.visibility === 'visible' && parseFloat(st.fontSize) > 0"
                  " && e.getClientRects().length) out.push(n.textContent); } return out; }")
        try:
            page.wait_for_function(f"() => ({claims})().length === 0", timeout=(STALE_S + 40) * 1000)
        except sync_api.TimeoutError:
            raise AssertionError(f"still claimed after a kernel restart: {page.evaluate(claims)}") from None
        finally:
            shoot(page, tmp_path, "jupyterlab_after_kernel_restart.png")
        said = page.evaluate("() => [...document.querySelectorAll('.jp-Notebook .mtlab-stale')]"
                             ".filter(e => getComputedStyle(e).visibility === 'visible').length")
        assert said >= 1  # and it says the view is no longer live

        zoomed = browser.new_page(viewport={"width": 853, "height": 533}, device_scale_factor=1.5)
        for name, notebook in (("jupyterlab_150pct.png", NOTEBOOK),
                               ("jupyterlab_presentation_150pct.png", "present_" + NOTEBOOK)):
            open_and_run_all(zoomed, lab, notebook)
            collapse_file_browser(zoomed)
            zoomed.wait_for_function(f"({STEP_JS})() >= 3 && ({DRAWN_JS})() >= 1", timeout=120_000)
            top_of_dashboard(zoomed)
            shoot(zoomed, tmp_path, name)
            widths = zoomed.evaluate(
                "() => { const out = document.querySelector('.mtlab-dashboard');"
                " const img = out.querySelector('img.widget-image').getBoundingClientRect();"
                " const table = out.querySelector('table.mtlab-state');"
                " return {right: img.right, width: window.innerWidth, top: img.top, height: window.innerHeight,"
                " table: table ? table.getBoundingClientRect().right : 0}; }")
            assert widths["right"] <= widths["width"] + 1, (name, widths)  # the plot is not cut at the right
            assert widths["table"] <= widths["width"] - 20, (name, widths)  # nor the table (its cells wrap)
            zoomed.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.shutdown()")
        assert widths["top"] < widths["height"] / 2, widths  # presentation: the plot is near the top
        browser.close()


@pytest.mark.slow
def test_dashboard_screens_in_voila(voila, tmp_path: Path) -> None:
    root = tmp_path / "voila"
    write_notebook(root / NOTEBOOK)
    write_notebook(root / ("present_" + NOTEBOOK), presentation=True)
    port = voila()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        shots = [("voila_1280x800.png", NOTEBOOK, {"width": 1280, "height": 800}, 1),
                 ("voila_150pct.png", NOTEBOOK, {"width": 853, "height": 533}, 1.5),
                 ("voila_presentation_150pct.png", "present_" + NOTEBOOK, {"width": 853, "height": 533}, 1.5)]
        for name, notebook, viewport, scale in shots:
            page = browser.new_page(viewport=viewport, device_scale_factor=scale)
            page.goto(f"http://127.0.0.1:{port}/voila/render/{notebook}", timeout=180_000)
            page.wait_for_function(f"({STEP_JS})() >= 3 && ({DRAWN_JS})() >= 1", timeout=180_000)
            page.evaluate("() => document.querySelector('.mtlab-dashboard').scrollIntoView()")
            time.sleep(0.5)
            shoot(page, tmp_path, name)
            tips = page.evaluate(TIPS_JS)
            assert tips and all(title for _, title in tips), tips
            right = page.evaluate("() => document.querySelector('.mtlab-dashboard img.widget-image')"
                                  ".getBoundingClientRect().right")
            assert right <= viewport["width"] + 1, (name, right)
            page.get_by_role("button", name="stop", exact=True).click()
            page.wait_for_function(f"() => ({STATUS_JS})().includes('run ended')", timeout=60_000)
            page.close()
        browser.close()
