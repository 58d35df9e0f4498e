"""torchrun for real: a killed worker restarts the group from the last checkpoint, and the documented two-node
command on 127.0.0.1; both against one process over the ranks' shards (gloo, CPU)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.paths import TESTS
from helpers.recipes import make_tiny_corpus, write_tiny_recipe

import mtlab
from mtlab.tasks.sampling import BatchStream, derived_seed

pytestmark = [pytest.mark.slow,  # process groups of several processes
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in this torch")]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, for this interpreter
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def workdir():
    """A folder of its own: pytest's shared temporary root can be pruned by other runs while torchrun works."""
    path = Path(tempfile.mkdtemp(prefix="mtlab-torchrun-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)  # its own process group: a timeout ends the workers too


def finish(procs: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, str, str]]:
    """Wait for every launcher; on a timeout, kill each one's process group (launcher and workers) and fail."""
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        logs = [p.communicate()[1][-3000:] for p in procs]
        pytest.fail(f"torchrun did not finish in {timeout} s:\n" + "\n---\n".join(logs))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recipe(tmp_path: Path, num_steps: int, checkpoint_frequency: int = 0) -> Path:
    path = write_tiny_recipe(tmp_path / "tiny.toml", make_tiny_corpus(tmp_path / "corpus"), num_steps=num_steps,
                             valid_frequency=0)
    text = path.read_text().replace("valid_frequency = 0", f"valid_frequency = 0\ncheckpoint_frequency = {checkpoint_frequency}")
    path.write_text(text)
    return path


def one_process(recipe_path: Path, world: int, steps: int) -> dict[str, torch.Tensor]:
    """One process over every rank's shard, each rank's minibatches drawn with that rank's RNG (input noise)."""
    exp = mtlab.from_recipe(recipe_path)
    tr = exp.trainer
    rng = [tr.rng.state_dict()["torch"]] * world  # every rank seeds the same and builds the same models
    streams = {(t, s, r): BatchStream(ls.examples, task.batch_size, task.numbuckets, seed=derived_seed(tr.seed, t, s),
                                      shard=(r, world))
               for t, task in tr.tasks.items() for s, ls in task.linkedsets.items() for r in range(world)}
    for _ in range(steps):
        tr.lr = exp.schedule.lr_at(tr.step_count)
        tr.reset()
        for t, sets in tr.active_tasks().items():
            for _ in range(tr.numbatches_to_aggregate):
                for s in sets:
                    for r in range(world):
                        tr.rng.load_state_dict({"torch": rng[r]})  # the run's own generator, as that rank's
                        tr.process_minibatch(t, s, batch=next(streams[(t, s, r)]))
                        rng[r] = tr.rng.state_dict()["torch"]
        for call in tr.chain.calls():
            getattr(tr, call)()
        tr.apply()
    return {k: p.detach().clone() for k, p in tr.params.items()}


def final_params(expdir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    state = torch.load(expdir / "final.pt", weights_only=True)
    params = {f"{m}.{k}": v for m, sd in state["models"].items() for k, v in sd.items()}
    return state["step"], params


def assert_same(got: dict, expected: dict) -> None:
    assert set(expected) <= set(got)
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, atol=2e-6, rtol=1e-5)


def test_a_killed_worker_restarts_the_group_from_the_last_checkpoint(workdir) -> None:
    tmp_path = workdir
    path, exp = recipe(tmp_path, num_steps=4, checkpoint_frequency=2), tmp_path / "exp"
    cmd = [*TORCHRUN, "--nproc_per_node", "2", "--max-restarts", "1", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", f"127.0.0.1:{free_port()}", str(TESTS / "helpers" / "dist_worker.py"), "--die-at", "3", "1",
           "train", str(path), "--expdir", str(exp), "--no-progress"]
    [(rc, stdout, stderr)] = finish([start(cmd)])
    log = stdout[-3000:] + stderr[-3000:]
    assert rc == 0, log
    assert "restart 1 of the worker group: resuming from" in stderr and "latest.pt (step 2" in stderr, log
    assert "exitcode: -9" in stderr  # the worker was killed, and the group went on
    assert "4 / 4 (2 run this time" in stdout, log  # the restarted group ran steps 3 and 4 only
    step, params = final_params(exp)
    assert step == 4
    assert_same(params, one_process(path, world=2, steps=4))  # as if never interrupted


def test_the_readme_two_node_command_on_one_machine_equals_one_process(workdir) -> None:
    tmp_path = workdir
    path, port = recipe(tmp_path, num_steps=3), free_port()
    readme = (TESTS.parent / "docs" / "guides" / "distributed.md").read_text()
    assert "--nnodes 2 --node_rank 0" in readme and "--rdzv_backend c10d" in readme  # the command tested here
    nodes = [start([*TORCHRUN, "--nnodes", "2", "--node_rank", str(n), "--nproc_per_node", "1",
                               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "mtlab-test",
                    "-m", "mtlab", "train", str(path), "--expdir", str(tmp_path / "exp"), "--no-progress"])
             for n in (0, 1)]
    for rc, out, err in finish(nodes):
        assert rc == 0, out[-2000:] + err[-2000:]
    step, params = final_params(tmp_path / "exp")
    state = torch.load(tmp_path / "exp" / "final.pt", weights_only=True)
    assert step == 3 and state["streams"]["spk/clean"]["world_size"] == 2
    assert_same(params, one_process(path, world=2, steps=3))


def test_periodic_checkpoints_and_the_resume_point(tmp_path) -> None:
    from helpers import make_examples, make_models, task_a
    from mtlab.training.checkpoint import LATEST, Periodic, resume_point

    ex = make_examples(12, 4)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, device="cpu", distributed=False)
    periodic = Periodic(tr, tmp_path, every=2).attach()
    assert resume_point(tmp_path) is None
    mtlab.run(tr, steps=3, progress=False)
    saved = torch.load(tmp_path / LATEST, weights_only=True)
    assert saved["step"] == 2 and len(saved["ranks"]) == 1 and "rng" in saved["ranks"][0]
    tr.process_minibatch("a", "clean")
    tr.save(tmp_path / "final.pt")  # mid-step (as a run that stopped on an error): its data positions are ahead
    assert resume_point(tmp_path) == tmp_path / LATEST
    tr.reset()
    tr.save(tmp_path / "final.pt")  # between steps, and later than latest.pt
    assert resume_point(tmp_path) == tmp_path / "final.pt"
    periodic.detach()
    assert periodic not in tr.callbacks
    with pytest.raises(mtlab.MtlabError, match="positive"):
        Periodic(tr, tmp_path, every=0)
