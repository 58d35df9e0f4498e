"""What the notebooks show (MTLAB_FAST=1): every number or claim their text makes appears in their output,
no stray reprs or raw HTML, progress while they train, audio players under labels, and a slider moved
during notebook 03's own run acts within two steps."""

from __future__ import annotations

import functools
import json
import os
import re
import time

import pytest
from helpers.notebooks import notebook_tools
from helpers.paths import NOTEBOOKS





@functools.cache
def executed(name: str) -> tuple:
    """The notebook run top to bottom with MTLAB_FAST=1 (once per test session): its cells."""
    nbformat, nbclient = notebook_tools()
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    before = {k: os.environ.get(k) for k in ("MTLAB_FAST", "MTLAB_WAIT")}
    os.environ.update(MTLAB_FAST="1", MTLAB_WAIT="1")  # unattended: the notebooks wait for their runs
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return tuple(nb.cells)


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        if "text/plain" in out.get("data", {}):
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


def code_cell(cells, starts: str):
    return next(c for c in cells if c.cell_type == "code" and c.source.startswith(starts))


def prose(cells) -> str:
    return "\n".join(c.source for c in cells if c.cell_type == "markdown")


def numbers(pattern: str, text: str) -> list[float]:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the output:\n{text[-2000:]}"
    return [float(g) for g in match.groups()]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["02_accumulation_explained.ipynb", "04_stepwise_debugging.ipynb"])
def test_setup_cell_prints_no_generator(name: str) -> None:
    cells = executed(name)
    assert "Generator" not in text_of(next(c for c in cells if c.cell_type == "code"))


@pytest.mark.slow
def test_notebook_01_does_not_block_its_run():
    cells = executed("01_quickstart.ipynb")
    start = code_cell(cells, "dash.start(STEPS)")
    assert "wait" not in start.source and "training 5 steps in the background" in text_of(start)
    assert "dash.wait" in prose(cells) and numbers(r"(\d+) steps; validation loss", text_of(
        code_cell(cells, "if WAIT:")))[0] == 1 + 5  # one step by hand, then the run's 5
    blocking = [c.source for c in cells if c.cell_type == "code" and re.search(r"^\s*(while dash.running|dash.wait)",
                                                                                c.source, re.M)]
    assert all("if WAIT:" in s for s in blocking), blocking  # only an unattended run waits


@pytest.mark.slow
def test_notebook_02_errors_and_interactive_cell_and_exercise():
    cells = executed("02_accumulation_explained.ipynb")
    table = text_of(code_cell(cells, "ratios ="))
    rows = re.findall(r"length ratio +(\d+): max \|grad - exact\|  mtlab (\S+)   mean of means (\S+)", table)
    assert [int(r) for r, _, _ in rows] == [1, 2, 5, 10]
    assert all(float(m) < 1e-12 for _, m, _ in rows)  # sum, divide once: exact at every ratio
    mom = [float(x) for _, _, x in rows]
    assert mom[0] < 1e-12 and all(x > 1e-3 for x in mom[1:])  # "both agree at ratio 1", then the error
    assert mom[-1] > mom[1]  # "drifts further the more the lengths differ"
    interactive = code_cell(cells, "import ipywidgets")
    exact, mean_of_means = numbers(r"ratio 10, K = 2: max \|grad - exact grad\| = (\S+) with mtlab .* (\S+) with the mean",
                                   text_of(interactive))
    assert exact < 1e-12 and mean_of_means > 1e-3
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in interactive.outputs)
    assert text_of(code_cell(cells, "from mtlab import exercises")).startswith("PASS accumulation matches one pass")
    wrong = text_of(code_cell(cells, "print(exercises.accumulation_matches_one_pass(lambda"))
    assert wrong.startswith("FAIL accumulation matches one pass") and "mean of per-minibatch means" in wrong
    assert mom[-1] - mom[1] > 0.3 * mom[-1]  # on the figure's linear axis from 0, the drift rises visibly
    figure = code_cell(cells, "ratios =").source
    assert "semilogy" not in figure and "set_ylim(bottom=0)" in figure
    exact_max = max(float(m) for _, m, _ in rows)
    assert exact_max < 1e-15 and "of order 1e-16 in float64" in prose(cells)  # the number the text quotes


