"""The dashboard in a real browser: headless Chromium drives JupyterLab. The quickstart runs every
cell and the Step button moves the counter and the plot; the layout holds at 1280x800; a dashboard
cell re-run during a run adopts the run and stops it; the plot's lag behind the counter is measured;
Voila shows the same dashboard following a run and stops it.

Needs ``pip install playwright jupyterlab`` and ``apt-get install -y chromium`` (never
``playwright install``: the system Chromium is used through ``executable_path``). Skipped, with
the reason, when any of them is missing. Every wait is for an event on the page (a step number, a
redraw), never for wall-clock speed: the timeouts are generous for a loaded machine. Screenshots go to
``MTLAB_SCREENSHOTS`` when set (the README's pictures in docs/ are made so).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, FLAGS, open_and_run_all, sync_api
from helpers.paths import TESTS

pytestmark = pytest.mark.slow  # a server, a kernel and a browser per test

NOTEBOOK = Path("01_quickstart.ipynb")  # the copy the ``lab`` fixture serves
RUN_NOTEBOOK = "run_cells.ipynb"
RUN_CELLS = [
    f"""import sys
sys.path.insert(0, {str(TESTS)!r})
import torch
torch.set_num_threads(1)
import mtlab, mtlab.ui
from helpers import make_examples, make_models, task_a, task_b
ex = make_examples(48, 5)
trainer = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")""",
    "dash = mtlab.ui.dashboard(trainer)\ndash",
    "dash.start(0)",
]


def write_run_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in RUN_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


COUNTER_JS = ("() => { const e = [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
              ".find(e => /^step \\d+ /.test(e.textContent)); return e ? parseInt(e.textContent.slice(5)) : -1; }")
AS_OF_JS = ("() => { const e = document.querySelector('.jp-OutputArea .mtlab-asof');"
            " return e ? parseInt(e.textContent.replace('plot as of step ', '')) : -1; }")
STATUS_JS = ("() => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
             ".map(e => e.textContent).join(' | ')")


def save_screenshot(page, name: str) -> None:
    """Into ``MTLAB_SCREENSHOTS`` (docs/ for the README) when set."""
    where = os.environ.get("MTLAB_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / name), full_page=False)


def test_quickstart_dashboard_step_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        open_and_run_all(page, lab, NOTEBOOK.name)

        output = page.locator(".jp-OutputArea")
        tab = output.locator(".lm-TabBar-tab", has_text="stepwise").first  # the stepwise calls' tab
        tab.wait_for(timeout=120_000)
        tab.click()
        step = output.get_by_role("button", name="step", exact=True)
        step.wait_for(timeout=60_000)
        counter = output.locator(".widget-html-content", has_text="step ").first
        # The last cells train STEPS=5 more steps in the background: 1 by hand + 5.
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
            ".some(e => e.textContent.startsWith('step 6 '))", timeout=60_000)
        image = output.locator("img.widget-image").first
        before_src, before_text = image.get_attribute("src"), counter.text_content()
        step.scroll_into_view_if_needed()
        step.click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
            ".some(e => e.textContent.startsWith('step 7 '))", timeout=30_000)
        page.wait_for_function("([src]) => document.querySelector('.jp-OutputArea img.widget-image').src !== src",
                               arg=[before_src], timeout=30_000)
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=False)
        # The notebook's schedule is spent: run continues it from the widget (no code), 2 more steps.
        steps_box = output.locator(".widget-inline-hbox", has_text="steps").locator("input").first
        steps_box.fill("2")
        steps_box.press("Enter")
        output.get_by_role("button", name="run", exact=True).click()
        page.wait_for_function(f"() => ({STATUS_JS})().includes('run ended after 2 step(s) (now at step 9)')",
                               timeout=120_000)
        assert page.evaluate(COUNTER_JS) == 9 and "set dash.schedule" not in page.evaluate(STATUS_JS)
        # Read every series at a step (the read-out tab).
        read = output.locator(".widget-inline-hbox", has_text="read").locator("input").first
        read.fill("3")
        read.press("Enter")
        output.locator(".lm-TabBar-tab", has_text="read-out").first.click()
        page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea table.mtlab-readout td')]"
                               ".some(e => e.textContent === 'tag/loss')", timeout=60_000)
        save_screenshot(page, "01_quickstart_dashboard.png")
        # Idle slider changes keep every text consistent: weight 0 -> skipped and a refused step (red);
        # weight back to 1 -> neither "skipped" nor the old error stays.
        output.locator(".lm-TabBar-tab", has_text="weights").first.click()
        readout = output.locator(".widget-slider", has_text="task tag").locator(".widget-readout").first
        readout.fill("0")
        readout.press("Enter")
        page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
                               ".some(e => /^step \\d+ .*skipped by step\\(\\)/.test(e.textContent))", timeout=60_000)
        tab.click()
        step.click()
        page.wait_for_function(f"() => ({STATUS_JS})().includes('ConfigError')", timeout=60_000)
        output.locator(".lm-TabBar-tab", has_text="weights").first.click()
        readout.fill("1")
        readout.press("Enter")
        page.wait_for_function(f"() => ({STATUS_JS})().includes('task tag weight 1')", timeout=60_000)
        counter_text, status_color = page.evaluate(
            "() => { const all = [...document.querySelectorAll('.jp-OutputArea .widget-html-content')];"
            " const c = all.find(e => /^step \\d+ /.test(e.textContent));"
            " const s = all.find(e => e.textContent.startsWith('task tag weight 1'));"
            " return [c.textContent, s.querySelector('span').style.color]; }")
        assert "skipped" not in counter_text and status_color != "rgb(176, 0, 32)", (counter_text, status_color)
        assert "ConfigError" not in page.evaluate(STATUS_JS).split("events")[0]  # no error left in the texts
        browser.close()
    assert before_text.startswith("step 6 ") and shot.stat().st_size > 10_000


