"""Presentation mode as a teacher projects it, in JupyterLab (headless Chromium) at 1280x800 and at 150 % zoom
(853x533 CSS px), with every slider chosen: plot, sliders and "plot as of step N" on the first screen, every
slider track at least 200 CSS px (the smooth, zoom and clip sliders under them too: a drag anywhere, not only to
one end), the plot's text at least 12 CSS px as shown (its PNG's text size times the shown/drawn width), and no
text cut (tab titles, dropdowns, buttons, labels). Measured in the page and in the kernel; the screenshots are
kept with ``MTLAB_SCREENSHOTS=docs/screenshots``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, CUT_JS, FLAGS, collapse_file_browser, open_and_run_all, shoot, sync_api, wait_for_running_dashboard
from helpers.paths import TESTS

pytestmark = pytest.mark.slow  # a server, a kernel and a browser

NOTEBOOK = "present_all.ipynb"
SETUP = f"""import sys
sys.path.insert(0, {str(TESTS)!r})
import json
import torch
torch.set_num_threads(1)
import mtlab, mtlab.ui
from matplotlib.text import Text
from helpers.figures import overlaps
from helpers import make_examples, make_models, task_a, task_b
ex = make_examples(96, 5)
trainer = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=0.5, device="cpu")"""
KERNEL_JS = ("async (code) => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;"
             " const f = k.requestExecute({code: code, silent: false, store_history: false}); let out = '';"
             " f.onIOPub = (m) => { if (m.header.msg_type === 'stream') out += m.content.text; }; await f.done;"
             " return out; }")
# The smallest text of the live figure in its PNG's pixels, and the PNG's width.
FIGURE_TEXT = ("dash.painter.idle(30); fig = dash.live.figure; fig.canvas.draw(); print(json.dumps({'px': min(t.get_fontsize() * fig.dpi / 72"
               " for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()),"
               " 'width': fig.get_figwidth() * fig.dpi, 'overlaps': overlaps(fig)}))")
# What the page shows: the first screen (the viewport cut by the notebook's scrolling panel), the plot's box,
# each slider's track and label, and every text that is cut (wider than its box).
PAGE_JS = """() => { const d = document.querySelector('.mtlab-dashboard'); const box = (e) => { const r =
 e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width}; };
 const view = {left: 0, top: 0, right: window.innerWidth, bottom: window.innerHeight};
 for (let e = d.parentElement; e && e !== document.body; e = e.parentElement) { const s = getComputedStyle(e);
 if (!/(auto|scroll|hidden)/.test(s.overflowX + s.overflowY)) continue; const c = e.getBoundingClientRect();
 view.left = Math.max(view.left, c.left); view.top = Math.max(view.top, c.top);
 view.right = Math.min(view.right, c.right); view.bottom = Math.min(view.bottom, c.bottom); }
 const shown = (e) => e.offsetParent !== null;
 const side = d.querySelector(".mtlab-side");
 const sliders = [...d.querySelectorAll('.widget-slider')].filter(shown).map(s => ({
   name: s.innerText.split('\\n')[0], box: box(s), track: box(s.querySelector('.slider-container') || s)}));
 const asof = d.querySelector('.mtlab-asof');
 return {view: view, plot: box(d.querySelector('img.widget-image')), asof: asof ? box(asof) : null,
   side: side ? [...side.querySelectorAll('.widget-slider')].map(s => s.innerText.split('\\n')[0]) : [],
   sliders: sliders, cut: (""" + CUT_JS + """)()}; }"""


def inside(box, view) -> bool:
    return (view["left"] - 1 <= box["left"] and box["right"] <= view["right"] + 1 and view["top"] - 1 <= box["top"]
            and box["bottom"] <= view["bottom"] + 1)


@pytest.mark.parametrize("viewport, scale, name", [({"width": 1280, "height": 800}, 1, "1280x800"),
                                                   ({"width": 853, "height": 533}, 1.5, "150pct")])
def test_presentation_mode_is_readable_and_every_slider_usable(lab: str, tmp_path: Path, viewport, scale, name) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP),
                nbformat.v4.new_code_cell("dash = mtlab.ui.dashboard(trainer, presentation=True)\ndash"),
                nbformat.v4.new_code_cell("dash.start(0)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(tmp_path / "lab" / NOTEBOOK))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport=viewport, device_scale_factor=scale)
        open_and_run_all(page, lab, NOTEBOOK)
        collapse_file_browser(page)
        wait_for_running_dashboard(page)
        seen = page.evaluate(PAGE_JS)
        shoot(page, tmp_path, f"jupyterlab_presentation_all_sliders_{name}.png")
        page.get_by_role("button", name="stop", exact=True).click()
        # Measured once the run has stopped: drawing the live figure here, beside the painter, would race it.
        page.wait_for_function("() => !/running/.test(document.querySelector('.mtlab-dashboard').innerText"
                               ".split('\\n')[0])", timeout=60_000)
        figure = json.loads(page.evaluate(KERNEL_JS, FIGURE_TEXT))
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.shutdown()")
        browser.close()
    print(json.dumps({"seen": seen, "figure": figure}))
    names = {s["name"] for s in seen["sliders"]}
    assert {"a/noisy weight", "a/clean weight", "lr"} <= names, seen["sliders"]  # every slider beside the plot
    short = {s["name"]: round(s["track"]["width"]) for s in seen["sliders"] if s["track"]["width"] < 200}
    assert not short, f"slider tracks under 200 CSS px: {short}"
    off = [s["name"] for s in seen["sliders"] if s["name"] in seen["side"] and not inside(s["box"], seen["view"])]
    assert not off and inside(seen["plot"], seen["view"]), (off, seen["plot"], seen["view"])  # one screen
    assert seen["asof"] and inside(seen["asof"], seen["view"]), (seen["asof"], seen["view"])  # "plot as of step N"
    shown_px = figure["px"] * seen["plot"]["width"] / figure["width"]
    assert shown_px >= 12, f"the plot's smallest text shows at {shown_px:.1f} CSS px"
    assert not seen["cut"], f"texts cut: {seen['cut']}"
    assert not figure["overlaps"], f"texts of the plot over each other: {figure['overlaps']}"