def solution_cells(name: str) -> list[dict]:
    """The cells nbgrader marks as solutions, read as the JSON they are (no nbformat: its schema costs seconds)."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    return [{**c, "source": "".join(c["source"])} for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("name,count", [("02_accumulation_explained.ipynb", 1), ("04_stepwise_debugging.ipynb", 2)])
def test_exercise_answers_sit_between_solution_markers(name, count):
    """nbgrader's generate_assignment replaces what lies between the markers by a placeholder: the student's copy
    holds no answer, and the checks stay in cells of their own."""
    cells = solution_cells(name)
    assert len(cells) == count
    for c in cells:
        src = c["source"]
        assert "### BEGIN SOLUTION" in src and "### END SOLUTION" in src
        student = src[:src.index("### BEGIN SOLUTION")] + "raise NotImplementedError()" + \
            src[src.index("### END SOLUTION") + len("### END SOLUTION"):]
        assert "exercises." not in student  # the check is not in the student's cell


@pytest.mark.slow
def test_notebook_03_prints_no_raw_html_and_says_why_its_run_ended():
    cells = executed("03_multitask_linkedsets.ipynb")
    printed = "".join(o["text"] for c in cells for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "run ended after" in printed and not re.search(r"<\w+[ >]", printed)
    assert "the schedule is finished" not in printed  # the run had no schedule: its steps were done
    assert "the steps asked for are done" in printed
    start = code_cell(cells, "dash.start(STEPS)")
    assert "wait" not in start.source  # the run cell returns: the sliders act during the run
    later = [c.source for c in cells if c.cell_type == "code" and re.search(r"dash\.wait|while dash\.running", c.source)]
    assert later and all("if WAIT:  # unattended only" in s for s in later), later  # Run All never blocks the kernel
    conflict = text_of(code_cell(cells, "dash.follow(lambda: mtlab.training.debug.gradient_conflict"))
    (cosine,) = numbers(r"enc / frames vs speaker\s+(-?[\d.e-]+)", conflict)
    assert -1 <= cosine <= 1


@pytest.mark.slow
def test_notebook_04_conflict_and_checked_exercises():
    cells = executed("04_stepwise_debugging.ipynb")
    (cosine,) = numbers(r"cosine of the gradients of tag and utt = ([+-][\d.]+)", text_of(
        code_cell(cells, "for name, sets in trainer.active_tasks()")))
    assert -1 <= cosine <= 1
    found = text_of(code_cell(cells, "print(exercises.found_planted_nan")).splitlines()
    assert found[0].startswith("PASS find the planted NaN") and found[1].startswith("FAIL find the planted NaN")
    assert "minibatches count from 0 within the task" in found[1]  # a wrong value
    assert found[2].startswith("FAIL") and "must be a whole number" in found[2] and "differs" not in found[2]  # a type
    ratio = [text_of(c) for c in cells if c.cell_type == "code" and c.source.startswith("print(exercises.gradient_norm_ratio")]
    assert ratio[0].startswith("FAIL") and "would do" in ratio[0]  # "at the current weights the check fails"
    assert ratio[1].startswith("PASS") and "= 0.500" in ratio[1]
    assert "Phase." not in "".join(text_of(c) for c in cells if c.cell_type == "code")  # no enum reprs


@pytest.mark.slow
def test_notebook_05_pretrained_separator_loss_falls_and_audio_once():
    cells = executed("05_separation.ipynb")
    text = "\n".join(text_of(c) for c in cells if c.cell_type == "code")
    (shipped,) = numbers(r"pretrained separator: dev SI-SDR improvement ([+-][\d.]+) dB over \d+ mixtures", text)
    assert shipped > 3  # a separation a listener hears
    from mtlab.separation.pretrained import pretrained_info

    info = pretrained_info()  # the notebook quotes the file's own figures, read from its output
    layers, hidden, steps = numbers(r"shipped: PIT, BLSTM (\d+)x(\d+), (\d+) training steps", text)
    assert (layers, hidden, steps) == (info["config"]["layers"], info["config"]["hidden"], info["steps"])
    assert layers == 2 and "a 2-layer BLSTM" in prose(cells)
    dev, test, ibm_dev, ibm_test = numbers(r"measured SI-SDR improvement dev ([+-][\d.]+) dB, test ([+-][\d.]+) dB; "
                                           r"ideal binary mask dev ([+-][\d.]+) dB, test ([+-][\d.]+) dB", text)
    assert (dev, test) == (round(info["dev_si_sdri"], 2), round(info["test_si_sdri"], 2))
    assert ibm_dev > dev and ibm_test > test  # "the best a mask can do"
    mean_sum, within = numbers(r"mask 1 \+ mask 2 over the bins: mean ([\d.]+), within 0.2 of 1 in (\d+)% of them", text)
    assert 0 < mean_sum and 0 <= within <= 100
    figure = code_cell(cells, "import matplotlib.pyplot as plt")
    assert any("image/png" in o.get("data", {}) for o in figure.outputs), "the masks are not shown"
    before, after, sdri_before, sdri_after = numbers(
        r"noisy dev loss ([\d.]+) -> ([\d.]+), SI-SDR improvement ([+-][\d.]+) -> ([+-][\d.]+) dB", text)
    assert after < before and sdri_after > sdri_before  # "the dev loss falls, the improvement rises"
    assert "dev loss on the noisy mixtures falls" in prose(cells)
    train = next(c for c in cells if c.cell_type == "code" and "tune.step(STEPS" in c.source)
    progress = [o for o in train.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
                or (o.get("output_type") == "stream" and "step" in o.get("text", ""))]
    assert progress, "fine-tuning shows no progress"
    listen = code_cell(cells, "players = ")
    (html_out,) = [o for o in listen.outputs if "text/html" in o.get("data", {})]
    html = html_out["data"]["text/html"]
    labels = re.findall(r"<b>([^<]+)</b>", html)
    assert labels == ["mixture", "estimate 1", "estimate 2", "reference 1", "reference 2"]
    assert html.count("<audio") == 5 and all(html.index(f"<b>{n}</b>") < html.index("<audio", html.index(f"<b>{n}</b>"))
                                              for n in labels)
    compare = code_cell(cells, "heard = ")
    (html_out,) = [o for o in compare.outputs if "text/html" in o.get("data", {})]
    assert re.findall(r"<b>([^<]+)</b>", html_out["data"]["text/html"]) == [
        "mixture (noisy)", "estimate 1 before fine-tuning", "estimate 2 before fine-tuning",
        "estimate 1 after fine-tuning", "estimate 2 after fine-tuning"]
    clips = [m for c in cells if c.cell_type == "code" for o in c.get("outputs", [])
             for m in re.findall(r"base64,([A-Za-z0-9+/=]+)", o.get("data", {}).get("text/html", ""))]
    assert len(clips) == len(set(clips)), "an audio clip is embedded twice"
    assert all(len(c) * 3 / 4 < 2 * 8000 * 4 + 100 for c in clips)  # 16-bit WAV at 8 kHz, at most 4 s each


@pytest.mark.slow
def test_notebook_06_shows_the_numbers_its_text_quotes():
    cells = executed("06_task_combination.ipynb")
    text = prose(cells)
    out = text_of(code_cell(cells, "ce = mtlab.losses.CrossEntropy"))
    assert "STEPS` = 80 steps" in text and numbers(r"upgrad \(every 10th step\)\n.*\n +(\d+)", out)
    for method in ("sum", "upgrad"):
        first, lowest, frames, swapped, _ = numbers(
            rf"{method}: cosine on the shared head ([+-][\d.]+) at step 1, lowest ([+-][\d.]+) \(step \d+\); losses at "
            r"the end: frames ([\d.]+), swapped ([\d.]+); mean norm of the direction ([\d.]+)", out)
        assert first > 0.5 and "about +0.7" in text  # both learn silence first
        assert lowest <= -0.9 and "about -0.97" in text
        assert 0.69 <= min(frames, swapped) and max(frames, swapped) <= 0.76 and "(0.71 to 0.74 for each loss)" in text
    table = out.split("sum (every 10th step)")[1].split("upgrad (every 10th step)")[0].splitlines()[2:]
    encoder = [float(row.split()[3]) for row in table if row.strip()]
    assert min(encoder) < 0 < max(encoder) and "on the encoder it swings from one\nsign to the other" in text
    sum_norm = numbers(r"sum: .*mean norm of the direction ([\d.]+)", out)[0]
    upgrad_norm = numbers(r"upgrad: .*mean norm of the direction ([\d.]+)", out)[0]
    assert upgrad_norm < sum_norm  # "its direction is shorter"
    a, b, high, low = numbers(r"step 1 ([\d.]+) and ([\d.]+); furthest apart at step \d+: ([\d.]+) against ([\d.]+)", out)
    assert a == b == 0.5 and "gives each weight 1/2" in text
    assert high / low > 2.3 and "at most about 1.6 against 0.6 on one step" in text
    assert abs(high - 1.6) < 0.15 and abs(low - 0.6) < 0.1
    figure = text_of(code_cell(cells, "from IPython.display import Image"))
    for method in ("sum", "upgrad"):  # the trend the text reads ("falls"), as the figure draws it: smoothed
        start, end = numbers(rf"{method}: smoothed cosine on the shared head ([+-][\d.]+) at step 1, ([+-][\d.]+) at "
                             "the end", figure)
        assert start > 0.3 and end < start - 0.5, (method, start, end)
    assert "smooth(" in code_cell(cells, "from IPython.display import Image").source
    (cos_a,) = numbers(r"cosine of the two tasks' accumulated gradients: (-?[\d.]+)", text_of(next(c for c in cells if "tr = mtlab.Trainer" in c.source)))
    assert cos_a < 0 and "frames against speaker" in text


def noise_rows(table: str) -> list[tuple[float, float]]:
    """(|G|² this step, B_simple) of every row the notebook's noise-scale tables print."""
    rows = []
    for line in table.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0].isdigit():
            rows.append((float(cells[2]), float(cells[3])))
    return rows


