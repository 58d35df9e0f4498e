"""The dashboard in a real IPython kernel: a slider moved by a comm message, as the browser sends
it, while a background run trains, changes the weight used by the following minibatches."""

from __future__ import annotations

import json
import time

import pytest
from helpers.paths import TESTS

pytestmark = pytest.mark.slow  # kernels and notebooks: not in the fast tier

pytest.importorskip("ipykernel", reason="the real-kernel test needs ipykernel (pip install ipykernel)")
jupyter_client = pytest.importorskip("jupyter_client", reason="the real-kernel test needs jupyter_client")

SETUP = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
import mtlab, mtlab.ui
from helpers import make_examples, make_models, task_a
ex = make_examples(24, 5)
tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, clip_grad_value=0.5, device="cpu",
                   numbatches_to_aggregate=2)
seen = []  # (step being accumulated, linked set, weight the minibatch used)
tr.add_callback(lambda e, i: seen.append((tr.step_count, i["linkedset"], i["state"].records[-1].weight))
                if e == "minibatch" else None)
d = mtlab.ui.dashboard(tr, plots=False)
d.start(0)
print(json.dumps({{"model_id": d.sliders["a/noisy"].model_id}}))
"""


def run(kc, code: str, timeout: float = 60) -> str:
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


def test_slider_comm_message_changes_the_weight_mid_run():
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        model_id = json.loads(run(kc, SETUP, timeout=120).strip().splitlines()[-1])["model_id"]
        end = time.monotonic() + 60
        while int(run(kc, "print(tr.step_count)")) < 3:
            assert time.monotonic() < end, "the background run did not progress"
            time.sleep(0.1)
        # Exactly what the browser sends when the user drops the slider at 0.125.
        msg = kc.session.msg("comm_msg", {"comm_id": model_id,
                                          "data": {"method": "update", "state": {"value": 0.125}, "buffer_paths": []}})
        kc.shell_channel.send(msg)
        while run(kc, "print(any(w == 0.125 for _, _, w in seen))").strip() != "True":
            assert time.monotonic() < end, "the new weight never reached the training thread"
            time.sleep(0.1)
        time.sleep(0.3)  # let a few more steps run with the new weight
        result = json.loads(run(kc, "d.stop(); print(json.dumps({'seen': seen, 'weight': "
                                    "tr.tasks['a'].linkedsets['noisy'].weight, 'slider': d.sliders['a/noisy'].value, "
                                    "'error': repr(d.error), 'running': d.running}))").strip().splitlines()[-1])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert result["weight"] == 0.125 and result["slider"] == 0.125
    assert result["error"] == "None" and not result["running"]
    noisy = [(step, w) for step, s, w in result["seen"] if s == "noisy"]
    first = next(i for i, (_, w) in enumerate(noisy) if w == 0.125)
    assert first >= 3 * 2 and all(w == 0.5 for _, w in noisy[:first])  # it was mid-run, after >= 3 steps
    assert all(w == 0.125 for _, w in noisy[first:])  # every following minibatch used the new weight
    assert noisy[-1][0] > noisy[first][0]  # and the run went on for more steps
    assert all(w == 1.0 for _, s, w in result["seen"] if s == "clean")


INTERRUPT_SETUP = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import mtlab, mtlab.ui
from helpers import make_examples, make_models, task_a
ex = make_examples(24, 5)
tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, device="cpu")
d = mtlab.ui.dashboard(tr, plots=False)
d.start(0)
"""


# Not running any more is not enough: a run told to stop ("stopping") finishes its step and its thread first.
ENDED = "print(not d.running and not d.run.alive)"


def wait_steps(kc, n: int, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while int(run(kc, "print(tr.step_count)")) < n:
        assert time.monotonic() < end, "the background run did not progress"
        time.sleep(0.1)


def test_kernel_interrupt_stops_the_background_run():
    """Kernel -> Interrupt sends SIGINT: idle (the run started by a cell that has ended), and
    while a cell waits on the run (that cell ends with one line, no traceback); both stop it between
    steps and leave the kernel usable."""
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        run(kc, INTERRUPT_SETUP, timeout=120)
        wait_steps(kc, 2)
        time.sleep(0.5)  # the kernel is idle: ipykernel ignores SIGINT unless mtlab's handler is in place
        km.interrupt_kernel()
        end = time.monotonic() + 30
        while run(kc, ENDED).strip() != "True":
            assert time.monotonic() < end, "Kernel -> Interrupt did not stop the idle-time run"
            time.sleep(0.1)
        first = run(kc, "print(d.run.reason, mtlab.ui.current_run(tr))").strip()
        # Now a cell that blocks on the run, interrupted while it executes.
        msg_id = kc.execute("d.start(0); d.wait()")
        time.sleep(2.0)  # the cell is executing d.wait()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=60)
        shown = []  # what the interrupted cell printed: one line, no traceback
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                shown += msg["content"]["text"].splitlines()
            elif msg["msg_type"] == "error":
                shown.append("traceback: " + msg["content"]["ename"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        end = time.monotonic() + 30
        while run(kc, ENDED).strip() != "True":
            assert time.monotonic() < end, "interrupting a cell that waits on the run did not stop it"
            time.sleep(0.1)
        second = run(kc, "print(d.run.reason)").strip()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert first == "interrupted None"
    assert reply["content"]["status"] == "ok"  # the interrupt stopped the run and ended the cell quietly
    assert len(shown) == 1 and shown[0].startswith("Interrupted: the run stopped at step"), shown
    assert second == "interrupted"