def test_rerun_dashboard_cell_during_a_run_adopts_and_stops_it(lab: str, tmp_path: Path) -> None:
    """At 1280x800: nothing cut, headers on one line; the plot follows the counter (lag measured,
    screenshot kept); re-running the dashboard cell mid-run gives a dashboard whose stop works."""
    write_run_notebook(tmp_path / "lab" / RUN_NOTEBOOK)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        open_and_run_all(page, lab, RUN_NOTEBOOK)
        page.wait_for_function(f"({COUNTER_JS})() >= 5", timeout=90_000)
        page.wait_for_function(f"({AS_OF_JS})() >= 1", timeout=30_000)

        page.screenshot(path=str(tmp_path / "layout_1280x800.png"), full_page=True)
        # Layout at 1280x800: no truncated button or label, table headers on one line.
        cut = page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea button, .jp-OutputArea .widget-label')]"
            ".filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)")
        assert cut == [], f"cut at 1280x800: {cut}"
        wrapped = page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea th')].filter(e => {"
            " const r = document.createRange(); r.selectNodeContents(e);"
            " return e.offsetParent !== null"
            " && new Set([...r.getClientRects()].map(c => Math.round(c.top))).size > 1; })"
            ".map(e => e.textContent)")
        assert wrapped == [], f"table headers wrap: {wrapped}"

        # One screen: no horizontal scrollbar; with the dashboard's top at the top, the counter, the status
        # line, the run button and the plot are all inside the 800-px viewport (the file browser closed,
        # as when teaching: with it open, the plot goes below the controls, still without a scrollbar).
        page.evaluate("() => { if (!window.jupyterapp.shell.leftCollapsed)"
                      " window.jupyterapp.commands.execute('application:toggle-left-area'); }")
        page.wait_for_function("() => window.jupyterapp.shell.leftCollapsed", timeout=30_000)
        page.evaluate("() => document.querySelector('.jp-OutputArea .widget-html-content').scrollIntoView()")
        fits = page.evaluate(
            "() => { const out = document.querySelector('.jp-OutputArea-output .widget-vbox');"
            " const top = out.getBoundingClientRect().top;"
            " const img = out.querySelector('img.widget-image').getBoundingClientRect();"
            " const run = [...out.querySelectorAll('button')].find(b => b.textContent === 'run')"
            ".getBoundingClientRect();"
            " const scrollers = [...document.querySelectorAll('.jp-WindowedPanel-outer, .jp-NotebookPanel-notebook,"
            " .jp-OutputArea-output')].filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className);"
            " return {top, imgBottom: img.bottom, imgRight: img.right, runBottom: run.bottom,"
            " width: window.innerWidth, height: window.innerHeight, scrollers}; }")
        assert fits["scrollers"] == [], f"horizontal scrollbar at 1280x800: {fits}"
        assert fits["top"] >= 0 and fits["imgRight"] <= fits["width"], f"not one screen: {fits}"
        assert fits["imgBottom"] <= fits["height"] and fits["runBottom"] <= fits["height"], f"not one screen: {fits}"
        save_screenshot(page, "dashboard_1280x800.png")

        # The plot follows the run: wait for three redraws (events on the page, not a clock).
        drawn = [page.evaluate(AS_OF_JS)]
        for _ in range(3):
            page.wait_for_function(f"({AS_OF_JS})() > {drawn[-1]}", timeout=120_000)
            drawn.append(page.evaluate(AS_OF_JS))
        assert drawn == sorted(drawn) and len(set(drawn)) == 4

        # Re-run the dashboard cell while the run goes on: the new dashboard adopts the run.
        page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content;"
                      " nb.activeCellIndex = 1; window.jupyterapp.commands.execute('notebook:run-cell'); }")
        page.wait_for_function(f"() => ({STATUS_JS})().includes('shows the run already in progress')",
                               timeout=120_000)
        stop = page.locator(".jp-OutputArea").get_by_role("button", name="stop", exact=True)
        assert stop.count() == 1  # the old dashboard's output was replaced
        stop.click()
        page.wait_for_function(f"() => ({STATUS_JS})().includes('run ended')", timeout=120_000)
        stopped_at = page.evaluate(COUNTER_JS)
        # Stopped for good: a step after the end would come with a redraw; the plot catches up and stays.
        page.wait_for_function(f"({AS_OF_JS})() === {stopped_at}", timeout=60_000)
        page.screenshot(path=str(tmp_path / "stopped.png"), full_page=False)
        assert page.evaluate(COUNTER_JS) == stopped_at and mtlab_runs_left(page) == 0
        browser.close()