@pytest.mark.slow
def test_notebook_07_figures_and_the_negative_estimate_explained():
    cells = executed("07_journal_and_noise_scale.ipynb")
    noise = code_cell(cells, "names = {")
    table, text = text_of(noise), " ".join(prose(cells).split())
    assert "|G|² this step" in table and "B_simple (moving averages)" in table
    assert not re.search(r"(^|\s)-0(\.0*)?(\s|$)", table), table  # a small negative number shown as -0.00 says nothing
    assert "can be negative" in text and "unbiased" in text and "moving averages" in text
    rows = noise_rows(table)
    assert len(rows) == 3 * 2  # the last 3 steps of each task
    for g2, b_simple in rows:  # what the text says of a missing B_simple is what the table shows
        if g2 < 0 and b_simple == b_simple:
            assert "One negative step does not spoil `gns`" in text
        if b_simple != b_simple:
            assert "Only while that moving average itself is at or below 0" in text
    runs = code_cell(cells, 'slow = trainer.fork("lower-lr")')
    assert any("image/png" in o.get("data", {}) for o in runs.outputs)  # plot_runs' figure (its layout: tests/ui)
    assert any("image/png" in o.get("data", {}) for o in noise.outputs)


@pytest.mark.slow
def test_notebook_03_under_run_all_ends_on_the_runs_final_numbers():
    """Every code cell at once, as Run All does (no MTLAB_WAIT): the cells after the run's ran at step 0 while
    it trained; once it ends, what they show is the last step's, not ``{}``, a header or empty axes."""
    jupyter_client = pytest.importorskip("jupyter_client")
    nbformat, _ = notebook_tools()
    nb = nbformat.read(NOTEBOOKS / "03_multitask_linkedsets.ipynb", as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    start = next(i for i, s in enumerate(cells) if s.startswith("dash.start(STEPS)"))
    env = {k: v for k, v in os.environ.items() if k != "MTLAB_WAIT"}
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120, cwd=str(NOTEBOOKS),
                                                     env={**env, "MTLAB_FAST": "1"})
    try:
        for source in cells[:start]:
            kernel_run(kc, source)
        kernel_run(kc, "STEPS = 6")  # a run that outlasts the cells below
        for source in cells[start:]:
            kernel_run(kc, source)
        during = kernel_run(kc, "print(trainer.step_count, dash.running)").split()
        kernel_run(kc, "dash.wait(600)")
        shown = kernel_run(kc, "print('\\n=====\\n'.join(f.plain for f in dash.followers))").split("\n=====\n")
        final = int(kernel_run(kc, "print(trainer.step_count)"))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert during[1] == "True" and int(during[0]) < 6  # the cells ran during the run
    assert final == 6 and len(shown) == 3
    conflict, table, figure = shown
    assert all(part.startswith("step 6\n") for part in shown), shown
    (cosine,) = numbers(r"enc / frames vs speaker\s+(-?[\d.e-]+)", conflict)
    assert -1 <= cosine <= 1
    rows = [line.split() for line in table.splitlines()[2:]]
    assert rows and rows[-1][1] == "6" and all(cell not in ("NaN", "–") for cell in rows[-1][1:5]), table
    assert figure.strip().endswith("[figure]")


