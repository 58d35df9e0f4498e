"""bench/voila_first_frame.py: the notebook it serves, the page probes it installs, and how it turns a round's
marks into the table, the median, its ratio to the aim and the verdict; one slow run of the real thing (one
round, MTLAB_FAST=1). Never its timings: the benchmark prints the verdict, no test asserts a speed."""

from __future__ import annotations

import importlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import BENCH, NOTEBOOKS, REPO

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
vff = importlib.import_module("voila_first_frame")


def record(first_frame, **phases):
    base = {"server_up": 2.0, "response": 1.0, "kernel": 2.0, "dashboard_cell": 8.0, "all_cells": 9.0,
            "load": 10.0, "widgets": 11.0, "first_frame": first_frame, "step": 1, "note": ""}
    return {**base, **phases}


def test_it_serves_the_notebook_that_builds_the_dashboard():
    assert vff.NOTEBOOK == NOTEBOOKS / "03_multitask_linkedsets.ipynb"
    index, n = vff.dashboard_cell()
    cells = json.loads(vff.NOTEBOOK.read_text())["cells"]
    assert n == len(cells) and "mtlab.ui.dashboard(" in "".join(cells[index - 1]["source"])  # Voila counts from 1
    assert cells[index - 1]["cell_type"] == "code"


def test_a_notebook_without_a_dashboard_is_refused_by_name(tmp_path: Path):
    nb = tmp_path / "plain.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": ["print(1)"]}]}))
    with pytest.raises(ValueError, match="calls 'mtlab.ui.dashboard\\('"):
        vff.dashboard_cell(nb)


def test_the_median_ratio_and_verdict_of_the_rounds():
    s = vff.summarize([record(12.0), record(18.0), record(15.0)], aim_s=20)
    assert s.median_s == 15.0 and s.ratio == 0.75 and s.verdict == "within the aim" and s.reached == 3
    assert s.medians["widgets"] == 11.0 and s.medians["server_up"] == 2.0
    over = vff.summarize([record(30.0), record(25.0)], aim_s=20)
    assert over.median_s == 27.5 and over.ratio == 1.375 and over.verdict == "over the aim"
    exactly = vff.summarize([record(20.0)], aim_s=20)
    assert exactly.ratio == 1.0 and exactly.verdict == "within the aim"


def test_a_round_without_a_first_frame_fails_the_run_and_the_median_is_of_the_others():
    s = vff.summarize([record(10.0), record(None, widgets=None), record(14.0)], aim_s=20)
    assert s.median_s == 12.0 and s.reached == 2 and s.rounds == 3
    assert s.verdict == "failed: 1 of 3 rounds reached no first frame"
    none = vff.summarize([record(None)], aim_s=20)
    assert none.median_s is None and none.ratio is None and none.verdict.startswith("failed")
    assert vff.summarize([record(math.nan)]).reached == 0


def test_the_table_shows_each_round_the_medians_the_ratio_and_the_machine():
    records = [record(12.0, cells={1: 1.9, 6: 8.0, 15: 9.0}), record(18.0, cells={1: 2.1, 6: 8.4, 15: 9.6}),
               record(None, note="no first frame within 240 s")]
    machine = {"cpus": 2, "load_start": (2.75, 2.5, 1.9), "load_end": (3.0, 2.6, 2.0), "mode": "MTLAB_FAST unset",
               "notebook": "03_multitask_linkedsets.ipynb", "dash_cell": 6}
    text = vff.format_table(records, vff.summarize(records, 20), machine)
    lines = text.splitlines()
    assert "machine: 2 CPUs, load average 2.75 2.50 1.90 at start, 3.00 2.60 2.00 at end" in text
    header = next(line for line in lines if line.startswith("round"))
    for _, title in vff.PHASES:
        assert title in header
    row1 = next(line for line in lines if line.startswith("1 "))
    assert row1.split()[1:] == ["2.0", "1.0", "2.0", "8.0", "9.0", "10.0", "11.0", "12.0", "1"]
    row3 = next(line for line in lines if line.startswith("3 "))
    assert "no first frame within 240 s" in row3 and row3.split()[8] == "-"
    median = next(line for line in lines if line.startswith("median"))
    assert median.split()[-1] == "15.0"  # the first frames' median, over the two rounds that had one
    assert "6: 8.2" in text  # the dashboard cell's median arrival
    assert lines[-1] == ("first frame: median 15.0 s over 2 of 3 rounds; aim 20 s; ratio 0.75: "
                         "failed: 1 of 3 rounds reached no first frame")