def mtlab_runs_left(page) -> int:
    """Runs going, as the page shows them: a counter saying running or pausing."""
    return int(page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
                             ".filter(e => /^step \\d+ .*(running|pausing)/.test(e.textContent)).length"))


def test_dashboard_in_voila(voila, tmp_path: Path) -> None:
    """Voila renders the run notebook: the counter and the plot follow the run started in the last
    cell (the plot reaches the browser from the painter thread), and stop ends it."""
    write_run_notebook(tmp_path / "voila" / RUN_NOTEBOOK)
    port = voila(RUN_NOTEBOOK)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
        counter = ("() => { const e = [...document.querySelectorAll('.widget-html-content')]"
                   ".find(e => /^step \\d+ /.test(e.textContent));"
                   " return e ? parseInt(e.textContent.slice(5)) : -1; }")
        as_of = ("() => { const e = document.querySelector('.mtlab-asof');"
                 " return e ? parseInt(e.textContent.replace('plot as of step ', '')) : -1; }")
        page.wait_for_function(f"({counter})() >= 5", timeout=120_000)
        first = page.evaluate(as_of)
        page.wait_for_function(f"({as_of})() > {first}", timeout=30_000)  # redrawn from the thread
        image = page.locator("img.widget-image").first
        assert image.get_attribute("src").startswith(("blob:", "data:image/png"))
        page.screenshot(path=str(tmp_path / "voila.png"), full_page=True)
        page.get_by_role("button", name="stop", exact=True).click()
        page.wait_for_function("() => [...document.querySelectorAll('.widget-html-content')]"
                               ".some(e => e.textContent.includes('run ended'))", timeout=60_000)
        stopped_at = page.evaluate(counter)
        time.sleep(1.0)
        assert page.evaluate(counter) == stopped_at
        browser.close()