# ------------------------------------------------------------------------------- 03 steered during its run
def kernel_run(kc, code: str, timeout: float = 300) -> str:
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    return text


RECORD = """
seen = []  # (steps applied, weight) of each frames/noisy minibatch, in the training thread
trainer.add_callback(lambda e, i: seen.append((trainer.step_count, i["state"].records[-1].weight))
                     if e == "minibatch" and i["task"] == "frames" and i["linkedset"] == "noisy" else None)
changed = []  # steps applied when the slider's new value arrived (the kernel's main thread)
dash.sliders["frames/noisy"].observe(lambda change: changed.append(trainer.step_count), "value")
STEPS = 40  # longer than MTLAB_FAST's 3: the slider must arrive mid-run; the test stops the run
"""


@pytest.mark.slow
def test_notebook_03_slider_moved_during_its_run_acts_within_two_steps():
    """Notebook 03's own cells in a kernel, up to its run cell (which returns); then a slider drag as the
    browser sends it: the next frames/noisy minibatches use the new weight, at most 2 steps later."""
    jupyter_client = pytest.importorskip("jupyter_client")
    nbformat, _ = notebook_tools()
    nb = nbformat.read(NOTEBOOKS / "03_multitask_linkedsets.ipynb", as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    start = next(i for i, s in enumerate(cells) if s.startswith("dash.start(STEPS)"))
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120, cwd=str(NOTEBOOKS),
                                                     env={**os.environ, "MTLAB_FAST": "1"})
    try:
        for source in cells[:start]:
            kernel_run(kc, source)
        kernel_run(kc, RECORD)
        kernel_run(kc, cells[start])  # the notebook's run cell: it returns while the run goes on
        model_id = kernel_run(kc, "print(dash.sliders['frames/noisy'].model_id)").strip()
        end = time.monotonic() + 600  # only a hang fails on time
        while int(kernel_run(kc, "print(trainer.step_count)")) < 1:
            assert time.monotonic() < end, "the background run did not progress"
            time.sleep(0.2)
        kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": model_id, "data": {
            "method": "update", "state": {"value": 0.75}, "buffer_paths": []}}))
        probe = "print(json.dumps({'seen': seen, 'changed': changed, 'running': dash.running}))"
        kernel_run(kc, "import json")
        while True:
            state = json.loads(kernel_run(kc, probe).strip().splitlines()[-1])
            if any(w == 0.75 for _, w in state["seen"]):
                break
            assert state["running"] and time.monotonic() < end, f"the new weight never reached the run: {state}"
            time.sleep(0.2)
        kernel_run(kc, "dash.stop()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    (at,) = state["changed"]
    first = next(i for i, (_, w) in enumerate(state["seen"]) if w == 0.75)
    assert state["seen"][first][0] <= at + 2  # within 2 steps of the drag
    assert all(w == 0.25 for _, w in state["seen"][:first]) and all(w == 0.75 for _, w in state["seen"][first:])
    assert at < 40  # mid-run, not after it
