"""Data-parallel training on torch.distributed (gloo, 2 CPU processes) against one process."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist

from helpers import dist_worker as w
from helpers.distributed import assert_params_close, free_port, spawn
import mtlab
from mtlab.tasks.sampling import BatchStream
from mtlab.tasks.sampling import derived_seed

pytestmark = [pytest.mark.slow,  # process groups of several processes
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in this torch")]


def read(path):
    return json.loads(path.read_text())


def oracle_step(tr: mtlab.Trainer, shards: dict) -> None:
    """One process that sees both ranks' minibatches of the step."""
    for tname, task in tr.tasks.items():
        for _ in range(tr.numbatches_to_aggregate):
            for sname in task.linkedsets:
                for r in range(2):
                    tr.process_minibatch(tname, sname, batch=next(shards[(tname, sname, r)]))
    tr.normalize(); tr.clip(); tr.apply()


def make_shards(tr: mtlab.Trainer) -> dict:
    return {(t, s, r): BatchStream(ls.examples, task.batch_size, task.numbuckets,
                                   seed=derived_seed(tr.seed, t, s), shard=(r, 2))
            for t, task in tr.tasks.items() for s, ls in task.linkedsets.items() for r in range(2)}


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    spawn(w.train_steps, out)
    return out


def test_two_ranks_equal_one_process_given_both_ranks_minibatches(two_rank_run):
    r0, r1 = read(two_rank_run / "rank0.json"), read(two_rank_run / "rank1.json")
    assert r0["world"] == 2 and r1["rank"] == 1
    assert r0["params"] == r1["params"]  # identical on both ranks, bit for bit
    tr = w.build(distributed=False)
    shards = make_shards(tr)
    for _ in range(w.STEPS):
        oracle_step(tr, shards)
    assert_params_close(r0["params"], w.params_of(tr))
    assert r0["history"] == pytest.approx(tr.history["a/loss"].tolist(), abs=1e-9)
    assert r0["unused_grad_none"] and r1["unused_grad_none"] and r0["unused_no_state"]


def test_checkpoint_from_two_ranks_resumes_on_one_and_on_two(two_rank_run):
    out = two_rank_run
    saved = torch.load(out / "ck.pt", weights_only=True)
    assert saved["step"] == w.STEPS
    spawn(w.resume_steps, out, nprocs=2)
    a, b = read(out / "resume2_rank0.json"), read(out / "resume2_rank1.json")
    ref = read(out / "rank0.json")
    assert a["loaded"] == ref["params"] and a["after"] == b["after"]
    assert_params_close(a["after"], ref["after"], atol=1e-12)  # same data shards: same continuation
    spawn(w.resume_steps, out, nprocs=1)
    one = read(out / "resume1_rank0.json")
    assert one["loaded"] == ref["params"] and one["step"] == w.STEPS + 2


def test_a_parameter_used_on_one_rank_only_gets_the_correct_sum(tmp_path):
    spawn(w.router_run, tmp_path)
    r0, r1 = read(tmp_path / "router0.json"), read(tmp_path / "router1.json")
    assert r0["params"] == r1["params"]
    tr = w.build_router()
    before = tr.params["enc.rare.weight"].detach().clone()
    for i, (b0, b1) in enumerate(zip(w.router_batches(0), w.router_batches(1))):
        s = "clean" if i == 0 else "noisy"
        tr.process_minibatch("a", s, batch=b0)
        tr.process_minibatch("a", s, batch=b1)
    tr.normalize(); tr.clip(); tr.apply()
    assert not torch.equal(tr.params["enc.rare.weight"], before)
    assert_params_close(r0["params"], w.params_of(tr))


def test_a_dead_rank_ends_the_run_with_a_clear_error(tmp_path):
    t0 = time.time()
    ctx = spawn(w.dying_rank, tmp_path, join=False)
    deadline = time.time() + 90
    while not (tmp_path / "dying.json").exists() and time.time() < deadline:
        time.sleep(0.2)
    for p in ctx.processes:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    assert (tmp_path / "dying.json").exists(), "the surviving rank neither failed nor finished in 90 s"
    res = read(tmp_path / "dying.json")
    assert res["message"].startswith("DistributedError"), res["message"]
    assert "another rank" in res["message"] and time.time() - t0 < 90


def test_ranks_with_different_trainers_are_told_which(tmp_path):
    spawn(w.mismatched, tmp_path)
    for r in (0, 1):
        msg = read(tmp_path / f"mismatch{r}.json")["message"]
        assert msg.startswith("ConfigError") and "[[0], [1]]" in msg


def test_torchrun_trains_a_recipe_on_two_ranks_and_resumes_on_one(tmp_path):
    import os
    import subprocess
    import sys

    from helpers.recipes import make_tiny_corpus, write_tiny_recipe

    corpus = make_tiny_corpus(tmp_path / "corpus")
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", corpus, num_steps=4, valid_frequency=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # `python -m torch.distributed.run` is torchrun, for this interpreter.
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "mtlab",
                          "train", str(recipe), "--expdir", str(tmp_path / "exp"), "--steps", "2", "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    state = torch.load(tmp_path / "exp" / "final.pt", weights_only=True)
    assert state["step"] == 2 and state["streams"]["spk/clean"]["world_size"] == 2
    res = subprocess.run([sys.executable, "-m", "mtlab", "resume", str(tmp_path / "exp"), "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert torch.load(tmp_path / "exp" / "final.pt", weights_only=True)["step"] >= 3


def test_launch_from_a_notebook_spawns_cpu_workers(tmp_path):
    from helpers.recipes import make_tiny_corpus, write_tiny_recipe

    corpus = make_tiny_corpus(tmp_path / "corpus")
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", corpus, num_steps=4, valid_frequency=0)
    res = mtlab.launch.launch(str(recipe), nprocs=2, steps=2, out_dir=str(tmp_path / "out"))
    h0, h1 = res["history"][0], res["history"][1]
    assert len(h0) == 2 and h0["frames/loss"].tolist() == pytest.approx(h1["frames/loss"].tolist())
    assert torch.load(res["checkpoint"], weights_only=True)["step"] == 2
