"""The dashboard in Jupyter Notebook 7, the other front end classes use, in headless Chromium: a slider moved
in the page reaches the kernel's trainer (its journal records the change), the run button trains the steps asked
for in the background, the plot follows to the last step and the read-out shows it. As the JupyterLab test
(tests/browser/test_jupyterlab.py) does, every wait is for an event on the page, never for wall-clock speed.

Needs ``pip install playwright 'notebook>=7'`` and ``apt-get install -y chromium``; skipped, with the reason,
when any is missing. The screenshot goes to ``MTLAB_SCREENSHOTS`` when set (docs/screenshots/notebook7_1280x800.png).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, FLAGS, open_and_run_all_notebook7, shoot, sync_api
from helpers.paths import TESTS

pytestmark = pytest.mark.slow  # a server, a kernel and a browser

NOTEBOOK = "dashboard_nb7.ipynb"
CELLS = [
    f"""import sys
sys.path.insert(0, {str(TESTS)!r})
import torch
torch.set_num_threads(1)
import mtlab, mtlab.ui
from helpers import make_examples, make_models, task_a, task_b
ex = make_examples(48, 5)
trainer = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")""",
    "dash = mtlab.ui.dashboard(trainer)\ndash",
]
STEPS = 4

OUT = ".jp-OutputArea"
COUNTER_JS = ("() => { const e = [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
              ".find(e => /^step \\d+ /.test(e.textContent)); return e ? parseInt(e.textContent.slice(5)) : -1; }")
AS_OF_JS = ("() => { const e = document.querySelector('.jp-OutputArea .mtlab-asof');"
            " return e ? parseInt(e.textContent.replace('plot as of step ', '')) : -1; }")
STATUS_JS = ("() => [...document.querySelectorAll('.jp-OutputArea .widget-html-content')]"
             ".map(e => e.textContent).join(' | ')")
READOUT_JS = ("() => Object.fromEntries([...document.querySelectorAll('.jp-OutputArea table.mtlab-readout tr')]"
              ".map(r => [...r.querySelectorAll('td')].map(c => c.textContent)).filter(c => c.length >= 2)"
              ".map(c => [c[0], c[1]]))")  # series -> the step its value is from


def write_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_dashboard_run_slider_and_plot_in_notebook7(notebook7: str, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb7" / NOTEBOOK)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        open_and_run_all_notebook7(page, notebook7, NOTEBOOK)
        output = page.locator(OUT)
        run = output.get_by_role("button", name="run", exact=True)
        run.wait_for(timeout=120_000)
        assert page.evaluate(COUNTER_JS) == 0
        image = output.locator("img.widget-image").first
        image.wait_for(timeout=60_000)
        before_src = image.get_attribute("src")

        # A slider: task b's weight to 0.5, typed into its read-out as a person does; the status line says it.
        output.locator(".lm-TabBar-tab", has_text="weights").first.click()
        readout = output.locator(".widget-slider", has_text="task b").locator(".widget-readout").first
        readout.fill("0.5")
        readout.press("Enter")
        page.wait_for_function(f"() => ({STATUS_JS})().includes('task b weight 0.5')", timeout=60_000)

        # The run: STEPS steps in the background from the steps box and the run button.
        steps_box = output.locator(".widget-inline-hbox", has_text="steps").locator("input").first
        steps_box.fill(str(STEPS))
        steps_box.press("Enter")
        run.click()
        page.wait_for_function(f"() => ({STATUS_JS})().includes('run ended after {STEPS} step(s) (now at step {STEPS})')",
                               timeout=180_000)
        assert page.evaluate(COUNTER_JS) == STEPS
        # The plot: redrawn from the run's thread up to its last step.
        page.wait_for_function(f"({AS_OF_JS})() === {STEPS}", timeout=60_000)
        assert image.get_attribute("src") != before_src

        # The slider reached the kernel's trainer: its journal, shown in the read-out tab, records the change at
        # step 0, before the run's first step; the read-out of the last step lists the run's losses.
        read = output.locator(".widget-inline-hbox", has_text="read").locator("input").first
        read.fill(str(STEPS))
        read.press("Enter")
        output.locator(".lm-TabBar-tab", has_text="read-out").first.click()
        page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea table.mtlab-readout td')]"
                               ".some(e => e.textContent === 'b/loss')", timeout=60_000)
        values = page.evaluate(READOUT_JS)
        assert values.get("b/loss") == str(STEPS) and values.get("a/loss") == str(STEPS), values
        assert "step 0: task b weight 0.5" in page.evaluate(STATUS_JS)
        output.locator(".lm-TabBar-tab", has_text="weights").first.click()
        page.evaluate("() => document.querySelector('.jp-OutputArea .widget-html-content').scrollIntoView()")
        shot = shoot(page, tmp_path, "notebook7_1280x800.png")
        browser.close()
    assert shot.stat().st_size > 10_000
