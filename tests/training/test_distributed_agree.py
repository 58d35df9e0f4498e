"""Ranks agree before they reduce: tasks on some ranks only, mismatched calls, three uneven ranks (gloo, CPU)."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from helpers import dist_worker as w
from helpers.distributed import assert_params_close, spawn
import mtlab
from helpers import make_examples, make_models, task_a
from mtlab.core.accumulator import Accumulator, Phase
from mtlab.tasks.sampling import BatchStream, derived_seed

pytestmark = [pytest.mark.slow,  # process groups of several processes
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in this torch")]


def read(path):
    return json.loads(path.read_text())


def shard_streams(tr: mtlab.Trainer, world: int) -> dict:
    """The stream each rank draws from, per (task, linked set, rank): what the ranks read, for the oracle."""
    return {(t, s, r): BatchStream(ls.examples, task.batch_size, task.numbuckets,
                                   seed=derived_seed(tr.seed, t, s), shard=(r, world))
            for t, task in tr.tasks.items() for s, ls in task.linkedsets.items() for r in range(world)}


def test_adopt_joins_a_sum_with_zeros() -> None:
    ex = make_examples(6, 1)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], device="cpu")
    acc: Accumulator = tr.state("a")
    acc.adopt(3)
    assert acc.phase is Phase.ACCUMULATING and acc.minibatches == 3 and acc.grads
    assert all(float(b.abs().sum()) == 0 for b in acc.buffers) and acc.totals.tolist() == [0.0, 0.0]
    assert tr.params["enc.lin.weight"].grad is acc.grads["enc.lin.weight"]
    with pytest.raises(ValueError, match="empty"):
        acc.adopt(1)


def test_a_task_on_some_ranks_only_equals_one_process_over_the_union(tmp_path) -> None:
    spawn(w.union_run, tmp_path)
    r0, r1 = read(tmp_path / "union0.json"), read(tmp_path / "union1.json")
    assert r0["params"] == r1["params"] and r0["step"] == len(w.UNION_PLAN)
    tr = w.build(distributed=False)
    streams = shard_streams(tr, 2)
    for plan in w.UNION_PLAN:
        for r in (0, 1):
            for t, s in plan[r]:
                tr.process_minibatch(t, s, batch=next(streams[(t, s, r)]))
        tr.normalize(); tr.clip(); tr.apply()
    assert_params_close(r0["params"], w.params_of(tr))
    h = tr.history
    for rank in (r0, r1):  # every rank logs the step of the union: loss, per-set loss, minibatches
        for t in ("a", "b"):
            assert rank["loss"][t] == pytest.approx(h[f"{t}/loss"].tolist(), abs=1e-9, nan_ok=True)
            assert rank["minibatches"][t] == pytest.approx(h[f"{t}/minibatches"].tolist(), nan_ok=True)
        assert rank["set_loss"] == pytest.approx(h["a/noisy/loss"].tolist(), abs=1e-9, nan_ok=True)


def test_different_calls_fail_fast_on_every_rank_naming_each_ranks_call(tmp_path) -> None:
    spawn(w.mismatched_calls, tmp_path)
    res = [read(tmp_path / f"calls{r}.json") for r in (0, 1)]
    for r in res:
        tasks, calls, late = r["tasks"], r["calls"], r["late"]
        assert tasks["message"].startswith("DistributedError") and calls["message"].startswith("DistributedError")
        assert "rank 0: normalize('a')" in tasks["message"] and "rank 1: normalize('b')" in tasks["message"]
        assert "rank 0: normalize()" in calls["message"] and "rank 1: clip()" in calls["message"]
        assert "b (1 minibatches, next normalize)" in calls["message"]
        assert "rank 0: apply()" in late["message"] and "rank 1: clip()" in late["message"]
        assert max(tasks["seconds"], calls["seconds"], late["seconds"]) < 10  # the group timeout is 60 s
        assert r["phases_after_errors"]["a"] == "accumulating"  # a refused call changes nothing
    assert res[0]["params"] == res[1]["params"]
    tr = w.build(distributed=False)
    streams = shard_streams(tr, 2)
    for r, t, s in [(0, "a", "clean"), (1, "a", "clean"), (1, "b", "clean")]:
        tr.process_minibatch(t, s, batch=next(streams[(t, s, r)]))
    tr.normalize(); tr.clip(); tr.apply()
    assert_params_close(res[0]["params"], w.params_of(tr))


def test_three_ranks_over_uneven_linked_sets_equal_one_process(tmp_path) -> None:
    spawn(w.uneven_run, tmp_path, nprocs=3)
    ranks = [read(tmp_path / f"uneven{r}.json") for r in range(3)]
    assert ranks[0]["world"] == 3 and ranks[0]["params"] == ranks[1]["params"] == ranks[2]["params"]
    tr = w.build_sized(w.UNEVEN_SIZES)
    streams = shard_streams(tr, 3)
    for _ in range(w.UNEVEN_STEPS):
        for t, task in tr.tasks.items():
            for _ in range(tr.numbatches_to_aggregate):
                for s in task.linkedsets:
                    for r in range(3):
                        tr.process_minibatch(t, s, batch=next(streams[(t, s, r)]))
        tr.normalize(); tr.clip(); tr.apply()
    assert_params_close(ranks[0]["params"], w.params_of(tr))
    assert ranks[0]["loss"] == pytest.approx(tr.history["a/loss"].tolist(), abs=1e-9)
    sizes = [len(ls.examples) for t in tr.tasks.values() for ls in t.linkedsets.values()]
    assert all(-(-n // b) % 3 for n, b in zip(sizes, (3, 3, 4)))  # no linked set's batches divide by 3


def test_ranks_sum_their_gradients_without_normalize_and_step_agrees_once(tmp_path) -> None:
    # normalize_gradients = False: the reduction comes at the first call after the minibatches (clip, or apply)
    spawn(w.unnormalized_steps, tmp_path)
    r0, r1 = read(tmp_path / "unnormalized0.json"), read(tmp_path / "unnormalized1.json")
    for r in (r0, r1):
        assert r["gathers_step"] == 1 and r["gathers_by_hand"] == 3
        message = r["step_vs_normalize"]["message"]
        assert message.startswith("DistributedError") and "rank 0: step()" in message and "rank 1: normalize()" in message
    for name, settings in w.UNNORMALIZED.items():
        assert r0[name] == r1[name]
        tr = w.build(distributed=False, **settings)
        streams = shard_streams(tr, 2)
        for _ in range(2):
            for t, task in tr.tasks.items():
                for _ in range(tr.numbatches_to_aggregate):
                    for s in task.linkedsets:
                        for r in range(2):
                            tr.process_minibatch(t, s, batch=next(streams[(t, s, r)]))
            for call in tr.chain.calls():
                getattr(tr, call)()
            tr.apply()
        assert_params_close(r0[name], w.params_of(tr))
