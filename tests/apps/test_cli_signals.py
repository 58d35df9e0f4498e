"""A job as a batch scheduler runs it: SIGTERM (a stop, a preemption) and SIGUSR1 (SLURM's warning ahead of the
time limit) stop `mtlab train` as Ctrl-C does, with final.pt of the step it reached and the conventional exit
status; `mtlab resume` then ends where the uninterrupted run ends, row for row and bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.recipes import write_tiny_recipe

from mtlab.apps.cli import main
from mtlab.core.state import load_safe

pytestmark = pytest.mark.usefixtures("one_thread")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def mtlab_cmd(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "mtlab", *args, "--threads", "1", "--no-progress"], cwd=cwd,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_after(proc: subprocess.Popen[str], line: str, signum: int, times: int) -> tuple[int, str, str]:
    """Send ``signum`` ``times`` times once ``line`` is printed; (exit status, stdout, stderr)."""
    assert proc.stdout is not None
    seen = []
    for text in proc.stdout:
        seen.append(text)
        if line in text:
            for _ in range(times):
                proc.send_signal(signum)
                time.sleep(0.01)
            break
    out, err = proc.communicate(timeout=300)
    return proc.returncode, "".join(seen) + out, err


def weights(path: Path) -> dict[str, torch.Tensor]:
    return {f"{m}.{k}": v for m, sd in load_safe(path)["models"].items() for k, v in sd.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name,times", [("SIGTERM", 1), ("SIGUSR1", 2)], ids=["sigterm", "sigusr1-twice"])
def test_a_stopped_job_resumes_to_the_uninterrupted_run(name: str, times: int, tiny_corpus: Path,
                                                         tmp_path: Path) -> None:
    signum = getattr(signal, name)
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=20, valid_frequency=4)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert main(["train", str(recipe), "--expdir", str(whole), "--no-progress", "--threads", "1"]) == 0
    code, out, err = stop_after(mtlab_cmd("train", str(recipe), "--expdir", str(stopped), cwd=tmp_path),
                                "validation at step 8", signum, times)
    assert code == 128 + signum, err
    assert f"interrupted by {name} at step" in err and "mtlab resume" in err and "Traceback" not in err, err
    state = load_safe(stopped / "final.pt")
    assert 8 <= state["step"] < 20 and all(t["phase"] in ("empty", "applied") for t in state["tasks"].values())
    rows = (stopped / "history.csv").read_text().splitlines()
    assert len(rows) - 1 >= 8  # history and journal flushed up to where it stopped
    assert (stopped / "journal.jsonl").is_file() and f"interrupted by {name}" in (stopped / "summary.txt").read_text()
    done = subprocess.run([sys.executable, "-m", "mtlab", "resume", str(stopped), "--threads", "1", "--no-progress"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (stopped / "history.csv").read_text() == (whole / "history.csv").read_text()
    assert (stopped / "validation.csv").read_text() == (whole / "validation.csv").read_text()
    ours, theirs = weights(stopped / "final.pt"), weights(whole / "final.pt")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.slow
def test_sigterm_while_the_data_loads_exits_143_with_a_message(tiny_corpus: Path, tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=20, valid_frequency=4)
    proc = mtlab_cmd("train", str(recipe), "--expdir", str(tmp_path / "exp"), cwd=tmp_path)
    code, out, err = stop_after(proc, "threads:", signal.SIGTERM, 1)
    assert code == 143 and "(SIGTERM)" in err and "Traceback" not in err, err
