"""The quickstart in a real browser: headless Chromium drives JupyterLab, runs every cell, clicks
the dashboard's Step button and sees the step counter and the plot change.

Needs ``pip install playwright jupyterlab`` and ``apt-get install -y chromium`` (never
``playwright install``: the system Chromium is used through ``executable_path``). Skipped, with
the reason, when any of them is missing. About 30 s.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("MTLAB_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set MTLAB_CHROMIUM)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install playwright")
pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install jupyterlab")
pytest.importorskip("ipykernel", reason="needs ipykernel: pip install ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_quickstart.ipynb"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path: Path):
    """JupyterLab serving a copy of the quickstart (the server may autosave outputs into it)."""
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port = free_port()
    env = {**os.environ, "MTLAB_FAST": "1", "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--port={port}", "--IdentityProvider.token=", "--LabApp.expose_app_in_browser=True",
         f"--ServerApp.root_dir={root}"],
        env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "lab.log").open("w"))
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"JupyterLab did not start; see {tmp_path / 'lab.log'}")
                time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_quickstart_dashboard_step_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{lab}/lab/tree/{NOTEBOOK.name}?reset")
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

        output = page.locator(".jp-OutputArea")
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
        browser.close()
    assert before_text.startswith("step 6 ") and shot.stat().st_size > 10_000
