"""mtlab.attach against real jobs: `python -m mtlab train` in a second process, and a 2-rank torchrun job on the CPU
(gloo), steered from here, then replayed bit for bit; a killed job is reported dead."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers.paths import TESTS
from helpers.recipes import make_tiny_corpus, write_tiny_recipe

import mtlab
from mtlab.remote import CONNECTION_FILE, AttachError, JobEnded

pytestmark = pytest.mark.slow  # training processes
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def workdir():
    """A folder of its own (torchrun and the job outlive pytest's pruning of its shared temporary root)."""
    path = Path(tempfile.mkdtemp(prefix="mtlab-attach-"))
    write_tiny_recipe(path / "tiny.toml", make_tiny_corpus(path / "corpus"), num_steps=60, valid_frequency=5)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the job did not end in {timeout} s:\n{proc.communicate()[0][-3000:]}")
    return proc.returncode, out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TRAIN = [sys.executable, "-m", "mtlab", "train", "tiny.toml", "--expdir", "exp", "--no-progress", "--threads", "1"]


def test_a_job_is_steered_from_another_process_and_replays_with_its_attached_changes(workdir) -> None:
    job_proc = start(TRAIN, workdir)
    job = mtlab.attach(workdir / "exp", timeout=120)
    try:
        assert stat.S_IMODE((workdir / "exp" / CONNECTION_FILE).stat().st_mode) == 0o600
        assert job.info["tasks"] == {"spk": ["clean"], "frames": ["clean", "noisy"]}
        weight = job.set("weight", 0.8, task="frames", linkedset="noisy")
        assert weight.in_force and weight.entry["source"] == "attached"
        with pytest.raises(mtlab.ConfigError, match="refused, the job goes on unchanged"):
            job.set("lr", -1.0)
        lr = job.set("lr", 0.004)
        assert lr.in_force
        while len(job.history) < lr.step + 2:  # the job goes on
            time.sleep(0.2)
        seen = len(job.rows())
        job.detach()
        again = mtlab.attach(workdir / "exp", timeout=30)  # re-attaching shows the history so far
        assert len(again.rows()) >= seen
        assert again.stop() == "ended" and again.ended.reason == "stopped"
    finally:
        rc, out = finish(job_proc)
    assert rc == 0, out[-3000:]
    assert "attach from a notebook: job = mtlab.attach('exp')" in out and "stopped by the attached client" in out
    rc, out = finish(start([sys.executable, "-m", "mtlab", "replay", "exp", "--no-progress", "--threads", "1"], workdir))
    assert rc == 0 and "replay identical" in out, out[-3000:]


def test_a_killed_job_is_reported_dead_and_a_no_attach_job_publishes_nothing(workdir) -> None:
    job_proc = start(TRAIN, workdir)
    job = mtlab.attach(workdir / "exp", timeout=120)
    os.killpg(job_proc.pid, signal.SIGKILL)
    job_proc.wait(30)
    job.request_timeout = 2.0
    with pytest.raises(JobEnded, match="the job died: its process .* no longer runs"):
        job.set("lr", 0.001)
    assert job.state == "died"
    with pytest.raises(JobEnded, match="died"):
        mtlab.attach(workdir / "exp", timeout=2)
    rc, out = finish(start([*TRAIN[:6], "other", *TRAIN[7:], "--no-attach", "--steps", "1"], workdir))
    assert rc == 0, out[-3000:]
    assert not (workdir / "other" / CONNECTION_FILE).exists() and "attach from a notebook" not in out
    with pytest.raises(AttachError, match="no job to attach to in 1 s"):
        mtlab.attach(workdir / "other", timeout=1)


def test_a_two_rank_torchrun_job_applies_a_change_at_one_minibatch_on_both_ranks_and_replays_only_so(workdir) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{free_port()}"]
    job_proc = start([*torchrun, "-m", "mtlab", *TRAIN[3:]], workdir)
    job = mtlab.attach(workdir / "exp", timeout=180)
    try:
        assert job.info["world_size"] == 2
        lr = job.set("lr", 0.004)
        weight = job.set("weight", 0.3, task="frames", linkedset="noisy")
        assert lr.in_force and weight.in_force and weight.entry["source"] == "attached"
        assert job.stop() == "ended"
    finally:
        rc, out = finish(job_proc)
    assert rc == 0, out[-3000:]
    assert out.count("attach from a notebook") == 1  # rank 0 listens, rank 1 takes the commands from it
    rc, out = finish(start([sys.executable, "-m", "mtlab", "replay", "exp", "--no-progress"], workdir))
    assert rc == 2 and "`torchrun --nproc-per-node 2 -m mtlab replay exp`" in out, out[-3000:]
    rc, out = finish(start([*torchrun[:-1], f"127.0.0.1:{free_port()}", "-m", "mtlab", "replay", "exp",
                            "--no-progress", "--threads", "1"], workdir))
    assert rc == 0 and out.count("replay identical") == 2, out[-3000:]  # each rank: the same parameters, bit for bit
