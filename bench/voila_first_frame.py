"""Voila's first frame of the dashboard notebook: how long a class waits, page request to a drawn dashboard.

Starts Voila on notebooks/03_multitask_linkedsets.ipynb (the notebook that builds ``mtlab.ui.dashboard``), as a
teacher does (``voila notebooks/03_multitask_linkedsets.ipynb`` from the checkout), opens it in headless
Chromium at 1280x800 and times, from the page request, the **first frame**: the dashboard's widget shown with
its plot image drawn (``.mtlab-dashboard img.widget-image`` with ``naturalWidth > 0``) and its step counter
("step N ...") visible. Each round starts a fresh Voila server (hence a fresh kernel) and a fresh browser
context (an empty cache, as a first visit).

Where the time goes (seconds from the page request, recorded in the page itself, ``performance.now()``; "server
up" is from the server's start to its port answering, before the request):

- response: the first byte of the page (Voila sends the page's head before it starts the kernel);
- kernel: the kernel is started (Voila writes the page's config, which names the kernel, once it is);
- dashboard cell: the output of the cell that builds the dashboard has arrived (Voila executes every cell on
  the server and streams each one's output as it ends: the data loading and the model cells come before it);
- all cells: the last cell's output has arrived (every cell executed);
- page load: the page's load event (its scripts and styles loaded);
- widgets: the dashboard's widget is on the page and visible (the widget manager connected to the kernel and
  rendered the views);
- first frame: as above. ``step`` is the step the counter shows then.

By default the notebook runs as in class: ``MTLAB_FAST`` unset (the training split, 30 steps). ``--fast``
sets ``MTLAB_FAST=1``, the small dev split and 3 steps, as the browser tests run it. The aim is a first frame
within 20 s on 2 cores; the table gives each round, the median and its ratio to the aim, with the machine's
load average and CPU count at the start (and at the end): run it beside load too.

    python bench/voila_first_frame.py                 # 3 rounds, as in class
    python bench/voila_first_frame.py --fast          # MTLAB_FAST=1, as the browser tests
    python bench/voila_first_frame.py --rounds 5 --aim-s 20

Needs Voila, playwright (``pip install playwright``) and Chromium at /usr/bin/chromium (``MTLAB_CHROMIUM``
elsewhere; never ``playwright install``). Uses tests/helpers (servers, browser flags). Exit status 0 when every
round reached its first frame, 1 otherwise, 2 when something it needs is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # tests/helpers: the servers and the browser's flags of the browser tests

NOTEBOOK = REPO / "notebooks" / "03_multitask_linkedsets.ipynb"
DASHBOARD_CALL = "mtlab.ui.dashboard("
AIM_S = 20.0
VIEWPORT = {"width": 1280, "height": 800}

# Visible: laid out (a box: no ``display: none`` on it or above it, where Voila keeps the cells until they are
# rendered) and not hidden.
VISIBLE_JS = "(e) => !!e && e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden'"
# The first frame: the dashboard shown, its plot image drawn, its step counter ("step N ...") shown.
FIRST_FRAME_JS = (
    "() => { const vis = " + VISIBLE_JS + ";"
    " const d = document.querySelector('.mtlab-dashboard'); if (!d || !vis(d)) return false;"
    " const img = d.querySelector('img.widget-image');"
    " const counter = [...d.querySelectorAll('.widget-html-content')].find(e => /^step \\d+ /.test(e.textContent));"
    " return !!img && img.complete && img.naturalWidth > 0 && vis(img) && !!counter && vis(counter); }")
# The step the dashboard's counter shows (-1: none yet).
COUNTER_STEP_JS = ("() => { const d = document.querySelector('.mtlab-dashboard'); if (!d) return -1;"
                   " const e = [...d.querySelectorAll('.widget-html-content')].find(e => /^step \\d+ /.test(e.textContent));"
                   " return e ? parseInt(e.textContent.slice(5)) : -1; }")
# Run in the page before its own scripts: records, in seconds since the navigation started, when each phase is
# first seen (a MutationObserver for what the streamed HTML adds, a 50 ms poll for what loads or renders).
MARKS_INIT_JS = (
    "(() => { const marks = {cells: {}}; window.__mtlabMarks = marks;"
    " const now = () => performance.now() / 1000;"
    " const vis = " + VISIBLE_JS + "; const firstFrame = " + FIRST_FRAME_JS + ";"
    " const once = (name, ok) => { if (!(name in marks) && ok) marks[name] = now(); };"
    " const probe = () => { try {"
    "   once('kernel', !!document.getElementById('jupyter-config-data'));"
    "   for (const c of document.querySelectorAll('div[cell-index]')) { const i = c.getAttribute('cell-index');"
    "     if (!(i in marks.cells)) marks.cells[i] = now(); }"
    "   const d = document.querySelector('.mtlab-dashboard'); once('widgets', !!d && vis(d));"
    "   once('first_frame', firstFrame());"
    " } catch (err) { marks.error = String(err); } };"
    " new MutationObserver(probe).observe(document, {childList: true, subtree: true});"
    " const timer = setInterval(() => { probe(); if ('first_frame' in marks) clearInterval(timer); }, 50);"
    " document.addEventListener('DOMContentLoaded', () => once('dom', true));"
    " window.addEventListener('load', () => { once('load', true);"
    "   const nav = performance.getEntriesByType('navigation')[0];"
    "   if (nav) marks.response = nav.responseStart / 1000; });"
    "})();")

# The table's phases, in order: (key of a round's record, column title).
PHASES = (("server_up", "server up"), ("response", "response"), ("kernel", "kernel"),
          ("dashboard_cell", "dash cell"), ("all_cells", "all cells"), ("load", "page load"),
          ("widgets", "widgets"), ("first_frame", "first frame"))


def dashboard_cell(notebook: Path = NOTEBOOK) -> tuple[int, int]:
    """(Voila's index of the cell that builds the dashboard, the notebook's number of cells). Voila numbers
    every cell, markdown too, from 1. Raises ValueError when no code cell calls ``mtlab.ui.dashboard(``."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    for i, cell in enumerate(cells):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code" and DASHBOARD_CALL in source:
            return i + 1, len(cells)
    raise ValueError(f"no code cell of {notebook} calls {DASHBOARD_CALL!r}: which notebook shows the dashboard?")


def phases(marks: dict, server_up: float | None, dash_cell: int, n_cells: int) -> dict[str, float | None]:
    """A round's record from the page's marks (seconds since the request; None: not seen)."""
    cells = {int(k): v for k, v in (marks.get("cells") or {}).items()}
    return {"server_up": server_up, "response": marks.get("response"), "kernel": marks.get("kernel"),
            "dashboard_cell": cells.get(dash_cell), "all_cells": cells.get(n_cells), "load": marks.get("load"),
            "widgets": marks.get("widgets"), "first_frame": marks.get("first_frame"), "cells": cells}


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


@dataclass
class Summary:
    median_s: float | None  # median first frame over the rounds that reached one (None: none did)
    ratio: float | None  # median / aim
    aim_s: float
    reached: int  # rounds that reached their first frame
    rounds: int
    verdict: str
    medians: dict[str, float | None] = field(default_factory=dict)  # every phase's median


def summarize(records: list[dict[str, float | None]], aim_s: float = AIM_S) -> Summary:
    """The median first frame, its ratio to ``aim_s`` and the verdict: "within the aim", "over the aim", or
    "failed" when a round reached no first frame (the median is then over the rounds that did)."""
    frames = [r.get("first_frame") for r in records]
    done = [f for f in frames if finite(f)]
    median = statistics.median(done) if done else None
    ratio = median / aim_s if median is not None else None
    medians = {}
    for key, _ in PHASES:
        seen = [r.get(key) for r in records if finite(r.get(key))]
        medians[key] = statistics.median(seen) if seen else None
    if len(done) < len(frames) or not frames:
        verdict = f"failed: {len(frames) - len(done)} of {len(frames)} rounds reached no first frame"
    elif ratio <= 1:
        verdict = "within the aim"
    else:
        verdict = "over the aim"
    return Summary(median, ratio, aim_s, len(done), len(frames), verdict, medians)


def cell_medians(records: list[dict]) -> dict[int, float]:
    """Cell index -> the median time its output arrived, over the rounds that saw it."""
    seen: dict[int, list[float]] = {}
    for r in records:
        for i, t in (r.get("cells") or {}).items():
            seen.setdefault(int(i), []).append(t)
    return {i: statistics.median(ts) for i, ts in sorted(seen.items())}


def _cell(x: float | None, width: int) -> str:
    return f"{x:>{width}.1f}" if finite(x) else f"{'-':>{width}}"


def format_table(records: list[dict], summary: Summary, machine: dict) -> str:
    """The printed table: a header naming the run and the machine, one line per round (each phase's seconds
    and the step shown at the first frame), the medians, and the verdict line."""
    widths = [max(len(title), 6) + 2 for _, title in PHASES]
    lines = [f"Voila first frame of {machine.get('notebook', NOTEBOOK.name)} ({machine.get('mode', '?')}), "
             f"headless Chromium {VIEWPORT['width']}x{VIEWPORT['height']}",
             f"machine: {machine.get('cpus')} CPUs, load average {_load(machine.get('load_start'))} at start, "
             f"{_load(machine.get('load_end'))} at end",
             "seconds from the page request (server up: from the server's start to its port open)",
             f"{'round':<7}" + "".join(f"{title:>{w}}" for (_, title), w in zip(PHASES, widths)) + f"{'step':>6}"]
    for i, r in enumerate(records, 1):
        step = r.get("step")
        lines.append(f"{i:<7}" + "".join(_cell(r.get(k), w) for (k, _), w in zip(PHASES, widths))
                     + (f"{step:>6}" if step is not None else f"{'-':>6}") + (f"  {r['note']}" if r.get("note") else ""))
    lines.append(f"{'median':<7}" + "".join(_cell(summary.medians.get(k), w) for (k, _), w in zip(PHASES, widths)))
    cells = cell_medians(records)
    if cells:
        lines.append("each cell's output arrived (median s; cell " + str(machine.get("dash_cell", "?")) +
                     " builds the dashboard): " + "  ".join(f"{i}: {t:.1f}" for i, t in cells.items()))
    median = f"{summary.median_s:.1f} s" if summary.median_s is not None else "-"
    ratio = f"{summary.ratio:.2f}" if summary.ratio is not None else "-"
    lines.append(f"first frame: median {median} over {summary.reached} of {summary.rounds} rounds; aim "
                 f"{summary.aim_s:g} s; ratio {ratio}: {summary.verdict}")
    return "\n".join(lines)


def _load(load: tuple[float, ...] | None) -> str:
    return " ".join(f"{x:.2f}" for x in load) if load else "?"


# ----------------------------------------------------------------------------- the browser part
def missing() -> str | None:
    """Why the benchmark cannot run here (None: it can)."""
    chromium = os.environ.get("MTLAB_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        return f"no Chromium at {chromium}: apt-get install -y chromium (or set MTLAB_CHROMIUM)"
    for module, what in (("voila", "pip install voila"), ("playwright.sync_api", "pip install playwright")):
        try:
            __import__(module)
        except ImportError:
            return f"needs {module.split('.')[0]}: {what}"
    return None


def kernel_env(fast: bool) -> dict[str, str]:
    """The server's (and so the kernel's) environment: the caller's, MTLAB_FAST=1 with ``fast``, else unset;
    MTLAB_WAIT unset (a class never waits for the run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MTLAB_FAST", "MTLAB_WAIT")}
    if fast:
        env["MTLAB_FAST"] = "1"
    return env


def one_round(browser, notebook: Path, fast: bool, timeout_s: float, folder: Path, dash_cell: int,
              n_cells: int) -> dict:  # noqa: ANN001
    """A fresh Voila server on ``notebook`` and a fresh browser context; the round's record."""
    from helpers.notebook03 import ERRORS_JS
    from helpers.servers import free_port, port_open, server

    port = free_port()
    cmd = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1"]
    t0 = time.perf_counter()
    record: dict = {}
    with server("Voila", cmd, port_open(port), folder / "voila.log", cwd=REPO, env=kernel_env(fast)):
        server_up = time.perf_counter() - t0
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.add_init_script(MARKS_INIT_JS)
        try:
            page.goto(f"http://127.0.0.1:{port}/", wait_until="commit", timeout=timeout_s * 1000)
            page.wait_for_function("() => window.__mtlabMarks && 'first_frame' in window.__mtlabMarks",
                                   timeout=timeout_s * 1000, polling=100)
            note = ""
        except Exception as e:  # a timeout: the record says how far the page came
            note = f"no first frame within {timeout_s:g} s ({type(e).__name__}); screenshot {folder / 'page.png'}"
            page.screenshot(path=str(folder / "page.png"))
        marks = page.evaluate("() => window.__mtlabMarks || {}")
        record = phases(marks, server_up, dash_cell, n_cells)
        record["step"] = page.evaluate(COUNTER_STEP_JS) if "first_frame" in marks else None
        errors = page.evaluate(ERRORS_JS)
        if errors:
            note = (note + "; " if note else "") + f"errors on the page: {errors[0][:120]!r}"
        if marks.get("error"):
            note = (note + "; " if note else "") + f"probe: {marks['error']}"
        record["note"] = note
        context.close()
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each with a fresh server, kernel and browser context")
    ap.add_argument("--fast", action="store_true", help="MTLAB_FAST=1 (the browser tests' setting): dev split, 3 steps")
    ap.add_argument("--aim-s", type=float, default=AIM_S, help="the aim for the median first frame (seconds)")
    ap.add_argument("--timeout-s", type=float, default=240, help="a round with no first frame by then fails")
    ap.add_argument("--notebook", type=Path, default=NOTEBOOK, help="the notebook (default: notebook 03)")
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"bench/voila_first_frame.py cannot run here: {why}", file=sys.stderr)
        sys.exit(2)
    from helpers.browser import CHROMIUM, FLAGS, sync_api

    dash_cell, n_cells = dashboard_cell(args.notebook)
    mode = "MTLAB_FAST=1, as the browser tests" if args.fast else "MTLAB_FAST unset, as in class"
    machine = {"cpus": os.cpu_count(), "load_start": os.getloadavg(), "notebook": args.notebook.name, "mode": mode,
               "dash_cell": dash_cell}
    print(f"{args.notebook.name}: cell {dash_cell} of {n_cells} builds the dashboard; {mode}; "
          f"{args.rounds} round(s); load average {_load(machine['load_start'])}, {machine['cpus']} CPUs", flush=True)
    records = []
    tmp = tempfile.mkdtemp(prefix="voila-first-frame-")  # the servers' logs; kept when a round fails
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        for i in range(args.rounds):
            folder = Path(tmp) / f"round{i + 1}"
            folder.mkdir()
            record = one_round(browser, args.notebook, args.fast, args.timeout_s, folder, dash_cell, n_cells)
            records.append(record)
            ff = record["first_frame"]
            print(f"round {i + 1}: first frame {ff:.1f} s" if finite(ff) else f"round {i + 1}: {record['note']}",
                  flush=True)
            if record.get("note") and not finite(ff):
                log = folder / "voila.log"
                print("  Voila's log, last lines:\n  " + "\n  ".join(log.read_text().splitlines()[-15:]), flush=True)
        browser.close()
        machine["load_end"] = os.getloadavg()
    summary = summarize(records, args.aim_s)
    if summary.reached == summary.rounds:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"the servers' logs and screenshots: {tmp}")
    print()
    print(format_table(records, summary, machine))
    sys.exit(0 if summary.reached == summary.rounds else 1)


if __name__ == "__main__":
    main()
