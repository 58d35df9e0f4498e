"""What the browser tests (tests/browser/) share: headless Chromium and Playwright, or a module skip that names
what to install (the ``lab`` fixture checks for JupyterLab and ipykernel); opening a notebook in JupyterLab;
the page probes; screenshots. The servers themselves are the fixtures ``lab`` and ``voila`` of
tests/browser/conftest.py.

Needs ``pip install playwright jupyterlab`` and ``apt-get install -y chromium`` (never ``playwright install``:
the system Chromium is used through ``executable_path``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("MTLAB_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set MTLAB_CHROMIUM)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install playwright")

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]

# The step counter and the step the plot was drawn at, as the page shows them (-1: not shown yet).
STEP_JS = ("() => { const e = [...document.querySelectorAll('.widget-html-content')]"
           ".find(e => /^step \\d+ /.test(e.textContent)); return e ? parseInt(e.textContent.slice(5)) : -1; }")
DRAWN_JS = ("() => { const e = document.querySelector('.mtlab-asof');"
            " return e ? parseInt(e.textContent.replace('plot as of step ', '')) : -1; }")
# Every text of the dashboard that is cut (wider than its box): tab titles, labels, buttons, HTML, and the chosen
# option of each dropdown (its text measured in the select's font, beside the arrow's 24 px), and a dropdown that
# reaches past the edge of a box that clips it (a tab's page).
CUT_JS = """() => { const d = document.querySelector('.mtlab-dashboard'); const shown = (e) => e.offsetParent !== null;
 const canvas = document.createElement('canvas').getContext('2d'); const cut = [];
 for (const e of d.querySelectorAll('.lm-TabBar-tabLabel, .widget-label, button, .widget-html-content')) {
   if (!shown(e) || !e.innerText.trim()) continue;
   if (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'auto') cut.push(e.innerText.slice(0, 40)); }
 for (const e of d.querySelectorAll('select')) { if (!shown(e) || e.selectedIndex < 0) continue; const s = getComputedStyle(e);
   canvas.font = s.fontSize + ' ' + s.fontFamily; const text = e.options[e.selectedIndex].text;
   if (canvas.measureText(text).width + 24 > e.clientWidth) cut.push('select: ' + text);
   const right = e.getBoundingClientRect().right;  // a box around it that clips (a tab's page) cuts it at its edge
   for (let a = e.parentElement; a && a !== d; a = a.parentElement) { if (getComputedStyle(a).overflowX === 'visible') continue;
     if (right > a.getBoundingClientRect().right + 1) { cut.push('select past its box: ' + text); break; } } }
 return cut; }"""


def wait_for_running_dashboard(page) -> None:  # noqa: ANN001
    """Until the dashboard's run has done 3 steps and its plot drawn 2, then scrolled to it with its image laid
    out (what a screenshot or a measurement of a running dashboard waits for)."""
    page.wait_for_function(f"({STEP_JS})() >= 3 && ({DRAWN_JS})() >= 2", timeout=180_000)
    page.evaluate("() => document.querySelector('.mtlab-dashboard').scrollIntoView()")
    page.wait_for_function("() => document.querySelector('.mtlab-dashboard img.widget-image').naturalWidth > 0",
                           timeout=60_000)
    page.wait_for_timeout(500)  # let the image settle into its box


def open_and_run_all(page, lab: str, name: str) -> None:  # noqa: ANN001
    """Opens notebook ``name`` of the JupyterLab at ``lab`` and runs all its cells once its kernel is idle."""
    page.goto(f"{lab}/lab/tree/{name}?reset")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.commands.hasCommand('notebook:run-all-cells')",
                           timeout=60_000)
    # Run all only once the kernel is connected and idle (earlier, the command does nothing).
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle' && w.sessionContext.isReady; }", timeout=60_000)
    no_news = page.get_by_role("button", name="No", exact=True)
    if no_news.count():
        no_news.first.click()
    # Not awaited: the command's promise resolves only when every cell has run.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def open_and_run_all_notebook7(page, base: str, name: str) -> None:  # noqa: ANN001
    """Opens notebook ``name`` of the Jupyter Notebook 7 server at ``base`` (one notebook per page, no file
    browser beside it) and runs all its cells once its kernel is idle."""
    page.goto(f"{base}/notebooks/{name}")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.commands.hasCommand('notebook:run-all-cells')",
                           timeout=60_000)
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle' && w.sessionContext.isReady; }", timeout=60_000)
    no_news = page.get_by_role("button", name="No", exact=True)
    if no_news.count():
        no_news.first.click()
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def collapse_file_browser(page) -> None:  # noqa: ANN001
    page.evaluate("() => { if (!window.jupyterapp.shell.leftCollapsed)"
                  " window.jupyterapp.commands.execute('application:toggle-left-area'); }")
    page.wait_for_function("() => window.jupyterapp.shell.leftCollapsed", timeout=30_000)


def shoot(page, tmp_path: Path, name: str) -> Path:  # noqa: ANN001
    """A screenshot into ``tmp_path``, copied into ``MTLAB_SCREENSHOTS`` when set (docs/screenshots)."""
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=False)
    where = os.environ.get("MTLAB_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / name)
    return path