def test_phases_read_the_page_marks():
    marks = {"response": 0.9, "kernel": 2.1, "cells": {"1": 2.2, "6": 8.5, "15": 9.0}, "load": 9.9,
             "widgets": 11.1, "first_frame": 11.4}
    r = vff.phases(marks, server_up=2.7, dash_cell=6, n_cells=15)
    assert (r["server_up"], r["response"], r["kernel"], r["dashboard_cell"], r["all_cells"], r["load"],
            r["widgets"], r["first_frame"]) == (2.7, 0.9, 2.1, 8.5, 9.0, 9.9, 11.1, 11.4)
    assert vff.phases({}, None, 6, 15)["first_frame"] is None


def test_the_first_frame_predicate_asks_for_a_drawn_plot_and_a_visible_counter_in_the_dashboard():
    js = vff.FIRST_FRAME_JS
    assert js.startswith("() => {") and js.count("{") == js.count("}") and js.count("(") == js.count(")")
    assert "document.querySelector('.mtlab-dashboard')" in js and "d.querySelector('img.widget-image')" in js
    assert "img.naturalWidth > 0" in js and "vis(img)" in js and "vis(counter)" in js
    # the counter's text as the dashboard writes it (mtlab.ui.texts.counter_html: "<b>step N</b> &middot; ...")
    counter = re.compile(re.search(r"/(\^step .+?)/\.test", js).group(1))
    assert counter.match("step 12 · frames: ready") and not counter.match("plot as of step 3")
    init = vff.MARKS_INIT_JS
    assert vff.FIRST_FRAME_JS in init and "jupyter-config-data" in init and "div[cell-index]" in init
    assert init.count("{") == init.count("}")


def test_the_kernel_runs_as_in_class_unless_fast(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MTLAB_FAST", "1")
    monkeypatch.setenv("MTLAB_WAIT", "1")
    assert "MTLAB_FAST" not in vff.kernel_env(False) and "MTLAB_WAIT" not in vff.kernel_env(False)
    assert vff.kernel_env(True)["MTLAB_FAST"] == "1" and "MTLAB_WAIT" not in vff.kernel_env(True)


@pytest.mark.slow
def test_one_round_in_voila_prints_a_finite_first_frame_and_the_table():
    why = vff.missing()
    if why:
        pytest.skip(why)
    out = subprocess.run([sys.executable, str(BENCH / "voila_first_frame.py"), "--rounds", "1", "--fast",
                          "--timeout-s", "400"], capture_output=True, text=True, cwd=REPO, timeout=560)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    first = float(re.search(r"^round 1: first frame ([\d.]+) s$", out.stdout, re.M).group(1))
    assert math.isfinite(first) and first > 0
    assert "MTLAB_FAST=1" in out.stdout and re.search(r"load average [\d.]+ [\d.]+ [\d.]+ at start", out.stdout)
    row = next(line for line in out.stdout.splitlines() if line.startswith("1 "))
    assert float(row.split()[8]) == first  # the table's first frame
    verdict = out.stdout.strip().splitlines()[-1]
    assert re.match(r"first frame: median [\d.]+ s over 1 of 1 rounds; aim 20 s; ratio [\d.]+: (within|over) the aim$",
                    verdict), verdict
